"""The commit-state pages show a reprocessed checkpoint's version, its superseded versions and
the re-runs that were skipped (in-process on Airflow's real api app, as tests/test_ui_api.py)."""

from __future__ import annotations

import pytest
from ui_fixtures import DAG_A, build_world

from airflow_provider_walsink.core.commit import CheckpointCommitter
from airflow_provider_walsink.core.store.store import Actor
from airflow_provider_walsink.core.targets import FilePublisher
from tests.helpers import stage_checkpoint

pytestmark = pytest.mark.airflow

KEY, SKIPPED_KEY = "20260101T000000Z", "20260102T000000Z"


@pytest.fixture(scope="module")
def world(airflow_db, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("ui-reprocess")
    with pytest.MonkeyPatch.context() as mp:
        for w in build_world(f"sqlite:///{tmp}/committer.db", tmp, mp):
            store, layout = w.store, w.layout
            actor = Actor(name="backfill", dag_id=DAG_A, run_id="backfill-1", task_id="write", try_number=2)
            v1 = store.require("sales_a", KEY)
            store.begin_version(
                "sales_a", KEY, token=f"{DAG_A}/backfill-1#1", actor=actor, reason="fixed job"
            )
            stage_checkpoint(
                store, layout, "sales_a", KEY, {"dt=2026-01-01/part-0.csv": b"n\ne\nw\n"}, actor=actor
            )
            CheckpointCommitter(
                store, layout, FilePublisher(tmp / "target", "overwrite", layout=layout), mode="overwrite"
            ).commit("sales_a", KEY, actor=actor)
            for run in ("backfill-2", "backfill-3"):
                store.record_event(
                    "sales_a",
                    SKIPPED_KEY,
                    actor=Actor(name="w", dag_id=DAG_A, run_id=run, task_id="write", try_number=2),
                    detail="write skipped: the checkpoint is already COMMITTED (the pipeline's reprocess policy is 'skip')",
                )
            w.v1 = v1
            yield w


def test_reprocessed_checkpoint_lists_its_superseded_version(world):
    body = world.client.get(
        f"/walsink/api/pipelines/sales_a/checkpoints/{KEY}", headers=world.headers("admin")
    ).json()
    c = body["checkpoint"]
    assert (c["state"], c["version"], c["supersedes_attempt_id"]) == (
        "COMMITTED",
        2,
        world.v1.sealed_attempt_id,
    )
    [old] = body["versions"]
    assert (old["version"], old["state"], old["attempt_id"]) == (1, "SUPERSEDED", world.v1.sealed_attempt_id)
    assert old["superseded_by_attempt_id"] == c["sealed_attempt_id"] and old["rows"] == world.v1.rows

    page = world.client.get(
        f"/walsink/pipelines/sales_a/checkpoints/{KEY}", headers=world.headers("admin")
    ).text
    assert 'id="version-badge">version 2<' in page
    assert 'id="versions"' in page and "s-superseded" in page and world.v1.sealed_attempt_id in page


def test_skipped_reruns_get_a_badge(world):
    h = world.headers("admin")
    body = world.client.get(f"/walsink/api/pipelines/sales_a/checkpoints/{SKIPPED_KEY}", headers=h).json()
    assert body["skipped_reruns"] == 2 and body["versions"] == []
    page = world.client.get(f"/walsink/pipelines/sales_a/checkpoints/{SKIPPED_KEY}", headers=h).text
    assert "2 re-runs skipped" in page
    # A checkpoint never re-run has neither badge.
    other = world.client.get("/walsink/pipelines/sales_a/checkpoints/20260103T000000Z", headers=h).text
    assert "skipped-badge" not in other and "version-badge" not in other
