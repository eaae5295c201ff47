"""The commit-state UI in headless Chromium against a real Airflow stack.

The session's ``airflow_stack`` (scheduler, dag-processor, triggerer, api-server
with the walsink plugin loaded from the installed package) runs the
``walsink_daily_overwrite`` example; if no run of it has committed yet (this
module run alone), one backfill day is run here with real Spark. Then a
browser logs in through Airflow's login form and walks: Browse → Commit
state, the pipeline's timeline, a checkpoint's detail, the commit task's
"Commit state" extra link, Airflow's own run and task pages linked from the
checkpoint, and the DAG and DAG-run tabs, on a 1,280x800 screen, measuring that
every column of the tabs lies inside Airflow's frame. Then the api-server moves
to another port (with another default time zone) and the extra link, stored
when the task ran, still leads to the checkpoint. A viewer and an admin meet
the Abort button (issue 15). Screenshots go to ``test-artifacts/ui/``.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from urllib.parse import quote

import pytest

# Under the name pytest imports that test module as (tests/ on sys.path, as ui_fixtures), so its
# once-per-session runs are shared with it, not run twice.
import test_e2e_audit_approval as approval

from airflow_provider_walsink.core.store.store import CommitterStore

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
SCREEN = {"width": 1280, "height": 800}

#: Runs inside the plugin's frame: its width, the document's, and every checkpoint cell's box.
MEASURE = """() => {
  const width = document.documentElement.clientWidth;
  const cells = [...document.querySelectorAll('table.checkpoints th, table.checkpoints td')].map(e => {
    const r = e.getBoundingClientRect();
    return {text: e.innerText.trim().slice(0, 40), left: r.left, right: r.right};
  });
  return {width, scrollWidth: document.documentElement.scrollWidth, cells,
          headers: [...document.querySelectorAll('table.checkpoints th')].map(e => e.innerText.trim())};
}"""


def assert_fits(page, url_part: str) -> None:
    """Every column of the tab's checkpoint table (the error included) lies inside the frame."""
    frame = next(f for f in page.frames if url_part in f.url)
    m = frame.evaluate(MEASURE)
    assert "Error" in m["headers"], m["headers"]
    assert m["scrollWidth"] <= m["width"], f"the tab scrolls sideways: {m['scrollWidth']} > {m['width']}"
    outside = [c for c in m["cells"] if c["left"] < 0 or c["right"] > m["width"] + 0.5]
    assert not outside, f"cells outside the {m['width']} px frame: {outside[:5]}"


def move_api_server(stack, port: int, **settings: str) -> None:
    """Restart the stack's api-server on ``port`` (and with ``settings``, e.g. a time zone),
    as an operator moving Airflow would; the other components keep running."""
    stack.stop_component("api-server")
    stack.port = port
    stack.base_url = f"http://127.0.0.1:{port}"
    stack.env.update(
        {
            "AIRFLOW__API__PORT": str(port),
            "AIRFLOW__API__BASE_URL": stack.base_url + "/",
            "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"{stack.base_url}/execution/",
            **settings,
        }
    )
    for client in stack._clients.values():
        client.close()
    stack._clients.clear()
    stack.start_component("api-server")
    stack._wait_http_ready(240)


