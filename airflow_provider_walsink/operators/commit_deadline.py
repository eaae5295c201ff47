"""A pipeline's commit deadline: Airflow's own deadline alert on "sealed but not committed".

``walsink_pipeline(..., commit_deadline=timedelta(hours=2), commit_deadline_callback=cb)`` adds
one :class:`~airflow.sdk.DeadlineAlert` to the DAG (:func:`add_commit_deadline`)::

    DeadlineAlert(reference=DeadlineReference.DAGRUN_QUEUED_AT, interval=commit_deadline,
                  callback=<walsink's callback around cb>, name="walsink commit deadline: <pipeline>")

``cb`` is one of Airflow's deadline callbacks around a notifier or a function, e.g.
``AsyncCallback(SlackWebhookNotifier, kwargs={"text": "{{ walsink.pipeline }} ..."})`` (runs in
the triggerer) or ``SyncCallback(...)`` (runs on an executor). walsink keeps its kind and
wraps it in :func:`notify_commit_deadline` / :func:`notify_commit_deadline_sync`.

When Airflow runs it, and what it does:

* Airflow creates one deadline per DAG run when the run is created (due ``queued_at +
  commit_deadline``; a clear re-queues the run and moves a deadline not yet missed). The
  scheduler marks it missed once its time has passed (row-locked, so once, also with several
  schedulers) and queues the callback; a run that **succeeds** before it is due deletes it.
  So the callback runs exactly once for a run still running at the deadline (the durability
  sensor waiting, a commit retrying) or one that failed before it, and never for a run that
  succeeded in time (``airflow/models/deadline.py``: ``prune_deadlines``, ``handle_miss``;
  ``airflow/models/dagrun.py``: the prune on success; the scheduler's loop).
* Airflow's deadline is about the DAG run; walsink's is about the checkpoint. The callback
  finds the run's checkpoint of the pipeline in the committer table; one COMMITTED by the
  deadline (the run went on with later tasks) is not reported. Otherwise walsink records the
  miss on the checkpoint (the UI marks it overdue until it commits, its history says when)
  and calls the user's notifier once, its context holding ``walsink``: ``pipeline``,
  ``checkpoint_key``, ``state``, ``reason`` (the on-call reason walsink records: why it waits
  or was refused, else its error), ``deadline``, ``dag_id``, ``run_id``, ``link``.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from typing import Any

from airflow_provider_walsink.core.store.deadlines import on_call_reason
from airflow_provider_walsink.core.store.queries import wait_status
from airflow_provider_walsink.core.store.records import Actor, CheckpointRecord, utcnow
from airflow_provider_walsink.core.store.store import CommitterStore
from airflow_provider_walsink.hooks import versions
from airflow_provider_walsink.hooks.context import format_checkpoint_key
from airflow_provider_walsink.hooks.walsink import WalsinkHook
from airflow_provider_walsink.ui.links import checkpoint_link

#: The name of the deadline alert walsink adds for a pipeline (one per pipeline and DAG).
ALERT_NAME = "walsink commit deadline: {pipeline}"
#: What the report says for a checkpoint the run never registered.
NOT_REGISTERED = "NOT REGISTERED"


def check_commit_deadline(pipeline: str, commit_deadline: Any, callback: Any) -> None:
    """Refuse a commit deadline walsink cannot register, with what to give instead.

    Raises:
        ValueError: ``commit_deadline`` is not a positive :class:`~datetime.timedelta`, no
            callback (or a callback without a deadline) is given, or the callback is not an
            Airflow deadline callback (``AsyncCallback`` / ``SyncCallback``).
        FeatureUnavailable: a commit deadline on an Airflow older than 3.3 (a ``ValueError``).
    """
    where = f"walsink_pipeline({pipeline!r})"
    if commit_deadline is None:
        if callback is not None:
            raise ValueError(f"{where}: commit_deadline_callback is given without commit_deadline")
        return
    # Only a pipeline that asks for a deadline imports Airflow's deadline API (3.3+).
    versions.require("commit_deadline", where)
    from airflow.sdk.definitions.callback import AsyncCallback, SyncCallback

    if not isinstance(commit_deadline, timedelta):
        raise ValueError(
            f"{where}: commit_deadline must be a duration, a datetime.timedelta such as "
            f"timedelta(hours=2); got {type(commit_deadline).__name__} {commit_deadline!r}"
        )
    if commit_deadline <= timedelta(0):
        raise ValueError(f"{where}: commit_deadline must be positive; got {commit_deadline}")
    if not isinstance(callback, AsyncCallback | SyncCallback):
        raise ValueError(
            f"{where}: commit_deadline needs commit_deadline_callback, one of Airflow's deadline "
            "callbacks around a notifier or a function, e.g. AsyncCallback(SlackWebhookNotifier, "
            f"kwargs={{...}}) or SyncCallback(my_function); got {type(callback).__name__}"
        )


def commit_deadline_alert(
    *,
    pipeline: str,
    commit_deadline: timedelta,
    callback: Any,
    walsink_conn_id: str,
    checkpoint_key: str | None,
) -> Any:
    """The :class:`~airflow.sdk.DeadlineAlert` of the pipeline's commit deadline (checked first:
    :func:`check_commit_deadline`), its callback walsink's around ``callback``, of the same kind."""
    from airflow.sdk import DeadlineAlert, DeadlineReference
    from airflow.sdk.definitions.callback import AsyncCallback, SyncCallback

    check_commit_deadline(pipeline, commit_deadline, callback)
    kwargs = {
        "walsink": {
            "pipeline": pipeline,
            "walsink_conn_id": walsink_conn_id,
            # A given key may be a template the callback cannot render: it then finds the
            # checkpoint by the run that registered it only.
            "key_from_interval": checkpoint_key is None,
            "notifier": callback.path,
            "notifier_kwargs": dict(callback.kwargs),
        }
    }
    wrapped = (
        AsyncCallback(notify_commit_deadline, kwargs=kwargs)
        if isinstance(callback, AsyncCallback)
        else SyncCallback(notify_commit_deadline_sync, kwargs=kwargs, executor=callback.executor)
    )
    return DeadlineAlert(
        reference=DeadlineReference.DAGRUN_QUEUED_AT,
        interval=commit_deadline,
        callback=wrapped,
        name=ALERT_NAME.format(pipeline=pipeline),
    )


