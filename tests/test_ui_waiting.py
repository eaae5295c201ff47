"""Issue 25 item 2: a blocked or refused checkpoint says why and what to do, everywhere.

``orders`` (append): k1 FAILED, k2 REGISTERED whose write task was refused because k1
is open, k3 DURABLE behind k1 (its commit would wait). ``ledger`` (append): c1
committed, c2 DURABLE starting at offsets that do not continue c1's, refused by
its commit. The write task and the committer run as the tasks run them.
"""

from __future__ import annotations

import json
import os
from types import SimpleNamespace

import pytest
from ui_fixtures import DAG_A, build_world

from airflow_provider_walsink.core.commit import CheckpointCommitter
from airflow_provider_walsink.core.store import Actor, OffsetsError, OrderingError
from airflow_provider_walsink.core.targets import FilePublisher
from airflow_provider_walsink.operators.write import WalWriteOperator
from tests.helpers import stage_checkpoint
from tests.test_cli import walsink

pytestmark = pytest.mark.airflow

ACTOR = Actor(name="w", dag_id=DAG_A, run_id="run-o", task_id="write", try_number=1)


def add_waiting_checkpoints(world, tmp) -> None:
    """``orders`` and ``ledger`` as the module's docstring says, through the tasks' own calls."""
    store, layout = world.store, world.layout
    stage_checkpoint(
        store, layout, "orders", "k1", {"a.csv": b"1\n"}, mode="append", durable=False, actor=ACTOR
    )
    store.fail("orders", "k1", error="spark job died", actor=ACTOR, attempt=1)
    store.register("orders", "k2", mode="append", actor=ACTOR)
    stage_checkpoint(store, layout, "orders", "k3", {"c.csv": b"3\n"}, mode="append", actor=ACTOR)
    # The write task of k2, as Airflow runs it: refused, and the refusal is recorded.
    op = WalWriteOperator(
        task_id="write",
        application="/nonexistent.py",
        pipeline="orders",
        mode="append",
        checkpoint_key="k2",
        walsink_conn_id=os.environ["AIRFLOW__WALSINK__UI_CONN_ID"],
    )
    ti = SimpleNamespace(dag_id=DAG_A, task_id="write", run_id="run-k2", try_number=1, map_index=-1)
    with pytest.raises(OrderingError, match="earlier checkpoint k1 .* is FAILED"):
        op.execute({"ti": ti})
    publisher = FilePublisher(tmp / "ledger-target", "append", layout=layout)
    committer = CheckpointCommitter(store, layout, publisher, mode="append")
    stage_checkpoint(
        store, layout, "ledger", "c1", {"a.csv": b"1\n"}, mode="append",
        start_offsets={"p": 0}, end_offsets={"p": 10}, actor=ACTOR,
    )  # fmt: skip
    committer.commit("ledger", "c1", actor=ACTOR)
    stage_checkpoint(
        store, layout, "ledger", "c2", {"b.csv": b"2\n"}, mode="append",
        start_offsets={"p": 5}, end_offsets={"p": 20}, actor=ACTOR,
    )  # fmt: skip
    with pytest.raises(OffsetsError):
        committer.commit("ledger", "c2", actor=ACTOR)


