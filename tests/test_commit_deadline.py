"""``walsink_pipeline(commit_deadline=..., commit_deadline_callback=...)`` at parse time, and the
callback's decision (issue 37).

Parse time: the pipeline adds Airflow's own deadline alert to the DAG (from the run's queued time,
walsink's callback around the user's, of the same kind), keeps the DAG's other alerts, and the DAG
serializes as the dag-processor stores it; bad input (a deadline that is not a positive duration,
no callback, a second commit deadline for the pipeline) is refused with a clear error before any
task exists. The callback, called as Airflow calls it (kwargs plus the simple context of
``Deadline.handle_miss``), against a real committer table: a checkpoint COMMITTED by the deadline
is not reported; a held-back one calls the user's notifier once with pipeline, checkpoint, state
and reason. Airflow's scheduler and triggerer running it: ``tests/test_e2e_commit_deadline.py``.
"""

from __future__ import annotations

import asyncio
import json
from datetime import UTC, datetime, timedelta

import pytest
from airflow.sdk import DAG, AsyncCallback, DeadlineAlert, DeadlineReference, SyncCallback

from airflow_provider_walsink.core.store import Actor
from airflow_provider_walsink.core.store.deadlines import is_overdue
from airflow_provider_walsink.core.store.store import CommitterStore, utcnow
from airflow_provider_walsink.operators.commit_deadline import (
    ALERT_NAME,
    notify_commit_deadline,
    notify_commit_deadline_sync,
)
from airflow_provider_walsink.operators.pipeline import walsink_pipeline
from tests.helpers import stage_checkpoint

START = datetime(2026, 1, 1, tzinfo=UTC)
REQUIRED = {"pipeline": "p", "application": "/jobs/job.py", "target": "/data/t"}
CALLS: list[dict] = []


async def user_alert(**kwargs):  # an AsyncCallback's function
    CALLS.append(kwargs)


def user_alert_sync(context, channel):  # a SyncCallback's function
    CALLS.append({"context": context, "channel": channel})


def test_the_pipeline_adds_airflows_deadline_alert_and_keeps_the_dags_own():
    from airflow.serialization.serialized_objects import DagSerialization

    theirs = DeadlineAlert(
        reference=DeadlineReference.DAGRUN_LOGICAL_DATE,
        interval=timedelta(hours=9),
        callback=AsyncCallback(user_alert),
    )
    with DAG("d", schedule=None, start_date=START, deadline=theirs) as dag:
        walsink_pipeline(
            "events", **REQUIRED, commit_deadline=timedelta(hours=2),
            commit_deadline_callback=AsyncCallback(user_alert, kwargs={"channel": "#data"}),
        )  # fmt: skip
        walsink_pipeline(
            "other", **{**REQUIRED, "pipeline": "q"}, commit_deadline=timedelta(minutes=5),
            commit_deadline_callback=SyncCallback(user_alert_sync, executor="LocalExecutor"),
        )  # fmt: skip
    first, mine, sync = dag.deadline
    assert first is theirs
    assert mine.name == ALERT_NAME.format(pipeline="p") and mine.interval == timedelta(hours=2)
    assert mine.reference == DeadlineReference.DAGRUN_QUEUED_AT
    assert isinstance(mine.callback, AsyncCallback)
    assert mine.callback.path == "airflow_provider_walsink.operators.commit_deadline.notify_commit_deadline"
    assert mine.callback.kwargs["walsink"] == {
        "pipeline": "p", "walsink_conn_id": "walsink_default", "key_from_interval": True,
        "notifier": f"{__name__}.user_alert", "notifier_kwargs": {"channel": "#data"},
    }  # fmt: skip
    assert isinstance(sync.callback, SyncCallback) and sync.callback.executor == "LocalExecutor"
    assert sync.callback.path.endswith("notify_commit_deadline_sync")
    # As the dag-processor stores it (what the scheduler creates the run's deadline from).
    stored = DagSerialization.to_dict(dag)["dag"]["deadline"]
    assert [a["name"] for a in stored] == [None, mine.name, sync.name]
    assert stored[1]["reference"] == {"reference_type": "DagRunQueuedAtDeadline"}


