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
            write={"conf": {"spark.sql.shuffle.partitions": "4"}, "retries": 2},
            durable={"poke_interval": 10},
        )

The tasks share the pipeline id, the checkpoint key (default: the run's
data interval start), the committer connection and the staging root. With
``audit=[...]`` an audit task checks the staged data between durable and
commit, and the commit publishes only what passed it (docs/audit.md); with
``audit_approval=True`` a person decides about a REJECTED checkpoint in Airflow
(publish anyway, or abort) before the commit (docs/audit.md#approving-a-rejected-checkpoint-in-airflow).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import timedelta
from typing import Any

from airflow.sdk import TaskGroup

from airflow_provider_walsink.hooks import versions
from airflow_provider_walsink.hooks.walsink import WalsinkHook
from airflow_provider_walsink.operators.audit import WalAuditOperator
from airflow_provider_walsink.operators.commit import WalCommitOperator
from airflow_provider_walsink.operators.commit_deadline import (
    add_commit_deadline,
    check_commit_deadline,
    commit_deadline_alert,
)
from airflow_provider_walsink.operators.deprecations import source_argument, warn_deprecated
from airflow_provider_walsink.operators.partitioned import partition_arguments
from airflow_provider_walsink.operators.write import WalWriteOperator
from airflow_provider_walsink.sensors.durable import CheckpointDurableSensor

#: Spellings of earlier releases -> (the task's settings they belong to, the argument's name there).
#: Accepted for one release, each with a DeprecationWarning naming the new spelling (the source's:
#: :data:`~airflow_provider_walsink.operators.deprecations.DEPRECATED_SOURCE_ARGUMENTS`).
DEPRECATED_ARGUMENTS: dict[str, tuple[str, str | None]] = {
    "application_args": ("write", "application_args"),
    "spark_conn_id": ("write", "spark_conn_id"),
    "conf": ("write", "conf"),
    "file_format": ("write", "file_format"),
    "checksum": ("write", "checksum"),
    "initial_offsets": ("write", "initial_offsets"),
    "lineage_inputs": ("write", "lineage_inputs"),
    "write_kwargs": ("write", None),
    "deferrable": ("durable", "deferrable"),
    "poke_interval": ("durable", "poke_interval"),
    "durable_timeout": ("durable", "timeout"),
    "durable_kwargs": ("durable", None),
    "audit_kwargs": ("audit", None),
    "commit_kwargs": ("commit", None),
}

#: The durability sensor's defaults in a pipeline (wait in the triggerer, holding no worker slot).
DURABLE_DEFAULTS: dict[str, Any] = {"deferrable": True, "poke_interval": 5, "timeout": 3600}


def _approval_operator() -> type:
    """The approval step's operator, imported only when asked for (and checked first:
    ``versions.require("audit_approval")``): it needs the standard provider's human-in-the-loop
    operators, which a pipeline without it does not."""
    from airflow_provider_walsink.operators.approval import WalAuditApprovalOperator

    return WalAuditApprovalOperator


def walsink_pipeline(
    group_id: str,
    *,
    pipeline: str,
    application: str,
    target: str,
    mode: str = "overwrite",
    partition_by: Sequence[str] = (),
    reprocess: str = "skip",
    fencing: str = "lease",
    checkpoint_key: str | None = None,
    partition_column: str | None = None,
    partition_key_format: str | None = None,
    walsink_conn_id: str = WalsinkHook.default_conn_name,
    staging_root: str | None = None,
    target_options: Mapping[str, Any] | None = None,
    verify_checksums: bool = False,
    source: Any = None,
    write: Mapping[str, Any] | None = None,
    durable: Mapping[str, Any] | None = None,
    audit: Sequence[Any] | Mapping[str, Any] | None = None,
    commit: Mapping[str, Any] | None = None,
    commit_deadline: timedelta | None = None,
    commit_deadline_callback: Any = None,
    audit_approval: bool | Mapping[str, Any] = False,
    **group_kwargs: Any,
) -> TaskGroup:
    """Create (inside the current DAG) a TaskGroup ``write >> durable >> [audit >>] commit``.

    What the whole pipeline shares comes first; what one task alone needs goes in that task's
    settings (``write=``, ``durable=``, ``audit=``, ``commit=``), any argument of its operator.

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
    :param fencing: how the commit is fenced: ``"lease"`` (default) or ``"table"``
        (Iceberg and Delta targets: the table's atomic commit is the only fence,
        one committer-table transaction per commit; docs/protocol.md).
    :param checkpoint_key: the checkpoint key (templated; default: for a run with a partition key,
        ``pk=<key>``; else the run's data interval start, ``20260101T000000Z``;
        docs/backfill.md, "Partitioned runs").
    :param partition_column: for partitioned runs (a ``CronPartitionTimetable``, a run triggered
        with a ``partition_key``; Airflow 3.2+): the ``partition_by`` column a key names. The
        checkpoint of key ``K`` replaces target partition ``<partition_column>=K`` and stages
        nothing outside it.
    :param partition_key_format: a ``strftime`` format (``%Y-%m-%d``) every partition key must be
        exactly a rendering of; a run with another key is refused before anything is written.
    :param walsink_conn_id: the ``walsink`` connection of the committer table and staging root.
    :param staging_root: where the write phase stages (default: a table target's own staging
        location, else the connection's ``staging_root``); the other tasks read the root the
        write task recorded.
    :param target_options: the target's kind-specific settings (an Iceberg
        ``catalog``, a Delta ``conn_id`` or ``storage_options``, a SQL ``url``...;
        docs/targets.md), given to the write task (which resolves the target before
        the job runs and refuses one that names something not configured) and to
        the commit task.
    :param verify_checksums: the durability check and the commit re-read every committable's
        checksum (not only its size) before it is published.
    :param source: what the job reads (default: it finds its own input):
        ``{"kind": <a name in core/sources SOURCES>, "conn_id": <its connection>, **its
        settings}`` or a :class:`~airflow_provider_walsink.core.sources.base.Source`, given to
        the write task (plans and fixes each checkpoint's input; a source planning offsets
        needs ``append``) and the commit task (the source's after-commit step).
    :param write: arguments of the write task (:class:`WalWriteOperator`): ``application_args``,
        ``spark_conn_id``, ``conf``, ``file_format``, ``checksum``, ``initial_offsets``,
        ``lineage_inputs`` (what the job reads, for OpenLineage), ``spark_submit_kwargs``,
        ``retries``, ``pool``...
    :param durable: arguments of the durability sensor (:class:`CheckpointDurableSensor`):
        ``deferrable`` (default ``True``: it waits in the triggerer), ``poke_interval``
        (default 5 s), ``timeout`` (default one hour)...
    :param audit: checks on the staged data before it is published
        (``RowCountCheck``, ``NotNullCheck``, ``SqlPredicateCheck``, ``CallableCheck`` or plain
        callables; docs/audit.md), or a mapping of the audit task's arguments
        (:class:`WalAuditOperator`) with the checks under ``"checks"``: adds the task ``audit``
        and makes the commit publish only AUDITED checkpoints.
    :param audit_approval: ``True``, or a mapping of the approval task's arguments
        (:class:`~airflow_provider_walsink.operators.approval.WalAuditApprovalOperator`: ``assigned_users``, ``notifiers``,
        ``response_timeout``...): when the audit rejects a checkpoint, the task ``approval``
        (Airflow's human-in-the-loop operator; it waits holding no worker slot) asks a person to
        publish it anyway or abort it, records who and why in the checkpoint's history, and the
        commit publishes it or is skipped. Skipped when the audit passes. Needs ``audit``.
    :param commit: arguments of the commit task (:class:`WalCommitOperator`): ``group_commit``,
        ``lease_ttl``, ``allow_older_overwrite``, ``retries``...
    :param commit_deadline: a positive ``timedelta``: a checkpoint not COMMITTED that long after
        its run was queued calls ``commit_deadline_callback`` once, through a deadline alert this
        adds to the DAG (Airflow's scheduler and triggerer run it), and the UI marks it overdue
        (docs/deadlines.md). Anything else is refused here, at parse time.
    :param commit_deadline_callback: Airflow's ``AsyncCallback`` or ``SyncCallback`` around a
        notifier or a function (``AsyncCallback(SlackWebhookNotifier, kwargs={"text": "{{
        walsink.pipeline }} {{ walsink.checkpoint_key }} {{ walsink.state }}: {{ walsink.reason
        }}"})``); its context has ``walsink``: pipeline, checkpoint_key, state, reason,
        deadline, dag_id, run_id, link.
    :param group_kwargs: arguments of the :class:`TaskGroup` (``tooltip``, ``default_args``...).
        The spellings of earlier releases listed in :data:`DEPRECATED_ARGUMENTS`
        (``conf=``, ``poke_interval=``, ``write_kwargs=``...) and the source's old spelling are
        still accepted, with a DeprecationWarning naming the new one.
    """
    # Refused before any task exists: a deadline that is not a positive duration, no callback.
    check_commit_deadline(pipeline, commit_deadline, commit_deadline_callback)
    settings: dict[str, dict[str, Any]] = {
        "write": dict(write or {}),
        "durable": {**DURABLE_DEFAULTS, **dict(durable or {})},
        "audit": {},
        "commit": dict(commit or {}),
    }
    if isinstance(audit, Mapping):
        settings["audit"] = dict(audit)
        checks = settings["audit"].pop("checks", None)
        if checks is None:
            raise ValueError("walsink_pipeline: audit={...} needs its checks under 'checks'")
    else:
        checks = audit
    if audit_approval and checks is None:
        # Refused at parse time: without an audit nothing is REJECTED, so nothing could be approved.
        raise ValueError(
            f"walsink_pipeline {pipeline!r}: audit_approval needs an audit (audit=[...]): the approval "
            "step decides about checkpoints the audit REJECTED, and this pipeline has no audit"
        )
    if audit_approval:  # refused before any task exists on an Airflow without HITL operators
        versions.require("audit_approval", f"walsink_pipeline({pipeline!r})")
    approval_args = dict(audit_approval) if isinstance(audit_approval, Mapping) else {}
    for old in [name for name in group_kwargs if name in DEPRECATED_ARGUMENTS]:
        task, name = DEPRECATED_ARGUMENTS[old]
        value = group_kwargs.pop(old)
        warn_deprecated(
            "walsink_pipeline", old, f"{task}={{...}}" if name is None else f"{task}={{{name!r}: ...}}"
        )
        if value is None:
            continue
        if name is None:
            settings[task].update(value)
        elif name == "timeout" and hasattr(value, "total_seconds"):
            settings[task][name] = value.total_seconds()
        else:
            settings[task][name] = value
    write_args, commit_args = settings["write"], settings["commit"]
    # One target, one configuration: the write task resolves the target the commit publishes to
    # (its staging location, and a refusal of what is not configured, before the job runs).
    given = [
        o
        for o in (
            target_options,
            write_args.pop("target_options", None),
            commit_args.pop("target_options", None),
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
    source = source_argument("walsink_pipeline", source, group_kwargs)
    if source is not None:
        write_args.update(source=source)
        commit_args.update(source=source)
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
        write_task = WalWriteOperator(
            task_id="write",
            staging_root=staging_root,
            application=application,
            mode=mode,
            partition_by=partition_by,
            target=target,
            reprocess=reprocess,
            target_options=target_options,
            **partition_arguments(partition_column, partition_key_format),
            **shared,
            **write_args,
        )
        durable_task = CheckpointDurableSensor(
            task_id="durable",
            staging_root=staged_at,
            verify_checksums=verify_checksums,
            **shared,
            **settings["durable"],
        )
        if audit_approval:
            # The approval step is skipped when the audit passes; the commit then runs on the
            # audit's success alone (and is skipped, as before, when every upstream was).
            commit_args.setdefault("trigger_rule", "none_failed_min_one_success")
        commit_task = WalCommitOperator(
            task_id="commit",
            staging_root=staged_at,
            target=target,
            mode=mode,
            partition_by=partition_by,
            verify_checksums=verify_checksums,
            require_audit=checks is not None,
            fencing=fencing,
            target_options=target_options,
            **shared,
            **commit_args,
        )
        if checks is None:
            write_task >> durable_task >> commit_task
        else:
            audit_task = WalAuditOperator(
                task_id="audit",
                staging_root=staged_at,
                checks=checks,
                **({"fail_on_reject": False} if audit_approval else {}),
                **shared,
                **settings["audit"],
            )
            write_task >> durable_task >> audit_task >> commit_task
            if audit_approval:
                approval_task = _approval_operator()(
                    task_id="approval", staging_root=staged_at, **shared, **approval_args
                )
                audit_task >> approval_task >> commit_task
    if commit_deadline is not None:
        alert = commit_deadline_alert(
            pipeline=pipeline,
            commit_deadline=commit_deadline,
            callback=commit_deadline_callback,
            walsink_conn_id=walsink_conn_id,
            checkpoint_key=checkpoint_key,
        )
        add_commit_deadline(getattr(group, "dag", None), alert, pipeline)
    return group
