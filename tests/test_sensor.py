"""CheckpointDurableSensor (poke and deferrable) and CheckpointDurableTrigger, on every committer backend.

The checkpoints are staged without Spark (``tests.helpers.stage_checkpoint``);
the sensor and trigger reach the committer table through a real Airflow
connection (``AIRFLOW_CONN_WALSINK_DEFAULT``). The task instance in the context
is a plain record of the identity fields the sensor writes into the history.
"""

from __future__ import annotations

import asyncio
import importlib
import json
from types import SimpleNamespace

import pytest

try:
    from airflow.sdk.exceptions import AirflowSensorTimeout, TaskDeferred
except ImportError:  # Airflow 3.1 (scripts/test-oldest-airflow.sh)
    from airflow.exceptions import AirflowSensorTimeout, TaskDeferred  # type: ignore[no-redef]

from airflow_provider_walsink.core.protocol import CheckpointState as S
from airflow_provider_walsink.core.protocol.manifest import MANIFEST_NAME
from airflow_provider_walsink.core.staging import StagingLayout
from airflow_provider_walsink.core.store import CommitterStore
from airflow_provider_walsink.sensors.durable import CheckpointDurableSensor
from airflow_provider_walsink.triggers.durable import CheckpointDurableTrigger
from tests.helpers import stage_checkpoint

FILES = {
    "dt=2026-01-01/part-0.csv": b"a,1\nb,2\n",
    "dt=2026-01-01/part-1.csv": b"c,3\n",
}
KEY = "20260101T000000Z"


@pytest.fixture
def env(monkeypatch, db_url, tmp_path):
    staging = tmp_path / "staging"
    monkeypatch.setenv(
        "AIRFLOW_CONN_WALSINK_DEFAULT",
        json.dumps({"conn_type": "walsink", "extra": {"url": db_url, "staging_root": str(staging)}}),
    )
    return CommitterStore.from_url(db_url), StagingLayout(staging)


def context(task_id: str = "durable") -> dict:
    ti = SimpleNamespace(dag_id="d", task_id=task_id, run_id="r1", try_number=1, map_index=-1)
    return {"ti": ti}


def sensor(**kwargs) -> CheckpointDurableSensor:
    kwargs.setdefault("task_id", "durable")
    return CheckpointDurableSensor(pipeline="events", checkpoint_key=KEY, **kwargs)


def first_event(trigger: CheckpointDurableTrigger) -> dict:
    async def one():
        async for event in trigger.run():
            return event.payload

    return asyncio.run(one())


def test_poke_marks_a_complete_sealed_checkpoint_durable(env):
    store, layout = env
    stage_checkpoint(store, layout, "events", KEY, FILES, durable=False)
    assert store.require("events", KEY).state is S.SEALED
    assert sensor().poke(context()) is True
    assert store.require("events", KEY).state is S.DURABLE
    last = store.history("events", KEY)[-1]
    assert (last.to_state, last.dag_id, last.task_id, last.run_id) == ("DURABLE", "d", "durable", "r1")


@pytest.mark.parametrize(
    ("damage", "expected"),
    [
        ("delete", "1 missing: dt=2026-01-01/part-1.csv"),
        ("truncate", "1 size mismatch: dt=2026-01-01/part-1.csv (0 bytes, manifest says 4)"),
        ("manifest", "does not match the sealed digest"),
    ],
)
def test_a_timeout_names_what_is_missing(env, damage, expected):
    store, layout = env
    _, _, attempt_dir = stage_checkpoint(store, layout, "events", KEY, FILES, durable=False)
    if damage == "delete":
        (attempt_dir / "dt=2026-01-01/part-1.csv").unlink()
    elif damage == "truncate":
        (attempt_dir / "dt=2026-01-01/part-1.csv").write_bytes(b"")
    else:
        manifest = attempt_dir / MANIFEST_NAME
        manifest.write_bytes(manifest.read_bytes().replace(b'"rows":1', b'"rows":9'))
    with pytest.raises(AirflowSensorTimeout) as info:
        sensor(timeout=0, poke_interval=1).execute(context())
    assert expected in str(info.value)
    assert store.require("events", KEY).state is S.SEALED