@pytest.mark.parametrize(
    ("deadline", "callback", "message"),
    [
        (
            "2h",
            AsyncCallback(user_alert),
            "commit_deadline must be a duration, a datetime.timedelta .* got str '2h'",
        ),
        (7200, AsyncCallback(user_alert), "commit_deadline must be a duration.* got int 7200"),
        (timedelta(0), AsyncCallback(user_alert), "commit_deadline must be positive"),
        (timedelta(minutes=-5), AsyncCallback(user_alert), "commit_deadline must be positive"),
        (timedelta(hours=1), None, "commit_deadline needs commit_deadline_callback.*AsyncCallback"),
        (timedelta(hours=1), user_alert, "commit_deadline needs commit_deadline_callback.* got function"),
        (None, AsyncCallback(user_alert), "commit_deadline_callback is given without commit_deadline"),
    ],
)
def test_bad_input_is_refused_at_parse_time_before_any_task_exists(deadline, callback, message):
    with DAG("d", schedule=None, start_date=START) as dag:
        with pytest.raises(ValueError, match=message) as refused:
            walsink_pipeline(
                "events", **REQUIRED, commit_deadline=deadline, commit_deadline_callback=callback
            )
    assert str(refused.value).startswith("walsink_pipeline('p'): ")
    assert dag.task_dict == {} and not dag.deadline


def test_a_second_commit_deadline_for_the_pipeline_in_one_dag_is_refused():
    with DAG("d", schedule=None, start_date=START) as dag:
        walsink_pipeline(
            "a",
            **REQUIRED,
            commit_deadline=timedelta(hours=1),
            commit_deadline_callback=AsyncCallback(user_alert),
        )
        with pytest.raises(
            ValueError, match="already has a deadline alert named 'walsink commit deadline: p'"
        ):
            walsink_pipeline(
                "b",
                **REQUIRED,
                commit_deadline=timedelta(hours=2),
                commit_deadline_callback=AsyncCallback(user_alert),
            )
    assert len(dag.deadline) == 1


def _context(run_id: str, due: datetime, interval_start: str, deadline_id: str = "x") -> dict:
    """The simple context Airflow's ``Deadline.handle_miss`` hands a deadline callback (JSON;
    ``deadline_id``: Airflow's id of the run's deadline)."""
    return {
        "dag_run": {
            "dag_run_id": run_id, "dag_id": "d", "data_interval_start": interval_start,
            "queued_at": (due - timedelta(hours=2)).isoformat(),
        },
        "deadline": {"id": deadline_id, "deadline_time": due.replace(tzinfo=UTC).isoformat()},
    }  # fmt: skip


@pytest.fixture
def deadline_store(monkeypatch, tmp_path):
    url = f"sqlite:///{tmp_path}/committer.db"
    monkeypatch.setenv(
        "AIRFLOW_CONN_WALSINK_DEFAULT",
        json.dumps(
            {"conn_type": "walsink", "extra": {"url": url, "staging_root": str(tmp_path / "staging")}}
        ),
    )
    from airflow_provider_walsink.core.staging.layout import StagingLayout

    store = CommitterStore.from_url(url)
    yield store, StagingLayout(tmp_path / "staging")
    store.dispose()


