"""The commit-state UI in headless Chromium against a real Airflow stack.

The session's ``airflow_stack`` (scheduler, dag-processor, triggerer, api-server
with the walsink plugin loaded from the installed package) runs the
``walsink_daily_overwrite`` example; if no run of it has committed yet (this
module run alone), one backfill day is run here with real Spark. Then a
browser logs in through Airflow's login form and walks: Browse → Commit
state, the pipeline's timeline, a checkpoint's detail, the commit task's
"Commit state" extra link, and the DAG and DAG-run tabs. Screenshots go to
``test-artifacts/ui/``.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from airflow_provider_walsink.committer.store import CommitterStore

pytestmark = [pytest.mark.e2e, pytest.mark.browser, pytest.mark.spark, pytest.mark.slow]

REPO = Path(__file__).resolve().parent.parent
ARTIFACTS = REPO / "test-artifacts" / "ui"
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
DAG_ID = "walsink_daily_overwrite"
PIPELINE = "daily_events"
#: A day the backfill test (tests/test_e2e_backfill.py) does not use.
OWN_DAY = "2026-01-20"
TIMEOUT_MS = 30_000


@pytest.fixture(scope="module")
def committed_run(airflow_stack) -> dict:
    """A run of the example whose checkpoint is COMMITTED: reuse one, else run one day."""
    stack = airflow_stack
    store = CommitterStore.from_url(f"sqlite:///{stack.home}/walsink/committer.db")
    try:
        done = [c for c in store.checkpoints(PIPELINE, states=["COMMITTED"], limit=50) if c.run_id]
        if not done:
            stack.wait_for_dag(DAG_ID)
            stack.unpause(DAG_ID)
            runs = stack.wait_for_backfill(stack.backfill(DAG_ID, OWN_DAY, OWN_DAY), timeout=900)
            assert [r["state"] for r in runs] == ["success"], runs
            done = [c for c in store.checkpoints(PIPELINE, states=["COMMITTED"], limit=50) if c.run_id]
        record = done[0]
    finally:
        store.dispose()
    tasks = {ti["operator"]: ti["task_id"] for ti in stack.task_instances(DAG_ID, record.run_id)}
    return {"run_id": record.run_id, "key": record.checkpoint_key, "commit_task": tasks["WalCommitOperator"]}


@pytest.fixture(scope="module")
def browser():
    if not os.path.exists(CHROMIUM):
        from tests.helpers import missing_prerequisite

        missing_prerequisite(
            f"{CHROMIUM} is missing: apt-get install chromium chromium-driver (scripts/setup.sh does)"
        )
    from playwright.sync_api import sync_playwright

    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as p:
        instance = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        try:
            yield instance
        finally:
            instance.close()


def shot(page, name: str) -> None:
    page.screenshot(path=str(ARTIFACTS / f"{name}.png"), full_page=False)


def test_commit_state_in_the_airflow_ui(airflow_stack, committed_run, browser):
    from playwright.sync_api import expect

    stack = airflow_stack
    admin = stack.users["admin"]
    key, run_id = committed_run["key"], committed_run["run_id"]
    context = browser.new_context(viewport={"width": 1440, "height": 900})
    context.set_default_timeout(TIMEOUT_MS)
    expect.set_options(timeout=TIMEOUT_MS)
    page = context.new_page()
    try:
        # Log in through Airflow's own form.
        page.goto(stack.base_url + "/")
        expect(page).to_have_url(re.compile(r"/auth/login"))
        page.fill("input[name=username]", admin.name)
        page.fill("input[name=password]", admin.password)
        page.get_by_role("button", name="Sign in").click()
        expect(page.get_by_role("button", name="Browse")).to_be_visible()

        # Browse → Commit state: the plugin's overview in Airflow's iframe.
        page.get_by_role("button", name="Browse").click()
        page.get_by_role("menuitem", name="Commit state").click()
        expect(page).to_have_url(re.compile(r"/plugin/walsink-commit-state$"))
        frame = page.frame_locator("iframe")
        expect(frame.get_by_role("heading", name="Pipelines")).to_be_visible()
        pipeline_link = frame.get_by_role("link", name=PIPELINE, exact=True)
        expect(pipeline_link).to_be_visible()
        shot(page, "1-overview")

        # The pipeline: timeline cells coloured by state, the committed checkpoint among them.
        pipeline_link.click()
        expect(frame.get_by_role("heading", name=PIPELINE)).to_be_visible()
        expect(frame.locator(".timeline .cell.s-committed").first).to_be_visible()
        expect(frame.get_by_role("link", name=key, exact=True)).to_be_visible()
        shot(page, "2-pipeline")

        # A checkpoint's detail: state, phases, history, and what happened to its staging.
        frame.get_by_role("link", name=key, exact=True).click()
        expect(frame.get_by_role("heading", name=re.compile(f"Checkpoint {key}"))).to_be_visible()
        expect(frame.locator("h1 .badge.s-committed")).to_have_text("COMMITTED")
        history = frame.locator("table.history")
        expect(history).to_contain_text("REGISTERED")
        expect(history).to_contain_text(committed_run["commit_task"])
        expect(frame.locator("#committables-status")).to_contain_text("cleaned")
        shot(page, "3-checkpoint")

        # The commit task's extra link leads to that detail.
        task_url = (
            f"{stack.base_url}/dags/{DAG_ID}/runs/{run_id}/tasks/{committed_run['commit_task']}/details"
        )
        page.goto(task_url)
        link = page.get_by_role("link", name="Commit state")
        expect(link).to_be_visible()
        shot(page, "4-task-extra-link")
        assert "/walsink/link?" in (link.get_attribute("href") or "")
        if link.get_attribute("target") == "_blank":  # Airflow opens other origins in a new tab
            with context.expect_page() as opened:
                link.click()
            detail = opened.value
        else:  # same origin: same tab
            link.click()
            detail = page
        expect(detail).to_have_url(re.compile(rf"/walsink/pipelines/{PIPELINE}/checkpoints/{key}$"))
        expect(detail.locator("h1")).to_contain_text(key)
        expect(detail.locator("h1 .badge")).to_have_text("COMMITTED")
        shot(detail, "5-extra-link-target")
        if detail is not page:
            detail.close()

        # The DAG tab and the DAG-run tab list that DAG's / that run's checkpoints.
        page.goto(f"{stack.base_url}/dags/{DAG_ID}")
        page.get_by_role("link", name="Commit state").click()
        expect(page).to_have_url(re.compile(r"/plugin/walsink-dag-commit-state$"))
        expect(frame.get_by_role("heading", name=re.compile(f"Checkpoints of DAG {DAG_ID}"))).to_be_visible()
        expect(frame.get_by_role("link", name=key, exact=True)).to_be_visible()
        shot(page, "6-dag-tab")

        page.goto(f"{stack.base_url}/dags/{DAG_ID}/runs/{run_id}")
        page.get_by_role("link", name="Commit state").click()
        expect(page).to_have_url(re.compile(r"/plugin/walsink-run-commit-state$"))
        expect(frame.get_by_role("heading", name=re.compile("Checkpoints of run"))).to_contain_text(run_id)
        rows = frame.locator("table.checkpoints tbody tr")
        expect(rows).to_have_count(1)
        expect(rows.first).to_contain_text(key)
        shot(page, "7-run-tab")
    except Exception:
        shot(page, "failure")
        raise
    finally:
        context.close()


def test_logged_out_browser_gets_no_plugin_data(airflow_stack, browser):
    context = browser.new_context()
    try:
        page = context.new_page()
        response = page.goto(f"{airflow_stack.base_url}/walsink/pipelines/{PIPELINE}")
        assert response is not None and response.status == 401
        content = page.content()
        assert "timeline" not in content and "COMMITTED" not in content
        api = page.goto(f"{airflow_stack.base_url}/walsink/api/pipelines")
        assert api is not None and api.status == 401
    finally:
        context.close()