def login(page, stack) -> None:
    from playwright.sync_api import expect

    admin = stack.users["admin"]
    page.goto(stack.base_url + "/")
    expect(page).to_have_url(re.compile(r"/auth/login"))
    page.fill("input[name=username]", admin.name)
    page.fill("input[name=password]", admin.password)
    page.get_by_role("button", name="Sign in").click()
    expect(page.get_by_role("button", name="Browse")).to_be_visible()


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
    key, run_id = committed_run["key"], committed_run["run_id"]
    context = browser.new_context(viewport=SCREEN)
    context.set_default_timeout(TIMEOUT_MS)
    expect.set_options(timeout=TIMEOUT_MS)
    page = context.new_page()
    try:
        # Log in through Airflow's own form.
        login(page, stack)

        # Browse → Commit state: the plugin's overview in Airflow's iframe.
        page.get_by_role("button", name="Browse").click()
        page.get_by_role("menuitem", name="Commit state").click()
        # Airflow 3.3 mirrors a nav view's iframe location into the page URL once the
        # iframe has loaded (…/plugin/<route>/walsink/…), so either form may be seen here.
        expect(page).to_have_url(re.compile(r"/plugin/walsink-commit-state(/walsink/)?$"))
        frame = page.frame_locator("iframe")
        expect(frame.get_by_role("heading", name="Pipelines")).to_be_visible()
        pipeline_link = frame.get_by_role("link", name=PIPELINE, exact=True)
        expect(pipeline_link).to_be_visible()
        shot(page, "1-overview")

        # The pipeline: timeline cells coloured by state, the committed checkpoint among them.
        pipeline_link.click()
        expect(frame.get_by_role("heading", name=PIPELINE)).to_be_visible()
        # The address bar follows the iframe, and that address opens the same page again:
        # a pipeline's commit state can be shared as a link.
        expect(page).to_have_url(re.compile(rf"/plugin/walsink-commit-state/walsink/pipelines/{PIPELINE}$"))
        page.reload()
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

        # The checkpoint links to Airflow's own run and task pages, and they resolve.
        commit_task = committed_run["commit_task"]
        detail.locator("a.af-run").click()
        run_path = f"/dags/{DAG_ID}/runs/{quote(run_id, safe='')}"  # one escaped path segment
        expect(detail).to_have_url(re.compile(re.escape(run_path) + "$"))
        expect(detail.get_by_text(run_id).first).to_be_visible()
        detail.go_back()
        detail.locator("a.af-task", has_text=commit_task).first.click()
        expect(detail).to_have_url(re.compile(re.escape(f"{run_path}/tasks/{commit_task}") + "$"))
        expect(detail.get_by_text(commit_task).first).to_be_visible()
        shot(detail, "5b-airflow-task-page")
        if detail is not page:
            detail.close()

        # The DAG tab and the DAG-run tab list that DAG's / that run's checkpoints.
        page.goto(f"{stack.base_url}/dags/{DAG_ID}")
        page.get_by_role("link", name="Commit state").click()
        expect(page).to_have_url(re.compile(r"/plugin/walsink-dag-commit-state$"))
        expect(frame.get_by_role("heading", name=re.compile(f"Checkpoints of DAG {DAG_ID}"))).to_be_visible()
        expect(frame.get_by_role("link", name=key, exact=True)).to_be_visible()
        assert_fits(page, f"/walsink/dags/{DAG_ID}")
        shot(page, "6-dag-tab")

        page.goto(f"{stack.base_url}/dags/{DAG_ID}/runs/{run_id}")
        page.get_by_role("link", name="Commit state").click()
        expect(page).to_have_url(re.compile(r"/plugin/walsink-run-commit-state$"))
        expect(frame.get_by_role("heading", name=re.compile("Checkpoints of run"))).to_contain_text(run_id)
        rows = frame.locator("table.checkpoints tbody tr")
        expect(rows).to_have_count(1)
        expect(rows.first).to_contain_text(key)
        assert_fits(page, "/walsink/dags/")
        shot(page, "7-run-tab")
    except Exception:
        shot(page, "failure")
        raise
    finally:
        context.close()


