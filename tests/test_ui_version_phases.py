"""Issue 25 item 5: a reprocessed checkpoint shows each version's own phases.

``sales_a/20260101T000000Z`` was written and committed two hours ago (its times moved back
in the committer table); a reprocess now starts version 2 and seals it. Its write phase
is the seconds version 2 took, not two hours since the first registration.
``sales_a/20260102T000000Z`` is reprocessed too and left REGISTERED: its running write
phase counts from the reprocess.
"""

from __future__ import annotations

from datetime import timedelta

import pytest
from sqlalchemy import select, update
from ui_fixtures import DAG_A, build_world

from airflow_provider_walsink.core.store import Actor
from airflow_provider_walsink.core.store.models import checkpoint_table as ckpt
from airflow_provider_walsink.core.store.models import transition_table as trans
from tests.helpers import stage_checkpoint

pytestmark = pytest.mark.airflow

KEY, OPEN_KEY = "20260101T000000Z", "20260102T000000Z"
EARLIER = timedelta(hours=2)


def _move_back(store, pipeline: str, key: str) -> None:
    """As if every recorded time of the checkpoint so far were two hours ago."""
    with store.engine.begin() as conn:
        row = (
            conn.execute(select(ckpt).where(ckpt.c.pipeline == pipeline, ckpt.c.checkpoint_key == key))
            .mappings()
            .one()
        )
        shifted = {
            name: row[name] - EARLIER
            for name in ("created_at", "updated_at", "sealed_at", "durable_at", "committed_at")
            if row[name] is not None
        }
        conn.execute(update(ckpt).where(ckpt.c.id == row["id"]).values(**shifted))
        for tid, at in conn.execute(select(trans.c.id, trans.c.at).where(trans.c.checkpoint_id == row["id"])):
            conn.execute(update(trans).where(trans.c.id == tid).values(at=at - EARLIER))


def add_reprocessed(world) -> None:
    """``KEY`` reprocessed and sealed, ``OPEN_KEY`` reprocessed and left REGISTERED."""
    store, layout = world.store, world.layout
    actor = Actor(name="backfill", dag_id=DAG_A, run_id="backfill-1", task_id="write", try_number=1)
    for key in (KEY, OPEN_KEY):
        _move_back(store, "sales_a", key)
        store.begin_version("sales_a", key, token=f"{DAG_A}/backfill-1#1", actor=actor, reason="fix")
    stage_checkpoint(store, layout, "sales_a", KEY, {"dt=2026-01-01/part-0.csv": b"n\ne\nw\n"}, actor=actor)


@pytest.fixture(scope="module")
def world(airflow_db, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("ui-version-phases")
    with pytest.MonkeyPatch.context() as mp:
        for w in build_world(f"sqlite:///{tmp}/committer.db", tmp, mp):
            add_reprocessed(w)
            yield w


def _get(world, url: str):
    return world.client.get(url, headers=world.headers("admin"))


def test_the_list_counts_the_current_versions_write_from_its_reprocess(world):
    rows = {
        c["checkpoint_key"]: c
        for c in _get(world, "/walsink/api/pipelines/sales_a/checkpoints").json()["checkpoints"]
    }
    sealed = rows[KEY]
    assert (sealed["version"], sealed["state"]) == (2, "DURABLE")
    assert sealed["phases"]["write_s"] < 120, sealed["phases"]  # not two hours
    running = rows[OPEN_KEY]
    assert (running["version"], running["state"], running["phases"]["current"]) == (2, "REGISTERED", "write")
    assert running["phases"]["write_s"] < 120, running["phases"]


def test_the_checkpoint_shows_each_versions_own_phases(world):
    body = _get(world, f"/walsink/api/pipelines/sales_a/checkpoints/{KEY}").json()
    assert body["checkpoint"]["phases"]["write_s"] < 120
    first, second = body["version_phases"]
    assert (first["version"], second["version"]) == (1, 2)
    # Version 1: written, sealed, durable and committed two hours ago, in seconds.
    assert first["committed_at"] is not None and first["total_s"] < 120
    assert first["committed_at"] < second["started_at"]
    # Version 2: from the reprocess to its seal, in seconds; not committed yet.
    assert second["write_s"] < 120 and second["committed_at"] is None and second["current"] == "commit"
    page = _get(world, f"/walsink/pipelines/sales_a/checkpoints/{KEY}").text
    assert 'id="version-phases"' in page and "2 (current)" in page
    # A first version keeps the one-version table.
    plain = _get(world, "/walsink/api/pipelines/sales_a/checkpoints/20260103T000000Z").json()
    assert plain["version_phases"] == []


def test_a_version_begun_now_is_not_uncommitted_for_hours(world):
    """Its first registration was two hours ago, but version 2 began seconds ago."""
    stuck = _get(world, "/walsink/api/checkpoints?not_committed_for=1h").json()["checkpoints"]
    assert OPEN_KEY not in {c["checkpoint_key"] for c in stuck if c["pipeline"] == "sales_a"}
    page = _get(world, "/walsink/api/pipelines/sales_a/checkpoints?not_committed_for=1h").json()
    assert OPEN_KEY not in {c["checkpoint_key"] for c in page["checkpoints"]}
    every = _get(world, "/walsink/api/checkpoints").json()["checkpoints"]
    assert ("sales_a", OPEN_KEY) in {(c["pipeline"], c["checkpoint_key"]) for c in every}
