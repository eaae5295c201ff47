"""What the write task checks before the write phase records anything or starts the job.

A configuration that cannot work is refused up front, not found after the whole Spark job
(and its retry) ran, and each refusal names the connection to fix
(:class:`~airflow_provider_walsink.core.protocol.errors.PreflightError`; the write task fails
without a retry, since a retry meets the same configuration). In order:

1. **The target** (``operators/commit.py: target_staging_root``): resolved from its
   configuration (``TargetNotConfiguredError``), then its declared ``check_writable()``
   capability (``Publisher.check_writable``): a directory of files can be created in; a
   Delta table's connection holds credentials and its bucket exists; an Iceberg catalog
   answers, within a timeout; a SQL target's database accepts a connection
   (``TargetUnreachableError``, ``TargetNotWritableError``).
2. **The staging root** (:meth:`~..write_phase.WritePhase.run`, on the root the attempt will
   really use, after the placement check): :func:`check_staging`, the staging store's
   ``check_writable()`` (a local root can be created and written; an object store's bucket
   exists and a probe object can be put and deleted under the prefix with the staging
   connection's credentials), re-raised naming that connection.
3. **Where the job runs** (:meth:`~..write_phase.WritePhase.run`, after the staging root): the
   job runner's ``check_reachable()`` (``JobRunner.check_reachable``): a Spark Connect server
   accepts a connection at its host and port within seconds, else the refusal names the
   ``spark_conn_id`` connection.

Before all of these, the write task looks up the connections it names (``walsink_conn_id``,
``spark_conn_id``): one that does not exist, or is of a type that cannot serve, is refused
naming it and the argument (``hooks/connections.py: ConnectionNotFoundError``), not left to
Airflow's bare ``AirflowNotFoundException`` and a retry.

Each check changes nothing that stays (a probe object is deleted at once).
"""

from __future__ import annotations

from airflow_provider_walsink.core.protocol.errors import NOTHING_DONE
from airflow_provider_walsink.core.staging.base import StagingBackend
from airflow_provider_walsink.core.staging.probe import StagingNotWritableError


def check_staging(store: StagingBackend, *, connection: str) -> None:
    """Step 2: ``store.check_writable()``; a refusal is re-raised naming ``connection`` (whose
    credentials were used, and so what to fix: a phrase such as ``"connection 'aws_staging'
    (staging_conn_id of walsink connection 'walsink_default')"``).

    Raises:
        StagingNotWritableError: the root cannot be staged into; the message names the root,
            what the store answered and the connection.
    """
    try:
        store.check_writable()
    except StagingNotWritableError as exc:
        raise StagingNotWritableError(
            f"{exc}; checked with {connection}: fix it there; {NOTHING_DONE}"
        ) from None