def test_extra_link_survives_an_api_server_move(airflow_stack, committed_run, browser):
    """The link was stored when the task ran; after the api-server moves to another port
    it still leads to the checkpoint, whose times now follow the new default time zone."""
    from playwright.sync_api import expect

    from tests.airflow_stack import free_port

    stack = airflow_stack
    key, run_id = committed_run["key"], committed_run["run_id"]
    old_port, old_env = stack.port, dict(stack.env)
    move_api_server(stack, free_port(), AIRFLOW__CORE__DEFAULT_TIMEZONE="Asia/Kolkata")
    context = browser.new_context(viewport=SCREEN)
    context.set_default_timeout(TIMEOUT_MS)
    expect.set_options(timeout=TIMEOUT_MS)
    page = context.new_page()
    try:
        assert stack.port != old_port
        login(page, stack)
        task_url = (
            f"{stack.base_url}/dags/{DAG_ID}/runs/{run_id}/tasks/{committed_run['commit_task']}/details"
        )
        page.goto(task_url)
        link = page.get_by_role("link", name="Commit state")
        expect(link).to_be_visible()
        href = link.get_attribute("href") or ""
        assert f":{old_port}" not in href, href
        if link.get_attribute("target") == "_blank":
            with context.expect_page() as opened:
                link.click()
            detail = opened.value
        else:
            link.click()
            detail = page
        expect(detail).to_have_url(
            re.compile(rf"^{re.escape(stack.base_url)}/walsink/pipelines/{PIPELINE}/checkpoints/{key}$")
        )
        expect(detail.locator("h1 .badge")).to_have_text("COMMITTED")
        # Times in the configured zone (India has one offset all year).
        expect(detail.locator("table.phases")).to_contain_text("IST")
        shot(detail, "8-after-port-move")
    except Exception:
        shot(page, "failure-port-move")
        raise
    finally:
        context.close()
        # Put the api-server back where the rest of the session expects it.
        stack.env.clear()
        stack.env.update(old_env)
        move_api_server(stack, old_port)


AUDIT_DAG = "walsink_audit_test"
AUDIT_PIPELINE = "audited_events"
#: An even day: the job stages three rows without a user id, which the DAG's audit rejects.
REJECTED_DAY = "2026-05-04"
REJECTED_REASON = "not_null(user_id): 3 of 1,000 rows are NULL"


@pytest.fixture(scope="module")
def rejected_run(airflow_stack) -> dict:
    """A run of ``tests/dags/walsink_audit_test.py`` whose audit failed, on the stack (real Spark):
    the checkpoint REJECTED, the commit task never ran, nothing published."""
    stack = airflow_stack
    key = REJECTED_DAY.replace("-", "") + "T000000Z"
    target = stack.home / "walsink" / "audit-test" / "target"  # the DAG's default home on the stack
    store = CommitterStore.from_url(f"sqlite:///{stack.home}/walsink/committer.db")
    try:
        record = store.get(AUDIT_PIPELINE, key)
        if record is None:
            stack.wait_for_dag(AUDIT_DAG)
            stack.unpause(AUDIT_DAG)
            runs = stack.wait_for_backfill(stack.backfill(AUDIT_DAG, REJECTED_DAY, REJECTED_DAY), timeout=900)
            assert [r["state"] for r in runs] == ["failed"], runs
            states = stack.task_states(AUDIT_DAG, runs[0]["dag_run_id"])
            assert states == {
                "events.write": "success",
                "events.durable": "success",
                "events.audit": "failed",
                "events.commit": "upstream_failed",
            }, states
            record = store.require(AUDIT_PIPELINE, key)
    finally:
        store.dispose()
    assert record.state.value == "REJECTED" and record.error == REJECTED_REASON
    assert not (target / f"dt={REJECTED_DAY}").exists()  # the target is untouched
    return {"key": key, "run_id": record.run_id}


@pytest.fixture(scope="module")
def approval_runs(airflow_stack) -> dict:
    """The approved and aborted checkpoints of ``tests/test_e2e_audit_approval.py`` (its runs)."""
    return approval.decided_runs(airflow_stack)