@pytest.fixture(scope="module")
def world(airflow_db, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("ui-waiting")
    url = f"sqlite:///{tmp}/committer.db"
    with pytest.MonkeyPatch.context() as mp:
        for world in build_world(url, tmp, mp):
            add_waiting_checkpoints(world, tmp)
            world.url = url
            yield world


def _api(world, pipeline: str) -> dict[str, dict]:
    body = world.client.get(
        f"/walsink/api/pipelines/{pipeline}/checkpoints", headers=world.headers("admin")
    ).json()
    return {c["checkpoint_key"]: c for c in body["checkpoints"]}


def test_the_write_task_records_why_it_waits(world):
    record = world.store.require("orders", "k2")
    assert record.state.value == "REGISTERED"
    assert record.error.startswith("blocked by earlier checkpoint k1:")
    assert "walsink abort orders k1" in record.error  # the fix
    events = [t for t in world.store.history("orders", "k2") if t.from_state == t.to_state]
    assert events and events[-1].detail == record.error and events[-1].run_id == "run-k2"


def test_the_api_says_blocked_by_which_checkpoint_and_the_fix(world):
    rows = _api(world, "orders")
    for key, waiting_to in (("k2", "start writing"), ("k3", "commit")):
        waiting = rows[key]["waiting"]
        assert waiting["status"] == "blocked", key
        assert waiting["blocked_by"] == {
            "checkpoint_key": "k1",
            "partition_key": None,
            "sequence": 1,
            "state": "FAILED",
        }
        assert f"cannot {waiting_to}" in waiting["reason"] and "Fix:" in waiting["reason"]
        # Waiting is not writing: no phase counts up as running.
        assert rows[key]["phases"]["current"] == "blocked"
    assert rows["k1"]["waiting"] is None  # failed: its own error says why
    detail = world.client.get(
        "/walsink/api/pipelines/orders/checkpoints/k2", headers=world.headers("admin")
    ).json()
    assert detail["checkpoint"]["waiting"]["status"] == "blocked"


def test_a_commit_refused_for_its_offsets_says_so(world):
    rows = _api(world, "ledger")
    c2 = rows["c2"]
    assert c2["state"] == "DURABLE"
    assert c2["waiting"]["status"] == "refused"
    assert "offsets" in c2["waiting"]["reason"] and "write it again" in c2["waiting"]["reason"]
    assert rows["c1"]["waiting"] is None


def test_pages_show_blocked_in_its_own_colour_not_as_writing(world):
    page = world.client.get("/walsink/pipelines/orders", headers=world.headers("admin")).text
    assert "BLOCKED by k1" in page
    assert 'class="cell s-blocked"' in page
    assert '<small class="open">write' not in page  # nothing shown as a running write
    refused = world.client.get("/walsink/pipelines/ledger", headers=world.headers("admin")).text
    assert "REFUSED" in refused
    page = world.client.get("/walsink/pipelines/orders/checkpoints/k2", headers=world.headers("admin")).text
    assert 'id="waiting"' in page and "walsink abort orders k1" in page


def test_the_cli_shows_why(world):
    result = walsink("checkpoints", "--url", world.url, "--pipeline", "orders", "--pipeline", "ledger")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    k2 = next(line for line in lines if " k2 " in line)
    assert "blocked by earlier checkpoint k1" in k2
    c2 = next(line for line in lines if " c2 " in line)
    assert "refused:" in c2 and "offsets" in c2
    result = walsink("status", "--url", world.url, "--pipeline", "orders", "--json")
    body = json.loads(result.stdout)
    k3 = next(c for c in body[0]["checkpoints"] if c["key"] == "k3")
    assert k3["waiting"]["status"] == "blocked" and k3["waiting"]["blocked_by"]["checkpoint_key"] == "k1"


def test_the_commit_task_records_why_it_waits(world, tmp_path):
    from airflow_provider_walsink.operators.commit import WalCommitOperator

    op = WalCommitOperator(
        task_id="commit",
        pipeline="orders",
        target=str(tmp_path / "orders-target"),
        mode="append",
        checkpoint_key="k3",
        walsink_conn_id=os.environ["AIRFLOW__WALSINK__UI_CONN_ID"],
    )
    ti = SimpleNamespace(dag_id=DAG_A, task_id="commit", run_id="run-k3", try_number=3, map_index=-1, id=None)
    with pytest.raises(OrderingError, match="k1"):
        op.execute({"ti": ti})
    record = world.store.require("orders", "k3")
    assert record.state.value == "DURABLE"
    assert record.error.startswith("blocked by earlier checkpoint k1:") and "cannot commit" in record.error
    # The try that waited is the one whose log the page links.
    body = world.client.get(
        "/walsink/api/pipelines/orders/checkpoints/k3", headers=world.headers("admin")
    ).json()
    assert body["log"]["url"] == f"/dags/{DAG_A}/runs/run-k3/tasks/commit?try_number=3"
    assert body["checkpoint"]["waiting"]["reason"] == record.error