def add_commit_deadline(dag: Any, alert: Any, pipeline: str) -> None:
    """Add ``alert`` to the DAG's deadline alerts, keeping the ones it has.

    Raises:
        ValueError: no DAG (the pipeline is not inside ``with DAG(...)``), or the DAG already has
            an alert of that name (a second commit deadline for the pipeline in one DAG).
    """
    if dag is None:
        raise ValueError(
            f"walsink_pipeline({pipeline!r}): commit_deadline adds a deadline alert to the DAG, so "
            "call walsink_pipeline inside `with DAG(...)`"
        )
    existing = list(dag.deadline or [])
    if any(getattr(a, "name", None) == alert.name for a in existing):
        raise ValueError(
            f"walsink_pipeline({pipeline!r}): DAG {dag.dag_id!r} already has a deadline alert named "
            f"{alert.name!r}: one commit deadline per pipeline and DAG"
        )
    dag.deadline = [*existing, alert]  # the DAG's attrs converter and validator check the list


# The callbacks Airflow runs (top level, importable by path in the triggerer and on executors).


async def notify_commit_deadline(*, walsink: Mapping[str, Any], context: Mapping[str, Any]) -> str:
    """Airflow's ``AsyncCallback`` (triggerer): report the run's checkpoint, then await the user's
    notifier unless the checkpoint was COMMITTED in time. Returns :func:`summary` of the report.

    Text, not the report: Airflow 3.3.2's triggerer stores a callback's return value in the
    ``callback.output`` text column as it is, and a dict there makes the whole triggerer exit
    (psycopg2 "can't adapt type 'dict'"; ``airflow/triggers/callback.py`` yields the result as the
    event's body, ``airflow/models/callback.py`` sets ``self.output`` from it).
    """
    report = await asyncio.to_thread(deadline_report, walsink, context)
    if report["notify"]:
        result = _call(walsink, {**context, "walsink": report})
        if inspect.isawaitable(result):
            await result
    return summary(report)


def notify_commit_deadline_sync(*, walsink: Mapping[str, Any], context: Mapping[str, Any]) -> str:
    """Airflow's ``SyncCallback`` (an executor): as :func:`notify_commit_deadline`."""
    report = deadline_report(walsink, context)
    if report["notify"]:
        full = {**context, "walsink": report}
        result = _call(walsink, full)
        if callable(result):  # a notifier class: its instance sends when called with the context
            result(full)
    return summary(report)


def summary(report: Mapping[str, Any]) -> str:
    """One line: whom the callback notified about what, or why it did not (Airflow keeps it as the
    callback's output)."""
    what = f"{report['pipeline']}/{report['checkpoint_key']} {report['state']}: {report['reason']}"
    return (
        f"{'notified' if report['notify'] else 'not notified'} (commit deadline {report['deadline']}): {what}"
    )