def test_rejected_checkpoint_shows_why_in_the_airflow_ui(airflow_stack, rejected_run, approval_runs, browser):
    """Issue 15: an audit that fails leaves the checkpoint REJECTED, and the UI says why.
    Issue 37: a REJECTED checkpoint a person approved (or aborted) in Airflow's HITL step shows
    who decided and why in its history (the runs of ``tests/test_e2e_audit_approval.py``)."""
    from playwright.sync_api import expect

    stack, key = airflow_stack, rejected_run["key"]
    context = browser.new_context(viewport=SCREEN)
    context.set_default_timeout(TIMEOUT_MS)
    expect.set_options(timeout=TIMEOUT_MS)
    page = context.new_page()
    try:
        login(page, stack)
        page.get_by_role("button", name="Browse").click()
        page.get_by_role("menuitem", name="Commit state").click()
        frame = page.frame_locator("iframe")
        # The pipeline list's link (the overview also links it from "Not committed" rows).
        frame.locator("a.pipeline", has_text=AUDIT_PIPELINE).first.click()

        # The pipeline counts the REJECTED checkpoint and names it as the last error.
        expect(frame.get_by_role("heading", name=AUDIT_PIPELINE)).to_be_visible()
        expect(frame.locator(".legend li", has_text="REJECTED")).to_contain_text("REJECTED 1")
        expect(frame.locator(".timeline .cell.s-rejected")).to_have_count(1)
        expect(frame.locator("dl.facts dd.error")).to_contain_text(REJECTED_REASON)
        shot(page, "9-rejected-pipeline")

        # The checkpoint: REJECTED in its badge colour, the reason, and the failed check.
        frame.get_by_role("link", name=key, exact=True).click()
        badge = frame.locator("h1 .badge")
        expect(badge).to_have_text("REJECTED")
        assert badge.evaluate("e => getComputedStyle(e).backgroundColor") == "rgb(173, 20, 87)"  # --rejected
        expect(frame.locator("#error")).to_have_text(REJECTED_REASON)
        failed = frame.locator("#audit tr.failure")
        expect(failed).to_have_count(1)
        expect(failed).to_contain_text("not_null(user_id)")
        expect(failed).to_contain_text("3 of 1,000 rows are NULL")
        expect(frame.locator("#audit")).to_contain_text("amount_in_range")  # the checks that passed too
        expect(frame.locator("#audit-summary")).to_contain_text("1 of 3 audit checks failed")
        expect(frame.locator("table.history")).to_contain_text("events.audit")
        # Nothing was published: no publication, and the staged data is still there to inspect.
        expect(frame.locator("#publication")).to_have_count(0)
        expect(frame.locator("table.committables")).to_be_visible()
        shot(page, "10-rejected-checkpoint")

        # Approved in Airflow: COMMITTED, and the history names the person and the reason.
        base = f"{stack.base_url}/walsink/pipelines/{approval.PIPELINE}/checkpoints"
        page.goto(f"{base}/{approval.key_of(approval.APPROVED_DAY)}")
        expect(page.locator("h1 .badge")).to_have_text("COMMITTED")
        decided = page.locator("table.history tr", has_text="approved by admin (id admin)")
        expect(decided).to_have_count(1)
        expect(decided).to_contain_text(approval.APPROVE_REASON)
        expect(decided).to_contain_text("admin (id admin) via")
        expect(decided).to_contain_text(approval.APPROVAL_TASK)
        # Its task log is the commit task's, not the audit try a person overruled (issue 47).
        expect(page.locator("#task-log")).to_contain_text("events.commit")
        shot(page, "10b-approved-checkpoint")
        # Aborted in Airflow: ABORTED, the person and the reason in the history.
        page.goto(f"{base}/{approval.key_of(approval.ABORTED_DAY)}")
        expect(page.locator("h1 .badge")).to_have_text("ABORTED")
        # (two rows: the abort's start, REJECTED -> REJECTED, and REJECTED -> ABORTED)
        aborted = page.locator("table.history tr", has_text=approval.ABORT_REASON).last
        expect(aborted).to_contain_text("ABORTED")
        expect(aborted).to_contain_text("admin (id admin) via")
    except Exception:
        shot(page, "failure-rejected")
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


