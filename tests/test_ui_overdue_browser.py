"""Issue 37: the walsink UI marks a checkpoint past its pipeline's commit deadline and not
COMMITTED as overdue, in headless Chromium (1,280x800).

``payments`` has three checkpoints, recorded as walsink's deadline callback records them
(:meth:`CommitterStore.record_deadline_miss`, the call Airflow's deadline alert makes through
``operators/commit_deadline.py``; the scheduler and triggerer side is
``tests/test_e2e_commit_deadline.py``): ``p1`` SEALED with its deadline missed (overdue),
``p2`` whose deadline was missed and which committed since (not overdue), ``p3`` SEALED with no
deadline missed (not overdue). The pipeline page and the checkpoint page show the mark; the
JSON API says the same. Screenshots go to ``test-artifacts/ui-overdue/``.
"""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import pytest
from test_ui_layout import browser  # noqa: F401 - the shared Chromium fixture
from ui_fixtures import DAG_A, build_world, serve_on_loopback

from airflow_provider_walsink.core.commit import CheckpointCommitter
from airflow_provider_walsink.core.store import Actor
from airflow_provider_walsink.core.store.store import utcnow
from airflow_provider_walsink.core.targets import FilePublisher
from tests.helpers import stage_checkpoint

pytestmark = [pytest.mark.airflow, pytest.mark.browser]

ARTIFACTS = Path(__file__).resolve().parent.parent / "test-artifacts" / "ui-overdue"
SCREEN = {"width": 1280, "height": 800}
PIPELINE = "payments"
ACTOR = Actor(name="w", dag_id=DAG_A, run_id="run-p", task_id="write", try_number=1)
ALERT = Actor(name="airflow deadline alert@run-p", dag_id=DAG_A, run_id="run-p")
RED = "rgb(183, 28, 28)"  # --overdue


@pytest.fixture(scope="module")
def served(airflow_db, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("ui-overdue")
    with pytest.MonkeyPatch.context() as mp:
        for world in build_world(f"sqlite:///{tmp}/committer.db", tmp, mp):
            store, layout = world.store, world.layout
            due = utcnow() - timedelta(minutes=5)
            for key in ("p1", "p2", "p3"):
                stage_checkpoint(
                    store, layout, PIPELINE, key, {f"dt={key}/a.csv": b"1\n"}, durable=False, actor=ACTOR
                )
            for key in ("p1", "p2"):
                store.record_deadline_miss(
                    PIPELINE, key, due_at=due, actor=ALERT, detail="commit deadline missed: due ..., SEALED"
                )
            store.mark_durable(PIPELINE, "p2", attempt=1, actor=ACTOR)
            publisher = FilePublisher(tmp / "payments-target", "overwrite", layout=layout)
            committer = CheckpointCommitter(store, layout, publisher, mode="overwrite")
            committer.commit(PIPELINE, "p2", actor=ACTOR)
            with serve_on_loopback(world.app) as url:
                yield world, url


@pytest.fixture
def page(served, browser):  # noqa: F811
    world, base = served
    context = browser.new_context(viewport=SCREEN)
    context.add_cookies([{"name": "_token", "value": world.tokens["admin"], "url": base}])
    try:
        yield context.new_page()
    finally:
        context.close()


def test_a_checkpoint_past_its_commit_deadline_and_not_committed_is_marked_overdue(served, page):
    world, base = served
    page.goto(f"{base}/walsink/pipelines/{PIPELINE}")

    def row(key: str):
        return page.locator("table.checkpoints tbody tr", has=page.locator("a.ckpt", has_text=key))

    badge = row("p1").locator(".badge.overdue")
    assert badge.inner_text() == "OVERDUE"
    assert badge.evaluate("e => getComputedStyle(e).backgroundColor") == RED
    assert "not COMMITTED" in badge.get_attribute("title")
    # Missed but committed since, and never missed: no mark.
    assert row("p2").locator(".badge.overdue").count() == 0
    assert row("p2").locator(".badge.s-committed").count() == 1
    assert row("p3").locator(".badge.overdue").count() == 0
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "pipeline.png"), full_page=True)

    page.goto(f"{base}/walsink/pipelines/{PIPELINE}/checkpoints/p1")
    assert page.locator("h1 .badge.overdue").inner_text() == "OVERDUE"
    assert "passed, not committed" in page.locator("#commit-deadline").inner_text()
    # The miss is in the checkpoint's history, by the deadline alert.
    assert "commit deadline missed" in page.locator("body").inner_text()
    page.screenshot(path=str(ARTIFACTS / "checkpoint.png"), full_page=True)

    # The JSON API carries the same mark.
    api = world.client.get(f"/walsink/api/pipelines/{PIPELINE}/checkpoints", headers=world.headers("admin"))
    marks = {c["checkpoint_key"]: c["overdue"] for c in api.json()["checkpoints"]}
    assert marks == {"p1": True, "p2": False, "p3": False}
