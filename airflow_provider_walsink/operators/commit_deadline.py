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
  deadline (the run went on with later tasks) is not reported. Otherwise walsink claims the
  deadline's notification in the committer table, recording the miss on the checkpoint with
  it (the UI marks it overdue until it commits, its history says when), and calls the user's
  notifier, its context holding ``walsink``: ``pipeline``, ``checkpoint_key``, ``state``,
  ``reason`` (the on-call reason walsink records: why it waits or was refused, else its
  error), ``deadline``, ``dag_id``, ``run_id``, ``link``.
* Once per deadline, also when the callback runs again (a triggerer restart, a reassigned
  trigger, two triggerers): the claim is a unique insert (``core/store/deadlines.py``), so
  only one run records and notifies. It comes before the call: a notifier that raises is
  recorded as failed and not called again (at most once; docs/deadlines.md says why).
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import os
import socket
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

# The triggerer imports this module on its event loop (an AsyncCallback's path): the committer
# table's modules (SQLAlchemy, Alembic) and the hooks are imported where they are used, in a
# worker thread (issue 46).
if TYPE_CHECKING:
    from airflow_provider_walsink.core.store.records import CheckpointRecord
    from airflow_provider_walsink.core.store.store import CommitterStore

log = logging.getLogger(__name__)

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
    from airflow_provider_walsink.hooks import versions

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
    notifier unless the checkpoint was COMMITTED in time or another run of this callback claimed
    the deadline's notification first. Returns :func:`summary` of the report.

    Text, not the report: Airflow 3.3.2's triggerer stores a callback's return value in the
    ``callback.output`` text column as it is, and a dict there makes the whole triggerer exit
    (psycopg2 "can't adapt type 'dict'"; ``airflow/triggers/callback.py`` yields the result as the
    event's body, ``airflow/models/callback.py`` sets ``self.output`` from it).
    """
    # The committer table and the notifier's import run off the triggerer's event loop.
    report, claim = await asyncio.to_thread(deadline_report, walsink, context)
    if claim is not None:
        full = {**context, "walsink": report}
        try:
            result = await asyncio.to_thread(_call, walsink, full)
            if inspect.isawaitable(result):
                await result
        except Exception as error:
            await asyncio.to_thread(claim.failed, error)
            raise
        await asyncio.to_thread(claim.notified)
    return summary(report)


def notify_commit_deadline_sync(*, walsink: Mapping[str, Any], context: Mapping[str, Any]) -> str:
    """Airflow's ``SyncCallback`` (an executor): as :func:`notify_commit_deadline`."""
    report, claim = deadline_report(walsink, context)
    if claim is not None:
        full = {**context, "walsink": report}
        try:
            result = _call(walsink, full)
            if callable(result):  # a notifier class: its instance sends when called with the context
                result(full)
        except Exception as error:
            claim.failed(error)
            raise
        claim.notified()
    return summary(report)


def summary(report: Mapping[str, Any]) -> str:
    """One line: whom the callback notified about what, or why it did not (Airflow keeps it as the
    callback's output)."""
    what = f"{report['pipeline']}/{report['checkpoint_key']} {report['state']}: {report['reason']}"
    if report.get("claimed_by"):
        return (
            f"not notified again (commit deadline {report['deadline']}): {report['claimed_by']} claimed "
            f"this deadline's notification first; {what}"
        )
    return (
        f"{'notified' if report['notify'] else 'not notified'} (commit deadline {report['deadline']}): {what}"
    )


@dataclass(frozen=True)
class NoticeClaim:
    """This run's claim on a deadline's notification (``core/store/deadlines.py``): it notifies,
    then writes what the notifier did on the claim."""

    store: CommitterStore
    pipeline: str
    deadline: str
    claimant: str

    def notified(self) -> None:
        from airflow_provider_walsink.core.store.deadlines import NOTIFIED

        self.store.finish_deadline_notice(
            self.pipeline, self.deadline, claimant=self.claimant, outcome=NOTIFIED
        )

    def failed(self, error: BaseException) -> None:
        # Claimed before the call, so never called twice: the failure is logged and recorded
        # (the notice, the checkpoint's history), and the callback fails in Airflow.
        from airflow_provider_walsink.core.store.deadlines import FAILED

        log.exception("commit deadline notifier of %s failed; it is not called again", self.pipeline)
        self.store.finish_deadline_notice(
            self.pipeline,
            self.deadline,
            claimant=self.claimant,
            outcome=FAILED,
            detail=f"{type(error).__name__}: {error}",
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


def deadline_report(
    walsink: Mapping[str, Any], context: Mapping[str, Any]
) -> tuple[dict[str, Any], NoticeClaim | None]:
    """The run's checkpoint at its missed commit deadline, and this run's claim on notifying about
    it (``None``: do not notify).

    The report is ``{"notify", "pipeline", "checkpoint_key", "state", "reason", "deadline",
    "dag_id", "run_id", "link"}``; ``notify`` is ``False`` for a checkpoint COMMITTED by the
    deadline, and for a deadline whose notification another run of the callback claimed first
    (a triggerer restart, a reassigned trigger, two triggerers; ``claimed_by`` names it). The
    claim records the miss on a registered checkpoint that is not COMMITTED in time, once.
    """
    from airflow_provider_walsink.core.store.deadlines import on_call_reason
    from airflow_provider_walsink.core.store.queries import wait_status
    from airflow_provider_walsink.core.store.records import Actor, utcnow
    from airflow_provider_walsink.hooks.walsink import WalsinkHook
    from airflow_provider_walsink.ui.links import checkpoint_link

    pipeline = walsink["pipeline"]
    dag_run = context.get("dag_run") or {}
    dag_id, run_id = dag_run.get("dag_id"), dag_run.get("dag_run_id") or dag_run.get("run_id")
    deadline = context.get("deadline") or {}
    due = _naive_utc(_moment(deadline.get("deadline_time"))) or utcnow()
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
        return {**report, "notify": False, "reason": "committed in time"}, None
    mode, first_open = store.wait_heads([pipeline]).get(pipeline, (None, None))
    reason = on_call_reason(record, wait_status(record, mode, first_open) if record else None)
    # Airflow's id of the run's deadline names it; a context without one, the run and the time.
    deadline_id = str(deadline.get("id") or f"{dag_id}/{run_id}@{report['deadline']}")
    claimant = (
        f"airflow deadline alert@{run_id} ({socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]})"
    )
    actor = Actor(name=f"airflow deadline alert@{run_id}"[:255], dag_id=dag_id, run_id=run_id)
    state = record.state.value if record else NOT_REGISTERED
    claimed = store.claim_deadline_notice(
        pipeline,
        deadline_id,
        checkpoint_key=record.checkpoint_key if record else None,
        due_at=due,
        actor=actor,
        claimant=claimant,
        detail=f"commit deadline missed: due {report['deadline']}, {state}: {reason}",
    )
    if not claimed:
        holder = store.deadline_notice(pipeline, deadline_id) or {}
        log.info(
            "commit deadline %s of %s: already claimed by %s", deadline_id, pipeline, holder.get("claimed_by")
        )
        return {**report, "notify": False, "reason": reason, "claimed_by": holder.get("claimed_by")}, None
    return {**report, "notify": True, "reason": reason}, NoticeClaim(store, pipeline, deadline_id, claimant)


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
    from airflow_provider_walsink.hooks.context import format_checkpoint_key

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