def test_checksums_are_verified_only_when_asked(env):
    store, layout = env
    _, _, attempt_dir = stage_checkpoint(store, layout, "events", KEY, FILES, durable=False)
    (attempt_dir / "dt=2026-01-01/part-1.csv").write_bytes(b"X,3\n")  # same size, other bytes
    assert sensor(verify_checksums=True).poke(context()) is False
    s = sensor(verify_checksums=True)
    s.poke(context())
    assert "1 checksum mismatch: dt=2026-01-01/part-1.csv" in s._last.message
    assert sensor().poke(context()) is True  # sizes only: the corruption is invisible


def test_not_yet_written_and_already_committed(env):
    store, layout = env
    s = sensor()
    assert s.poke(context()) is False
    assert "is not registered" in s._last.message
    from tests.helpers import ACTOR

    store.register("events", KEY, mode="overwrite", actor=ACTOR)
    store.start_attempt("events", KEY, actor=ACTOR)
    assert s.poke(context()) is False
    assert "is WRITING at attempt 1, no sealed manifest yet" in s._last.message

    from airflow_provider_walsink.core.commit import CheckpointCommitter
    from airflow_provider_walsink.core.targets import FilePublisher

    stage_checkpoint(store, layout, "events", KEY, FILES)
    publisher = FilePublisher(layout.root.parent / "target", "overwrite", layout=layout)
    CheckpointCommitter(store, layout, publisher, mode="overwrite").commit("events", KEY, actor=ACTOR)
    assert not layout.checkpoint_dir("events", KEY).exists()  # the WAL is gone after the commit
    assert s.poke(context()) is True  # a re-run after the commit passes


def test_deferrable_sensor_defers_and_the_trigger_fires_when_durable(env):
    store, layout = env
    _, _, attempt_dir = stage_checkpoint(store, layout, "events", KEY, FILES, durable=False)
    held_back = attempt_dir / "dt=2026-01-01/part-1.csv"
    data = held_back.read_bytes()
    held_back.unlink()  # not durable yet: the sensor must defer

    s = sensor(deferrable=True, poke_interval=0.1)
    with pytest.raises(TaskDeferred) as info:
        s.execute(context())
    trigger = info.value.trigger
    assert isinstance(trigger, CheckpointDurableTrigger)
    assert info.value.method_name == "execute_complete"

    # What the triggerer stores and re-creates.
    classpath, kwargs = trigger.serialize()
    assert classpath == "airflow_provider_walsink.triggers.durable.CheckpointDurableTrigger"
    json.dumps(kwargs)  # plain JSON values only
    module, _, name = classpath.rpartition(".")
    revived = getattr(importlib.import_module(module), name)(**kwargs)
    assert revived.serialize() == (classpath, kwargs)
    assert kwargs["actor"]["task_id"] == "durable"

    held_back.write_bytes(data)
    event = first_event(revived)
    assert event["status"] == "durable"
    assert store.require("events", KEY).state is S.DURABLE
    assert s.execute_complete(context(), event) is None
    # The transition names the task that deferred, though the triggerer made it.
    last = store.history("events", KEY)[-1]
    assert (last.to_state, last.task_id) == ("DURABLE", "durable")


def test_trigger_timeout_names_what_is_missing(env):
    store, layout = env
    _, _, attempt_dir = stage_checkpoint(store, layout, "events", KEY, FILES, durable=False)
    (attempt_dir / "dt=2026-01-01/part-0.csv").unlink()
    trigger = CheckpointDurableTrigger(pipeline="events", checkpoint_key=KEY, timeout_at=0.0)
    event = first_event(trigger)
    assert event["status"] == "timeout"
    assert "1 missing: dt=2026-01-01/part-0.csv" in event["message"]
    with pytest.raises(AirflowSensorTimeout, match="1 missing: dt=2026-01-01/part-0.csv"):
        sensor(deferrable=True).execute_complete(context(), event)


