"""Airflow context → protocol values: who is acting, and the run's checkpoint key and data interval."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from airflow_provider_walsink.core.protocol.errors import WalsinkError
from airflow_provider_walsink.core.protocol.modes import REPROCESS_CONF_KEY, REPROCESS_POLICIES, Reprocess
from airflow_provider_walsink.core.protocol.partition_keys import PartitionKeyError, PartitionSpec
from airflow_provider_walsink.core.store.store import Actor, new_instance_id

try:
    from airflow.sdk.exceptions import AirflowFailException
except ImportError:  # pragma: no cover
    from airflow.exceptions import AirflowFailException  # type: ignore[no-redef]


def actor_from_context(context: Any, *, role: str = "task") -> Actor:
    ti = context["ti"]
    map_index = getattr(ti, "map_index", -1)
    name = f"{ti.dag_id}.{ti.task_id}" + (f"[{map_index}]" if map_index not in (None, -1) else "")
    try_number = getattr(ti, "try_number", None)
    return Actor(
        name=f"{name}@{ti.run_id}",
        dag_id=ti.dag_id,
        run_id=ti.run_id,
        task_id=ti.task_id,
        try_number=try_number,
        # The lease owner: unique per task try and process (the ti id and try number
        # name the try, host/pid/random part the process), so try 2 of a task never
        # adopts a lease try 1 still holds.
        instance=new_instance_id(getattr(ti, "id", None), try_number),
    )


def format_checkpoint_key(moment: datetime) -> str:
    """``20260101T000000Z``: sortable, and safe in paths, Hadoop URIs and SQL."""
    return moment.strftime("%Y%m%dT%H%M%SZ")


class RunIntervalError(WalsinkError, AirflowFailException):
    """The run has no data interval walsink can take as its own; the message says why and what to do.

    An ``AirflowFailException``: the task fails without retrying (a retry sees the same run).
    """


@dataclass(frozen=True)
class RunInterval:
    """Which checkpoint a run writes and which interval its job reads.

    ``key`` is the checkpoint key; ``start``/``end`` are the run's data interval
    as Airflow recorded it (both ``None`` for a run with an explicit checkpoint
    key and no logical date, and for a partitioned run without one).
    ``partition_key``/``partition_date`` are the run's partition (Airflow 3.2+), and
    ``target_partition`` the target partition its checkpoint replaces (``dt=2026-01-05``,
    when the pipeline declares ``partition_column``).
    """

    key: str
    start: datetime | None
    end: datetime | None
    partition_key: str | None = None
    partition_date: datetime | None = None
    target_partition: str | None = None


def run_partition_key(context: Any) -> str | None:
    """The run's partition key (``CronPartitionTimetable``, a partitioned backfill, a run triggered
    with ``partition_key``), or ``None``: no partition, or an Airflow older than 3.2, whose
    context has none (the run keeps its data-interval key)."""
    key = context.get("partition_key")
    if key is None:
        key = getattr(context.get("dag_run"), "partition_key", None)
    return key


def run_interval(
    context: Any, checkpoint_key: str | None = None, partitions: PartitionSpec | None = None
) -> RunInterval:
    """The run's checkpoint key and data interval, taken from the run as Airflow 3 defines it.

    The key is ``checkpoint_key`` when given; else, for a run with a partition key, the
    partition's checkpoint key (``pk=2026-01-05``:
    :func:`~airflow_provider_walsink.core.protocol.partition_keys.checkpoint_key_for_partition`,
    checked against ``partitions``, the pipeline's declared column and format); else the data interval's start
    (``20260105T000000Z``), so two runs over the same interval write the same
    checkpoint. Airflow derives a run's data interval from its logical date:
    a scheduled or backfill run's interval starts at it, a manual run's
    (UI, REST API, ``dag.test``) is the timetable's interval ending at it, or
    both. A run whose interval neither starts nor ends at its logical date was
    not placed by its logical date (Airflow 3.3's ``airflow dags trigger -l``
    infers the interval from the time of the trigger): refused, because its
    key and interval would name a period the user did not ask for.

    Raises:
        RunIntervalError: the run has no logical date (asset-triggered runs,
            manual runs triggered without one), no partition key and no
            ``checkpoint_key`` is given, or its data interval does not start or
            end at its logical date; or its partition key cannot name a checkpoint
            or a target partition (``PartitionKeyError``'s message). Nothing is
            recorded; retrying cannot help.

    Safe to repeat: reads the context only.
    """
    partition_key = run_partition_key(context)
    if partition_key is not None:
        return _partition_interval(context, partition_key, checkpoint_key, partitions or PartitionSpec())
    logical = _aware(context.get("logical_date"))
    start = _aware(context.get("data_interval_start"))
    end = _aware(context.get("data_interval_end"))
    if logical is None or start is None or end is None:
        if checkpoint_key:
            return RunInterval(checkpoint_key, None, None)
        raise RunIntervalError(
            f"{_run_name(context)} has no logical date, so no data interval (Airflow 3 creates asset-triggered "
            "runs, and manual runs triggered without a logical date, so): walsink cannot tell which interval "
            "it writes and does not guess one. Run the interval with a logical date (`airflow backfill "
            "create --dag-id <dag> --from-date <day> --to-date <day>`, or trigger it with a logical date "
            "from the UI or the REST API), or give the pipeline an explicit checkpoint_key (a template, "
            "e.g. from the triggering asset event); docs/backfill.md"
        )
    if logical not in (start, end):
        raise RunIntervalError(
            f"{_run_name(context)} has logical date {logical.isoformat()} but data interval "
            f"[{start.isoformat()}, {end.isoformat()}], which neither starts nor ends at it: the interval "
            "was not derived from the logical date (Airflow 3.3's `airflow dags trigger -l` infers a manual "
            "run's interval from the time of the trigger). walsink takes the checkpoint key and the job's "
            "interval from the data interval, so this run would rewrite another period than the one asked "
            "for; refused before anything is written. Run that interval with `airflow backfill create "
            "--dag-id <dag> --from-date <day> --to-date <day>`, or trigger it with its logical date from the "
            "UI or the REST API (POST /api/v2/dags/<dag>/dagRuns, `airflowctl dags trigger`), which derive "
            "the interval from the logical date; docs/backfill.md"
        )
    return RunInterval(checkpoint_key or format_checkpoint_key(start.astimezone(UTC)), start, end)


def _partition_interval(
    context: Any, partition_key: str, checkpoint_key: str | None, partitions: PartitionSpec
) -> RunInterval:
    """A partitioned run: the key from its partition (unless given), its interval if it has one."""
    try:
        key = partitions.checkpoint_key(partition_key)
    except PartitionKeyError as exc:
        raise RunIntervalError(f"{_run_name(context)}: {exc}") from None
    start = _aware(context.get("data_interval_start"))
    end = _aware(context.get("data_interval_end"))
    return RunInterval(
        checkpoint_key or key,
        start,
        end,
        partition_key=partition_key,
        partition_date=_aware(context.get("partition_date")),
        target_partition=partitions.target_partition(partition_key),
    )


def checkpoint_key_from_context(context: Any, checkpoint_key: str | None = None) -> str:
    """The run's checkpoint key: ``checkpoint_key``, else its data interval start (:func:`run_interval`).

    Raises:
        RunIntervalError: as :func:`run_interval`.
    """
    return run_interval(context, checkpoint_key).key


def _aware(moment: Any) -> datetime | None:
    # Airflow hands aware datetimes (pendulum); a naive one would compare wrongly, so it is UTC.
    if moment is None:
        return None
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=UTC)


def _run_name(context: Any) -> str:
    dag_run = context.get("dag_run")
    run_type = getattr(dag_run, "run_type", None)
    run_type = str(getattr(run_type, "value", run_type) or "unknown")
    return f"run {context['ti'].run_id} ({run_type} run of DAG {context['ti'].dag_id})"


#: The pipeline policies for a re-run of a COMMITTED interval (docs/backfill.md).


def reprocess_decision(context: Any, policy: str) -> tuple[str, str]:
    """What a re-run of a COMMITTED checkpoint does in this run: ``("skip" | "replace", why)``.

    * the run's conf ``{"walsink_reprocess": "replace" | "skip"}`` decides if set
      (``airflow backfill create --reprocess-behavior completed --run-conf ...``
      puts it on every reprocessed run);
    * else the pipeline's ``policy``: ``skip``, or ``replace``, which rewrites
      only in a **backfill** run (``run_type == "backfill"``: Airflow's own
      reprocess of a completed run). A retry, or a clear of a scheduled or
      manual run, never rewrites.

    Airflow shows a task ``run_type``, ``clear_number`` and ``conf``, not the
    backfill: a user clearing a run that a backfill created looks like the
    backfill's reprocess (docs/backfill.md says so).
    """
    Reprocess.parse(policy)
    dag_run = context.get("dag_run")
    conf = getattr(dag_run, "conf", None) or {}
    asked = conf.get(REPROCESS_CONF_KEY) if isinstance(conf, dict) else None
    if asked is not None:
        if asked not in REPROCESS_POLICIES:
            raise ValueError(
                f"the run's conf sets {REPROCESS_CONF_KEY}={asked!r}; it must be one of {REPROCESS_POLICIES}"
            )
        return asked, f"the run's conf sets {REPROCESS_CONF_KEY}={asked!r}"
    if policy == "skip":
        return "skip", "the pipeline's reprocess policy is 'skip'"
    run_type = str(getattr(getattr(dag_run, "run_type", None), "value", getattr(dag_run, "run_type", "")))
    if run_type == "backfill":
        return "replace", "reprocess policy 'replace' and this is a backfill run"
    return (
        "skip",
        f"reprocess policy 'replace' rewrites only in backfill runs; this run is {run_type or 'unknown'}",
    )


def version_token(context: Any) -> str:
    """Which run (and which clear of it) a new checkpoint version belongs to: ``dag/run#clear``.

    A retry of a reprocessing task has the same token, so it continues that
    version instead of starting another.
    """
    ti = context["ti"]
    dag_run = context.get("dag_run")
    clear = getattr(dag_run, "clear_number", None) or 0
    return f"{ti.dag_id}/{ti.run_id}#{clear}"