def _call(walsink: Mapping[str, Any], context: dict[str, Any]) -> Any:
    """Call the user's callable as Airflow would (with ``context`` when it takes one); a notifier
    instance gets the context as its attribute, which its templates render from."""
    from airflow.sdk._shared.module_loading import accepts_context, import_string

    target = import_string(walsink["notifier"])
    kwargs = dict(walsink.get("notifier_kwargs") or {})
    result = target(**kwargs, context=context) if accepts_context(target) else target(**kwargs)
    if hasattr(result, "context") and hasattr(result, "__await__"):
        result.context = context  # a BaseNotifier: Airflow's own await path reads this attribute
    return result


def deadline_report(walsink: Mapping[str, Any], context: Mapping[str, Any]) -> dict[str, Any]:
    """The run's checkpoint at its missed commit deadline, recorded on the checkpoint if it is
    not COMMITTED in time.

    ``{"notify", "pipeline", "checkpoint_key", "state", "reason", "deadline", "dag_id",
    "run_id", "link"}``; ``notify`` is ``False`` only for a checkpoint COMMITTED by the deadline.
    """
    pipeline = walsink["pipeline"]
    dag_run = context.get("dag_run") or {}
    dag_id, run_id = dag_run.get("dag_id"), dag_run.get("dag_run_id") or dag_run.get("run_id")
    due = _naive_utc(_moment((context.get("deadline") or {}).get("deadline_time"))) or utcnow()
    store = WalsinkHook(walsink["walsink_conn_id"]).get_store()
    from_interval = walsink.get("key_from_interval", True)
    record = _run_checkpoint(store, pipeline, dag_id, run_id, dag_run, from_interval)
    report: dict[str, Any] = {
        "pipeline": pipeline,
        # Unregistered: the key the run would write, when walsink can tell it (no templated key).
        "checkpoint_key": record.checkpoint_key
        if record
        else (_interval_key(dag_run) if from_interval else None),
        "state": record.state.value if record else NOT_REGISTERED,
        "deadline": due.isoformat() + "Z",
        "dag_id": dag_id,
        "run_id": run_id,
        "link": checkpoint_link(dag_id, run_id, pipeline) if dag_id and run_id else None,
    }
    if record is not None and record.is_committed and record.committed_at and record.committed_at <= due:
        return {**report, "notify": False, "reason": "committed in time"}
    mode, first_open = store.wait_heads([pipeline]).get(pipeline, (None, None))
    reason = on_call_reason(record, wait_status(record, mode, first_open) if record else None)
    if record is not None:
        actor = Actor(name=f"airflow deadline alert@{run_id}", dag_id=dag_id, run_id=run_id)
        detail = f"commit deadline missed: due {report['deadline']}, {record.state.value}: {reason}"
        store.record_deadline_miss(pipeline, record.checkpoint_key, due_at=due, actor=actor, detail=detail)
    return {**report, "notify": True, "reason": reason}


def _run_checkpoint(
    store: CommitterStore,
    pipeline: str,
    dag_id: str | None,
    run_id: str | None,
    dag_run: Mapping[str, Any],
    key_from_interval: bool,
) -> CheckpointRecord | None:
    """The run's checkpoint of ``pipeline``: the one the run registered, else (a default key) the
    one its data interval names, whoever registered it; ``None`` if there is neither."""
    if dag_id and run_id:
        for record in store.checkpoints_of_run(dag_id, run_id):
            if record.pipeline == pipeline:
                return record
    key = _interval_key(dag_run) if key_from_interval else None
    return store.get(pipeline, key) if key else None


def _interval_key(dag_run: Mapping[str, Any]) -> str | None:
    start = _moment(dag_run.get("data_interval_start"))
    return format_checkpoint_key(start.astimezone(UTC)) if start else None


def _moment(value: Any) -> datetime | None:
    """A datetime from the simple context Airflow hands deadline callbacks (JSON: ISO text)."""
    if value is None or isinstance(value, datetime):
        return value
    if isinstance(value, int | float):
        return datetime.fromtimestamp(value, UTC)
    text = str(value).replace("Z", "+00:00")
    moment = datetime.fromisoformat(text)
    return moment if moment.tzinfo else moment.replace(tzinfo=UTC)


def _naive_utc(moment: datetime | None) -> datetime | None:
    if moment is None:
        return None
    return moment.astimezone(UTC).replace(tzinfo=None) if moment.tzinfo else moment