@pytest.mark.parametrize("how", ["argument", "run conf"])
def test_check_before_defer_can_be_turned_off(env, how):
    store, layout = env
    stage_checkpoint(store, layout, "events", KEY, FILES, durable=False)
    ctx = context()
    if how == "argument":
        s = sensor(deferrable=True, check_before_defer=False)
    else:
        s = sensor(deferrable=True)
        ctx["dag_run"] = SimpleNamespace(conf={"walsink_check_before_defer": False})
    with pytest.raises(TaskDeferred):
        s.execute(ctx)  # durable already, but the wait goes to the triggerer all the same
    assert store.require("events", KEY).state is S.SEALED
    assert sensor(deferrable=True).execute(context()) is None  # default: checked first, no deferral
    assert store.require("events", KEY).state is S.DURABLE


# --------------------------------------------------------------------------- started in the triggerer


def _first(trigger: CheckpointDurableTrigger):
    async def one():
        async for event in trigger.run():
            return event

    return asyncio.run(one())


def test_a_deferrable_sensor_starts_in_the_triggerer_and_ends_there(env):
    """What the scheduler stores (``start_trigger_args``) re-creates a trigger that, given only the
    task instance the triggerer attaches, finds the run's checkpoint, marks it DURABLE in the task's
    name and ends the task itself (no worker resumes it). The real scheduler: test_e2e_sensor_start.py."""
    from datetime import UTC, datetime

    from airflow.triggers.base import TaskFailedEvent, TaskSuccessEvent

    store, layout = env
    stage_checkpoint(store, layout, "events", KEY, FILES, durable=False)
    s = CheckpointDurableSensor(
        task_id="durable", pipeline="events", deferrable=True, start_from_trigger=True, poke_interval=0.1
    )
    assert s.start_from_trigger
    args = s.start_trigger_args
    assert args.trigger_cls == "airflow_provider_walsink.triggers.durable.CheckpointDurableTrigger"
    assert args.next_method == "execute_complete" and args.timeout.total_seconds() > s.timeout
    json.dumps(args.trigger_kwargs)  # plain JSON values, no callable
    assert args.trigger_kwargs["checkpoint_key"] is None  # taken in the triggerer, from the run
    module, _, name = args.trigger_cls.rpartition(".")
    trigger = getattr(importlib.import_module(module), name)(**args.trigger_kwargs)
    start = datetime(2026, 1, 1, tzinfo=UTC)
    ti = SimpleNamespace(dag_id="d", task_id="durable", run_id="r1", try_number=1, map_index=-1, id=None)
    ti.get_template_context = lambda: {
        "ti": ti, "logical_date": start, "data_interval_start": start, "data_interval_end": start
    }  # fmt: skip
    trigger.task_instance = ti
    assert isinstance(_first(trigger), TaskSuccessEvent)
    assert store.require("events", KEY).state is S.DURABLE
    last = store.history("events", KEY)[-1]
    assert (last.to_state, last.task_id, last.run_id) == ("DURABLE", "durable", "r1")

    # Not durable by its deadline: the task fails from the triggerer too.
    late = CheckpointDurableTrigger(
        pipeline="events", checkpoint_key="20260109T000000Z", timeout=0.0, end_from_trigger=True
    )
    assert isinstance(_first(late), TaskFailedEvent)


def test_the_sensor_starts_on_a_worker_where_it_cannot_start_in_the_triggerer():
    assert not sensor(deferrable=False, start_from_trigger=True).start_from_trigger  # poke / reschedule
    assert sensor(deferrable=True).start_from_trigger  # on by default wherever it can be
    # A value only known at run time that the triggerer cannot render (an object, not a template).
    assert not sensor(
        deferrable=True, start_from_trigger=True, staging_root=SimpleNamespace()
    ).start_from_trigger
    # An XCom pull the triggerer cannot answer (a sequence slice: it would hang rendering there).
    assert not sensor(
        deferrable=True, start_from_trigger=True, staging_root="{{ ti.xcom_pull(key='staging_root') }}"
    ).start_from_trigger
    pulled = "{{ ti.xcom_pull(task_ids='w', key='staging_root', map_indexes=-1) or '' }}"
    assert sensor(deferrable=True, start_from_trigger=True, staging_root=pulled).start_from_trigger
