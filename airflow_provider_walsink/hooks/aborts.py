"""Aborting a checkpoint from the Airflow faces: ``walsink abort`` and the UI's Abort button.

Both build the same :class:`~airflow_provider_walsink.core.commit.abort.CheckpointAborter`:
the pipeline's publisher comes from the target the write task registered it
with (``walsink_pipeline.target``), opened with the connections its
``target_options`` named (``walsink_pipeline.target_connections``: a Delta
table's ``conn_id``, so an S3 table is read with that ``aws`` connection, not
this process's environment), and its checkpoints' staging from the
target itself (table targets stage inside the table location) or else the
walsink connection's staging root, unless the checkpoint's row records where
it was staged (then that, always). Both then record the action in Airflow's
audit log: a row of the ``log`` table (``airflow.models.log.Log``), event
``walsink.abort``, with the DAG and run that wrote the checkpoint, the user as
owner and the outcome as ``extra``. The UI writes it in its request's session;
the CLI writes it when it can reach Airflow's metadata database, and otherwise
says so on stderr (the abort itself is recorded in the checkpoint's history
either way).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from typing import Any

from airflow_provider_walsink.core.commit.abort import CheckpointAborter
from airflow_provider_walsink.core.staging.cleanup import StoreOpener, open_object_store
from airflow_provider_walsink.core.staging.object_store import StagingStore
from airflow_provider_walsink.core.staging.resolve import as_store, open_staging, staging_for
from airflow_provider_walsink.core.store.store import CommitterStore
from airflow_provider_walsink.core.targets.registry import TargetOptions, resolve_target

log = logging.getLogger(__name__)

AUDIT_EVENT = "walsink.abort"


def aborter_for(
    store: CommitterStore,
    pipeline: str,
    *,
    staging_root: str,
    target: str | None = None,
    connections: Any = None,
    checkpoint_key: str | None = None,
    stores: StoreOpener | None = None,
) -> CheckpointAborter:
    """An aborter for ``pipeline``: its registered target (or ``target``), and where it stages.

    Where it stages: with ``checkpoint_key``, the staging root recorded on that
    checkpoint's row (where its write phase staged), whatever the connection or
    the target say now; for a row that records none (written before walsink
    recorded roots) or without ``checkpoint_key``, the target's own staging
    root (table targets) or else ``staging_root``. Abort one checkpoint with
    the aborter built for its key.

    An object-store root (``s3://``...; recorded, the target's own or
    ``staging_root``) is opened by ``stores(root)`` (the caller's storage
    options, e.g. :meth:`WalsinkHook.get_staging_store` with the walsink
    connection's staging credentials; default: none, the store's default
    credential chain) and the abort reads, tombstones and removes its staging
    through it (:class:`CheckpointAborter`); such a root that is not a bucket
    and a plain prefix raises :class:`~..protocol.errors.PathEscapeError`.

    Raises ``CheckpointNotFoundError``-like ``StoreError`` for an unknown
    pipeline, and the registry's ``TargetError`` when the target cannot be
    loaded here (a missing extra: the message names it).
    """
    from airflow_provider_walsink.core.store.errors import StoreError

    row = store.get_pipeline(pipeline)
    if row is None:
        raise StoreError(f"pipeline {pipeline} is not registered")
    registered = row.get("target")
    if target and registered and target != registered:
        # The registered target is where the attempt may have published: checking (and rolling
        # back) another place would report it unpublished.
        raise StoreError(
            f"pipeline {pipeline} is registered with target {registered!r}; --target {target!r} is only "
            "for a pipeline registered without one"
        )
    uri = target or registered
    record = store.get(pipeline, checkpoint_key) if checkpoint_key is not None else None

    def open_store(root: str) -> StagingStore:
        # A plain bucket prefix only: the abort deletes under it.
        return open_object_store(root, stores)

    if not uri:
        return CheckpointAborter(store, staging_for(record, staging_root, open_store), None)
    if connections is None:
        from airflow_provider_walsink.hooks.connections import airflow_connection_fields as connections

    def publisher_for(staging: StagingStore) -> Any:
        # Table targets read no layout; file and SQL targets stage on a local root only.
        # The connection references the write task registered (a Delta table's conn_id; names
        # only): the target is opened with the connections its DAG names.
        options = TargetOptions(
            mode=row["mode"],
            layout=staging.layout,
            connections=connections,
            extra=dict(row.get("target_connections") or {}),
            property_archive=store,
        )
        return resolve_target(uri, options)  # type: ignore[arg-type]

    def default_root() -> str:
        # A row that records no root: the target's own (table targets stage inside their
        # location), else the caller's.
        publisher = publisher_for(as_store(open_staging(staging_root, open_store)))
        own = publisher.staging_root() if publisher.staging_root is not None else None
        return own or staging_root

    staging = as_store(staging_for(record, default_root, open_store))
    return CheckpointAborter(store, staging, publisher_for(staging))


def audit_extra(
    *,
    pipeline: str,
    checkpoint_key: str,
    reason: str,
    source: str,
    outcome: Mapping[str, Any] | None = None,
    refused: str | None = None,
) -> str:
    """The ``extra`` of an audit-log row: what was asked, by which face, and what happened."""
    extra: dict[str, Any] = {
        "pipeline": pipeline,
        "checkpoint_key": checkpoint_key,
        "reason": reason,
        "source": source,
    }
    if outcome is not None:
        keep = (
            "state",
            "previous_state",
            "attempt",
            "attempt_id",
            "fenced_holder",
            "files_rolled_back",
            "staging_removed",
            "already_aborted",
            "warnings",
        )
        extra.update({k: outcome.get(k) for k in keep})
    if refused is not None:
        extra.update(state="refused", refused=refused)
    return json.dumps(extra, sort_keys=True, default=str)


def record_audit_log(
    *,
    dag_id: str | None,
    run_id: str | None,
    owner: str,
    extra: str,
    session: Any = None,
) -> None:
    """Add a ``walsink.abort`` row to Airflow's audit log (in ``session``, or a new one)."""
    from airflow.models.log import Log

    row = Log(
        event=AUDIT_EVENT, owner=owner, owner_display_name=owner, extra=extra, dag_id=dag_id, run_id=run_id
    )
    if session is not None:
        session.add(row)
        return
    from airflow.utils.session import create_session

    with create_session() as own:
        own.add(row)