def test_the_callback_reports_a_held_back_checkpoint_once_and_not_one_committed_in_time(deadline_store):
    store, layout = deadline_store
    walsink = {
        "pipeline": "p", "walsink_conn_id": "walsink_default", "key_from_interval": True,
        "notifier": f"{__name__}.user_alert", "notifier_kwargs": {"channel": "#data"},
    }  # fmt: skip
    held = Actor(name="w", dag_id="d", run_id="run-held", task_id="write", try_number=1)
    stage_checkpoint(
        store, layout, "p", "20260101T000000Z", {"dt=1/a.csv": b"1\n"}, durable=False, actor=held
    )
    due = utcnow() - timedelta(seconds=1)
    CALLS.clear()
    output = asyncio.run(
        notify_commit_deadline(
            walsink=walsink, context=_context("run-held", due, "2026-01-01T00:00:00+00:00")
        )
    )
    # Text (Airflow keeps it as the callback's output).
    assert output.startswith("notified (commit deadline ") and "p/20260101T000000Z SEALED: sealed;" in output
    (call,) = CALLS
    assert call["channel"] == "#data"
    fields = call["context"]["walsink"]
    assert (fields["pipeline"], fields["checkpoint_key"], fields["state"]) == (
        "p",
        "20260101T000000Z",
        "SEALED",
    )
    assert fields["reason"].startswith("sealed; waiting to be durable")
    record = store.require("p", "20260101T000000Z")
    assert is_overdue(record, utcnow())

    # Committed by the deadline (found by the interval: another run registered it): not reported.
    CALLS.clear()
    store.mark_durable("p", "20260101T000000Z", attempt=1, actor=held)
    from airflow_provider_walsink.core.commit import CheckpointCommitter
    from airflow_provider_walsink.core.targets import FilePublisher

    CheckpointCommitter(
        store, layout, FilePublisher(layout.root.parent / "t", "overwrite", layout=layout), mode="overwrite"
    ).commit("p", "20260101T000000Z", actor=held)
    output = notify_commit_deadline_sync(
        walsink={**walsink, "notifier": f"{__name__}.user_alert_sync"},
        context=_context("run-other", utcnow() + timedelta(seconds=5), "2026-01-01T00:00:00+00:00"),
    )
    assert output.startswith("not notified") and output.endswith("COMMITTED: committed in time")
    assert CALLS == []
    assert not is_overdue(store.require("p", "20260101T000000Z"), utcnow())

    # A run whose write task never registered its checkpoint is reported as such.
    notify_commit_deadline_sync(
        walsink={**walsink, "notifier": f"{__name__}.user_alert_sync"},
        context=_context("run-none", utcnow(), "2026-01-02T00:00:00+00:00", "none-1"),
    )
    (call,) = CALLS
    fields = call["context"]["walsink"]
    assert (fields["state"], fields["checkpoint_key"]) == ("NOT REGISTERED", "20260102T000000Z")
    assert call["channel"] == "#data" and fields["reason"].startswith("not registered")
    # A templated key: the checkpoint is found by the run only, and none is guessed from the interval.
    CALLS.clear()
    notify_commit_deadline_sync(
        walsink={**walsink, "notifier": f"{__name__}.user_alert_sync", "key_from_interval": False},
        context=_context("run-none", utcnow(), "2026-01-01T00:00:00+00:00", "none-2"),
    )
    (call,) = CALLS
    assert (call["context"]["walsink"]["state"], call["context"]["walsink"]["checkpoint_key"]) == (
        "NOT REGISTERED",
        None,
    )


# Once per deadline (issue 46): a triggerer restart, a reassigned trigger or two triggerers run the
# callback again for the same deadline; the second run finds the first one's claim and does nothing.

WALSINK = {
    "pipeline": "p", "walsink_conn_id": "walsink_default", "key_from_interval": True,
    "notifier": f"{__name__}.user_alert", "notifier_kwargs": {"channel": "#data"},
}  # fmt: skip
HELD_KEY = "20260101T000000Z"


def failing_alert_sync(context, channel):  # a notifier whose service is down
    CALLS.append({"context": context, "channel": channel})
    raise ConnectionError("slack is down")


@pytest.fixture
def held_back(db_url, monkeypatch, tmp_path):
    """A SEALED checkpoint of run ``run-held`` in a committer table on each backend, the callback's
    connection pointing at it."""
    from airflow_provider_walsink.core.staging.layout import StagingLayout

    monkeypatch.setenv(
        "AIRFLOW_CONN_WALSINK_DEFAULT",
        json.dumps(
            {"conn_type": "walsink", "extra": {"url": db_url, "staging_root": str(tmp_path / "staging")}}
        ),
    )
    store = CommitterStore.from_url(db_url)
    held = Actor(name="w", dag_id="d", run_id="run-held", task_id="write", try_number=1)
    stage_checkpoint(
        store, StagingLayout(tmp_path / "staging"), "p", HELD_KEY, {"dt=1/a.csv": b"1\n"}, durable=False,
        actor=held,
    )  # fmt: skip
    CALLS.clear()
    yield store
    store.dispose()