def test_abort_in_the_browser(airflow_stack, browser, tmp_path):
    """Issue 15: a viewer sees no Abort button and a POST from a viewer is refused (403); an
    admin aborts a stuck checkpoint with a reason, sees ABORTED and the reason, and the
    action is in Airflow's audit log."""
    import json
    import uuid

    from playwright.sync_api import expect

    from airflow_provider_walsink.core.staging.layout import StagingLayout
    from airflow_provider_walsink.core.store import Actor
    from tests.helpers import stage_checkpoint

    stack = airflow_stack
    stack.wait_for_dag(DAG_ID)
    # A stuck checkpoint (durable, never committed) of a pipeline the example DAG writes.
    pipeline, key = f"ui_abort_{uuid.uuid4().hex[:8]}", "20260301T000000Z"
    writer = Actor(name="write", dag_id=DAG_ID, run_id="manual__ui_abort", task_id="write", try_number=1)
    store = CommitterStore.from_url(f"sqlite:///{stack.home}/walsink/committer.db")
    layout = StagingLayout(stack.home / "walsink" / "staging")  # the api-server's (embedded default)
    store.register(pipeline, key, mode="overwrite", actor=writer, target=str(tmp_path / "target"))
    stage_checkpoint(store, layout, pipeline, key, {"dt=2026-03-01/part-0.csv": b"a\n"}, actor=writer)
    url = f"{stack.base_url}/walsink/pipelines/{pipeline}/checkpoints/{key}"
    reason = "INC-99: the partner resent the day's file"
    viewer = browser.new_context(viewport=SCREEN)
    admin = browser.new_context(viewport=SCREEN)
    for context in (viewer, admin):
        context.set_default_timeout(TIMEOUT_MS)
    expect.set_options(timeout=TIMEOUT_MS)
    page = admin.new_page()
    try:
        # The viewer may read the DAG, so sees the checkpoint, but gets no button, and a POST is refused.
        viewer.add_cookies([stack.login_cookie("viewer")])
        seen = viewer.new_page()
        seen.goto(url)
        expect(seen.locator("h1 .badge")).to_have_text("DURABLE")
        expect(seen.locator("#abort")).to_have_count(0)
        shot(seen, "9-abort-viewer")
        refused = viewer.request.post(
            f"{url}/abort", form={"reason": "not mine", "confirm": "yes", "attempt": "1"}, max_redirects=0
        )
        assert refused.status == 403, refused.text()
        assert store.require(pipeline, key).state.value == "DURABLE"

        # The admin logs in through Airflow's form, opens Abort, gives a reason and confirms.
        login(page, stack)
        page.goto(url)
        expect(page.locator("h1 .badge")).to_have_text("DURABLE")
        page.locator("#abort summary").click()
        page.fill("#abort-reason", reason)
        page.get_by_label(re.compile("I understand")).check()
        shot(page, "10-abort-form")
        page.get_by_role("button", name="Abort checkpoint").click()
        expect(page).to_have_url(url)
        expect(page.locator("h1 .badge")).to_have_text("ABORTED")
        expect(page.locator("#error")).to_have_text(reason)
        row = (
            page.locator("table.history tbody tr")
            .filter(has_text="admin (walsink UI)")
            .filter(has_text=reason)
        )
        expect(row.first).to_be_visible()
        expect(page.locator("#abort")).to_have_count(0)
        shot(page, "11-aborted")
    except Exception:
        shot(page, "failure-abort")
        raise
    finally:
        viewer.close()
        admin.close()
    record = store.require(pipeline, key)
    store.dispose()
    assert record.state.value == "ABORTED" and record.error == reason
    assert not layout.checkpoint_dir(pipeline, key).exists()  # its staging is gone
    logs = stack.get("/api/v2/eventLogs", event="walsink.abort", limit=100)["event_logs"]
    mine = [e for e in logs if json.loads(e["extra"])["checkpoint_key"] == key]
    assert [(e["owner"], e["dag_id"], e["run_id"]) for e in mine] == [("admin", DAG_ID, "manual__ui_abort")]
    assert json.loads(mine[0]["extra"])["reason"] == reason
