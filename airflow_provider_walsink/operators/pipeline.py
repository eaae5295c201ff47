"""One call that wires a pipeline's write → durable → [audit →] commit tasks into a TaskGroup.

::

    with DAG("daily_events", schedule="@daily", ...):
        walsink_pipeline(
            "events",
            pipeline="daily_events",
            application="/opt/jobs/daily_events.py",
            target="/data/tables/daily_events",
            mode="overwrite",
            partition_by=["dt"],
        )

The tasks share the pipeline id, the checkpoint key (default: the run's
data interval start), the committer connection and the staging root. With
``audit=[...]`` an audit task checks the staged data between durable and
commit, and the commit publishes only what passed it (docs/audit.md).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import timedelta
from typing import Any

from airflow_provider_walsink.hooks.walsink import WalsinkHook
from airflow_provider_walsink.operators.audit import WalAuditOperator
from airflow_provider_walsink.operators.commit import WalCommitOperator
from airflow_provider_walsink.operators.write import WalWriteOperator
from airflow_provider_walsink.sensors.durable import CheckpointDurableSensor

try:
    from airflow.sdk import TaskGroup
except ImportError:  # pragma: no cover
    from airflow.utils.task_group import TaskGroup  # type: ignore[no-redef]


def walsink_pipeline(
    group_id: str,
    *,
    pipeline: str,
    application: str,
    target: str,
    mode: str = "overwrite",
    partition_by: Sequence[str] = (),
    file_format: str = "parquet",
    application_args: Sequence[str] | None = None,
    checkpoint_key: str | None = None,
    spark_conn_id: str | None = None,
    conf: Mapping[str, Any] | None = None,
    walsink_conn_id: str = WalsinkHook.default_conn_name,
    staging_root: str | None = None,
    deferrable: bool = True,
    poke_interval: float = 5,
    durable_timeout: timedelta = timedelta(hours=1),
    verify_checksums: bool = False,
    checksum: str | None = "crc32",
    initial_offsets: Mapping[str, Any] | None = None,
    reprocess: str = "skip",
    lineage_inputs: Sequence[str] = (),
    audit: Sequence[Any] | None = None,
    fencing: str = "lease",
    target_options: Mapping[str, Any] | None = None,
    write_kwargs: Mapping[str, Any] | None = None,
    durable_kwargs: Mapping[str, Any] | None = None,
    audit_kwargs: Mapping[str, Any] | None = None,
    commit_kwargs: Mapping[str, Any] | None = None,
    kafka_source: Any = None,
    kafka_conn_id: str = "kafka_default",
    **group_kwargs: Any,
) -> TaskGroup:
    """Create (inside the current DAG) a TaskGroup ``write >> durable >> [audit >>] commit``.

    :param group_id: the TaskGroup's id (task ids become ``<group_id>.write`` etc.).
    :param pipeline: pipeline id in the committer table.
    :param application: the PySpark job (uses ``CheckpointJob``).
    :param target: where to publish: a directory, or an ``iceberg://``, ``delta://`` or
        ``sql://`` URI (docs/targets.md).
    :param mode: ``overwrite`` (each interval replaces its partitions; runs commit
        independently) or ``append`` (offsets advance on commit, in checkpoint order).
    :param partition_by: the pipeline's partition columns: the default of the job's
        stage calls, and the exact layout the commit accepts.
    :param reprocess: what a backfill re-run of a COMMITTED interval does: ``skip``
        (default: the tasks end skipped, nothing rewritten) or ``replace`` (a new
        version supersedes the committed one); a run's conf
        ``{"walsink_reprocess": ...}`` overrides it for that run (docs/backfill.md).
    :param lineage_inputs: what the job reads (URIs or paths), for OpenLineage.
    :param deferrable: wait for durability in the triggerer (default) instead of a worker.
    :param audit: checks on the staged data before it is published
        (``RowCountCheck``, ``NotNullCheck``, ``SqlPredicateCheck``,
        ``CallableCheck`` or plain callables; docs/audit.md): adds the task
        ``audit`` and makes the commit publish only AUDITED checkpoints.
    :param fencing: how the commit is fenced: ``"lease"`` (default) or ``"table"``
        (Iceberg and Delta targets: the table's atomic commit is the only fence,
        one committer-table transaction per commit; docs/protocol.md).
    :param target_options: the target's kind-specific settings (an Iceberg
        ``catalog``, a Delta ``conn_id`` or ``storage_options``, a SQL ``url``...;
        docs/targets.md), given to the write task (which resolves the target before
        the job runs and refuses one that names something not configured) and to
        the commit task.
    :param kafka_source: an ``append`` pipeline reading Kafka
        (:class:`~airflow_provider_walsink.core.sources.kafka.KafkaSourceSpec` or its dict), given
        to the write task (plans and fixes each checkpoint's ranges) and the commit task
        (commits the group's offsets after the target commit); docs/kafka.md.
    :param kafka_conn_id: its ``kafka`` connection (client configuration in the extra).
    :param write_kwargs / durable_kwargs / audit_kwargs / commit_kwargs: further
        arguments of each task (``retries``, ``pool``, ``spark_submit_kwargs``...).
    Other parameters are those of :class:`WalWriteOperator`,
    :class:`CheckpointDurableSensor` and :class:`WalCommitOperator`.
    """
    write_kwargs, commit_kwargs = dict(write_kwargs or {}), dict(commit_kwargs or {})
    # One target, one configuration: the write task resolves the target the commit publishes to
    # (its staging location, and a refusal of what is not configured, before the job runs).
    given = [
        o
        for o in (
            target_options,
            write_kwargs.pop("target_options", None),
            commit_kwargs.pop("target_options", None),
        )
        if o is not None
    ]
    if any(dict(o) != dict(given[0]) for o in given[1:]):
        raise ValueError("walsink_pipeline: give the target's options once, as target_options=...")
    target_options = given[0] if given else None
    shared: dict[str, Any] = dict(
        pipeline=pipeline,
        checkpoint_key=checkpoint_key,
        walsink_conn_id=walsink_conn_id,
    )
    if kafka_source is not None:
        write_kwargs.update(kafka_source=kafka_source, kafka_conn_id=kafka_conn_id)
        commit_kwargs.update(kafka_source=kafka_source, kafka_conn_id=kafka_conn_id)
    with TaskGroup(group_id, **group_kwargs) as group:
        # Where the write task staged (its own root, the target's, or the connection's),
        # so the durability and commit tasks look in the same place. map_indexes=-1: one XCom
        # read, which the triggerer can answer when it renders the sensor started there
        # (without it Airflow 3.3 asks for a sequence slice, which the triggerer cannot).
        staged_at = staging_root or (
            "{{ ti.xcom_pull(task_ids='"
            + group.child_id("write")
            + "', key='staging_root', map_indexes=-1) or '' }}"
        )
        write = WalWriteOperator(
            task_id="write",
            staging_root=staging_root,
            application=application,
            mode=mode,
            application_args=application_args,
            spark_conn_id=spark_conn_id,
            conf=conf,
            file_format=file_format,
            partition_by=partition_by,
            checksum=checksum,
            initial_offsets=initial_offsets,
            target=target,
            reprocess=reprocess,
            lineage_inputs=lineage_inputs,
            target_options=target_options,
            **shared,
            **write_kwargs,
        )
        durable = CheckpointDurableSensor(
            task_id="durable",
            staging_root=staged_at,
            deferrable=deferrable,
            poke_interval=poke_interval,
            timeout=durable_timeout,
            verify_checksums=verify_checksums,
            **shared,
            **dict(durable_kwargs or {}),
        )
        commit = WalCommitOperator(
            task_id="commit",
            staging_root=staged_at,
            target=target,
            mode=mode,
            partition_by=partition_by,
            verify_checksums=verify_checksums,
            require_audit=audit is not None,
            fencing=fencing,
            target_options=target_options,
            **shared,
            **commit_kwargs,
        )
        if audit is None:
            write >> durable >> commit
        else:
            checks = WalAuditOperator(
                task_id="audit",
                staging_root=staged_at,
                checks=audit,
                **shared,
                **dict(audit_kwargs or {}),
            )
            write >> durable >> checks >> commit
    return group