def _missed_rows(store: CommitterStore) -> list:
    return [h for h in store.history("p", HELD_KEY) if "commit deadline missed" in (h.detail or "")]


def _run_callback(kind: str, context: dict, notifier: str = "") -> str:
    if kind == "async":
        walsink = {**WALSINK, "notifier": notifier or f"{__name__}.user_alert"}
        return asyncio.run(notify_commit_deadline(walsink=walsink, context=context))
    walsink = {**WALSINK, "notifier": notifier or f"{__name__}.user_alert_sync"}
    return notify_commit_deadline_sync(walsink=walsink, context=context)


@pytest.mark.parametrize("kind", ["async", "sync"])
def test_the_callback_run_twice_for_one_deadline_notifies_once_and_records_one_row(held_back, kind):
    store = held_back
    context = _context("run-held", utcnow() - timedelta(seconds=1), "2026-01-01T00:00:00+00:00")
    first = _run_callback(kind, context)
    second = _run_callback(kind, json.loads(json.dumps(context)))  # a restarted triggerer's copy

    assert first.startswith("notified (commit deadline ")
    assert second.startswith("not notified again (commit deadline ") and "claimed" in second
    assert len(CALLS) == 1
    assert [(h.run_id, h.to_state) for h in _missed_rows(store)] == [("run-held", "SEALED")]
    record = store.require("p", HELD_KEY)
    assert record.state.value == "SEALED" and is_overdue(record, utcnow())  # the deadline moves no state
    notice = store.deadline_notice("p", "x")
    assert (notice["outcome"], notice["run_id"], notice["checkpoint_key"]) == (
        "notified",
        "run-held",
        HELD_KEY,
    )

    # Another deadline of the same run (a new run of the interval has its own) notifies again.
    _run_callback(kind, {**context, "deadline": {**context["deadline"], "id": "y"}})
    assert len(CALLS) == 2 and len(_missed_rows(store)) == 2


def test_two_callbacks_racing_for_one_deadline_notify_once(held_back):
    """Two triggerers run the callback for the same deadline at the same moment: the claim's
    primary key lets one notify; the other finds its claim."""
    import threading
    from concurrent.futures import ThreadPoolExecutor

    store = held_back
    context = _context("run-held", utcnow() - timedelta(seconds=1), "2026-01-01T00:00:00+00:00")
    start = threading.Barrier(4)

    def run(kind: str) -> str:
        start.wait()
        return _run_callback(kind, json.loads(json.dumps(context)))

    with ThreadPoolExecutor(4) as pool:
        outputs = list(pool.map(run, ["sync", "async", "sync", "async"]))
    assert sorted(o.split(" (")[0] for o in outputs) == ["not notified again"] * 3 + ["notified"]
    assert len(CALLS) == 1
    assert len(_missed_rows(store)) == 1
    assert store.require("p", HELD_KEY).state.value == "SEALED"


def test_a_notifier_that_fails_after_the_claim_is_recorded_and_never_called_again(held_back):
    """At most once: the claim is recorded before the notifier is called, so a notifier that
    raises is not called by a second run; its failure is on the claim and in the history, and the
    callback fails in Airflow."""
    store = held_back
    context = _context("run-held", utcnow() - timedelta(seconds=1), "2026-01-01T00:00:00+00:00")
    failing = f"{__name__}.failing_alert_sync"
    with pytest.raises(ConnectionError, match="slack is down"):
        _run_callback("sync", context, notifier=failing)
    assert _run_callback("sync", context, notifier=failing).startswith("not notified again")
    assert len(CALLS) == 1
    notice = store.deadline_notice("p", "x")
    assert (notice["outcome"], notice["detail"]) == ("failed", "ConnectionError: slack is down")
    details = [h.detail for h in store.history("p", HELD_KEY)]
    assert sum("commit deadline missed" in (d or "") for d in details) == 1
    assert "commit deadline notifier failed (not called again): ConnectionError: slack is down" in details
    assert store.require("p", HELD_KEY).state.value == "SEALED"
