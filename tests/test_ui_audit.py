"""The audit gate in the commit-state API and pages (in-process on Airflow's real api app)
and in the ``walsink`` command: REJECTED with its failed checks, AUDITED, counts per state.

The browser test of a REJECTED checkpoint (headless Chromium on the real stack) is in
``tests/test_ui_browser.py``.
"""

from __future__ import annotations

import json
import re

import pyarrow as pa
import pytest
from ui_fixtures import DAG_A, XSS, build_world

from airflow_provider_walsink.core.commit import CheckpointCommitter
from airflow_provider_walsink.core.commit.audit import (
    CallableCheck,
    NotNullCheck,
    RowCountCheck,
    audit_checkpoint,
)
from airflow_provider_walsink.core.store import Actor
from airflow_provider_walsink.core.targets import FilePublisher
from tests.helpers import stage_tables
from tests.test_cli import walsink

pytestmark = pytest.mark.airflow

PIPELINE = "audited"
REJECTED_KEY, AUDITED_KEY, REWRITTEN_KEY = "20260201T000000Z", "20260202T000000Z", "20260203T000000Z"
APPROVED_KEY = "20260204T000000Z"
#: Rejected by the audit, approved by a person, then committed by the commit task.
COMMITTED_KEY = "20260205T000000Z"
REASON = "not_null(user_id): 3 of 1,000 rows are NULL"
COMMITTER = Actor(name="c", dag_id=DAG_A, run_id="audit-run", task_id="events.commit", try_number=1)


def _table(nulls: int) -> pa.Table:
    return pa.table({"id": list(range(1000)), "user_id": [None] * nulls + list(range(nulls, 1000))})


def _checks():
    return [RowCountCheck(min_rows=1), NotNullCheck("user_id"), CallableCheck(lambda s: True, name=f"x{XSS}")]


@pytest.fixture(scope="module")
def world(airflow_db, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("ui-audit")
    with pytest.MonkeyPatch.context() as mp:
        for w in build_world(f"sqlite:///{tmp}/committer.db", tmp, mp):
            writer = Actor(name="w", dag_id=DAG_A, run_id="audit-run", task_id="events.write", try_number=1)
            auditor = Actor(name="a", dag_id=DAG_A, run_id="audit-run", task_id="events.audit", try_number=1)
            approver = Actor(
                name="ann via approval",
                dag_id=DAG_A,
                run_id="audit-run",
                task_id="events.approval",
                try_number=1,
            )
            keys = (
                (REJECTED_KEY, 3),
                (AUDITED_KEY, 0),
                (REWRITTEN_KEY, 3),
                (APPROVED_KEY, 3),
                (COMMITTED_KEY, 3),
            )
            for key, nulls in keys:
                tables = {f"dt={key[:4]}-{key[4:6]}-{key[6:8]}/part-0.parquet": _table(nulls)}
                stage_tables(
                    w.store, w.layout, PIPELINE, key, tables, partition_columns=("dt",), actor=writer
                )
                audit_checkpoint(w.store, w.layout, PIPELINE, key, _checks(), actor=auditor)
            # A fixed job started a new attempt of a rejected checkpoint: the old verdict is history.
            w.store.start_attempt(PIPELINE, REWRITTEN_KEY, actor=writer)
            # A person published a rejected one anyway (the HITL step of issue 37).
            sealed = w.store.require(PIPELINE, APPROVED_KEY).sealed_attempt_id
            w.store.approve_rejected(PIPELINE, APPROVED_KEY, attempt_id=sealed, approver=f"ann{XSS}",
                                     reason="known partner gap", actor=auditor)  # fmt: skip
            # Rejected, approved in the HITL step, then published by the commit task (its try 1).
            sealed = w.store.require(PIPELINE, COMMITTED_KEY).sealed_attempt_id
            w.store.approve_rejected(PIPELINE, COMMITTED_KEY, attempt_id=sealed, approver="ann",
                                     reason="known partner gap", actor=approver)  # fmt: skip
            publisher = FilePublisher(tmp / "audited-target", "overwrite", layout=w.layout)
            CheckpointCommitter(w.store, w.layout, publisher, mode="overwrite", require_audit=True).commit(
                PIPELINE, COMMITTED_KEY, actor=COMMITTER
            )
            # The approval step asks a person about the REJECTED one (as WalAuditApprovalOperator
            # does before it parks), and Airflow has that task awaiting input.
            rejected = w.store.require(PIPELINE, REJECTED_KEY).sealed_attempt_id
            assert w.store.ask_decision(PIPELINE, REJECTED_KEY, attempt_id=rejected, actor=approver)
            set_task_state(DAG_A, "audit-run", approver.task_id, "awaiting_input")
            yield w


def set_task_state(dag_id: str, run_id: str, task_id: str, state: str) -> None:
    """The task instance in Airflow's metadata database (its run created if missing) in ``state``."""
    from airflow.models.dagrun import DagRun
    from airflow.models.taskinstance import TaskInstance
    from airflow.utils.session import create_session
    from sqlalchemy import insert, select, update

    with create_session() as session:
        if session.scalar(select(DagRun.id).where(DagRun.dag_id == dag_id, DagRun.run_id == run_id)) is None:
            session.add(DagRun(dag_id=dag_id, run_id=run_id, run_type="manual", state="running"))
            session.flush()
        where = (
            TaskInstance.dag_id == dag_id,
            TaskInstance.run_id == run_id,
            TaskInstance.task_id == task_id,
        )
        if session.execute(update(TaskInstance).where(*where).values(state=state)).rowcount == 0:
            session.execute(
                insert(TaskInstance).values(
                    dag_id=dag_id,
                    run_id=run_id,
                    task_id=task_id,
                    state=state,
                    pool="default_pool",
                    try_number=1,
                )
            )


def _get(world, path):
    response = world.client.get(path, headers=world.headers("admin"))
    assert response.status_code == 200, response.text
    return response


def test_the_pipeline_counts_rejected_and_names_it_as_the_last_error(world):
    body = _get(world, f"/walsink/api/pipelines/{PIPELINE}").json()
    assert (
        body["counts"]["REJECTED"] == 1 and body["counts"]["AUDITED"] == 2 and body["counts"]["WRITING"] == 1
    )
    assert body["last_error"]["state"] == "REJECTED" and body["last_error"]["error"] == REASON
    html = _get(world, f"/walsink/pipelines/{PIPELINE}").text
    assert re.search(r'<span class="swatch s-rejected"></span>REJECTED <b>1</b>', html)
    assert 'class="cell s-rejected"' in html and 'class="cell s-audited"' in html


def test_the_checkpoint_api_gives_the_verdict_and_every_check(world):
    body = _get(world, f"/walsink/api/pipelines/{PIPELINE}/checkpoints/{REJECTED_KEY}").json()
    assert body["checkpoint"]["state"] == "REJECTED" and body["checkpoint"]["error"] == REASON
    assert body["checkpoint"]["phases"]["current"] is None  # not "committing" forever
    audit = body["audit"]
    assert audit["verdict"] == "REJECTED" and audit["task_id"] == "events.audit"
    assert [(c["check"], c["passed"]) for c in audit["checks"]] == [
        ("row_count(min=1)", True),
        ("not_null(user_id)", False),
        (f"x{XSS}", True),
    ]
    assert audit["checks"][1]["reason"] == "3 of 1,000 rows are NULL"
    assert audit["summary"] == f"1 of 3 audit checks failed: {REASON}"
    verdict = [t for t in body["history"] if t["to_state"] == "REJECTED"][0]
    assert verdict["audit"]["checks"] == audit["checks"]  # the structured results live in the history
    assert body["committables"]["status"] == "available"  # the rejected data stays for inspection

    passed = _get(world, f"/walsink/api/pipelines/{PIPELINE}/checkpoints/{AUDITED_KEY}").json()
    assert passed["audit"]["verdict"] == "AUDITED" and passed["checkpoint"]["error"] is None
    assert all(c["passed"] for c in passed["audit"]["checks"])
    # A verdict on an earlier attempt is not shown as the current attempt's.
    rewritten = _get(world, f"/walsink/api/pipelines/{PIPELINE}/checkpoints/{REWRITTEN_KEY}").json()
    assert rewritten["audit"] is None and rewritten["checkpoint"]["state"] == "WRITING"
    assert "REJECTED" in [t["to_state"] for t in rewritten["history"]]
    assert audit["approved"] is None and passed["audit"]["approved"] is None


def test_a_rejected_checkpoint_a_person_approved_shows_the_rejection_and_who_published_it(world):
    body = _get(world, f"/walsink/api/pipelines/{PIPELINE}/checkpoints/{APPROVED_KEY}").json()
    assert body["checkpoint"]["state"] == "AUDITED"
    assert body["audit"]["verdict"] == "REJECTED"  # the checks' verdict stays what it was
    assert body["audit"]["approved"].startswith(f"approved by ann{XSS}: known partner gap (published despite")
    html = _get(world, f"/walsink/pipelines/{PIPELINE}/checkpoints/{APPROVED_KEY}").text
    line = re.search(r'<p class="audit-approved" id="audit-approved">(.*?)</p>', html, re.S)
    assert line and line.group(1).startswith("Published anyway: approved by ann&lt;script&gt;")
    assert XSS not in html


def test_an_approved_committed_checkpoint_links_the_commit_tasks_log_not_the_rejection(world):
    """Rejected by the audit, approved by a person, committed: the page's task log is the commit
    task try that committed it, not the audit try whose verdict a person overruled."""
    from airflow_provider_walsink.ui.links import task_log_link

    body = _get(world, f"/walsink/api/pipelines/{PIPELINE}/checkpoints/{COMMITTED_KEY}").json()
    assert body["checkpoint"]["state"] == "COMMITTED"
    assert [t["to_state"] for t in body["history"] if t["from_state"] != t["to_state"]][-4:] == [
        "REJECTED", "AUDITED", "COMMITTING", "COMMITTED",
    ]  # fmt: skip
    expected = task_log_link(DAG_A, "audit-run", "events.commit", 1)
    log = body["log"]
    assert (log["task_id"], log["try_number"], log["state"], log["url"]) == (
        "events.commit", 1, "COMMITTED", expected,
    )  # fmt: skip
    html = _get(world, f"/walsink/pipelines/{PIPELINE}/checkpoints/{COMMITTED_KEY}").text
    link = re.search(r'<a class="af-log" id="task-log" href="([^"]*)">([^<]*)</a>', html)
    assert (
        link and link.group(1) == expected.replace("&", "&amp;") and link.group(2).startswith("events.commit")
    )
    redirect = world.client.get(
        f"/walsink/pipelines/{PIPELINE}/checkpoints/{COMMITTED_KEY}/log",
        headers=world.headers("admin"),
        follow_redirects=False,
    )
    assert redirect.status_code == 303 and redirect.headers["location"] == expected
    # A checkpoint still REJECTED keeps the audit try's log: that verdict is why it is there.
    rejected = _get(world, f"/walsink/api/pipelines/{PIPELINE}/checkpoints/{REJECTED_KEY}").json()["log"]
    assert (rejected["task_id"], rejected["state"]) == ("events.audit", "REJECTED")


def test_a_checkpoint_waiting_for_a_persons_decision_says_so_and_links_required_actions(world):
    """The approval step asked about the REJECTED checkpoint and Airflow has it awaiting input:
    the page says so and links the run's Required actions; once Airflow's task no longer waits
    (answered, timed out, failed), it does not."""
    api = f"/walsink/api/pipelines/{PIPELINE}/checkpoints/{REJECTED_KEY}"
    page = f"/walsink/pipelines/{PIPELINE}/checkpoints/{REJECTED_KEY}"
    decision = _get(world, api).json()["decision"]
    assert decision is not None
    assert decision["required_actions"] == f"/dags/{DAG_A}/runs/audit-run/required_actions"
    assert (decision["task_id"], decision["try_number"]) == ("events.approval", 1)
    assert decision["question"].startswith("waiting for a person's decision")
    html = _get(world, page).text
    assert '<span class="badge decision" id="decision-badge"' in html
    shown = re.search(r'<dd class="decision" id="decision">(.*?)</dd>', html, re.S)
    assert shown and "Waiting for a person's decision since" in shown.group(1)
    assert f'id="required-actions" href="/dags/{DAG_A}/runs/audit-run/required_actions"' in shown.group(1)
    assert "events.approval" in shown.group(1)
    # Its Error row still gives the audit's reason.
    assert re.search(r'<dd class="error failure" id="error">(.*?)</dd>', html, re.S).group(1) == REASON
    # No question on the others: none asked, or decided (approved, then committed).
    for key in (AUDITED_KEY, APPROVED_KEY, COMMITTED_KEY):
        assert _get(world, f"/walsink/api/pipelines/{PIPELINE}/checkpoints/{key}").json()["decision"] is None
    # Only a REJECTED checkpoint with the attempt shown is asked about.
    audited = world.store.require(PIPELINE, AUDITED_KEY).sealed_attempt_id
    assert not world.store.ask_decision(PIPELINE, AUDITED_KEY, attempt_id=audited, actor=COMMITTER)
    assert not world.store.ask_decision(PIPELINE, REJECTED_KEY, attempt_id="another", actor=COMMITTER)
    try:
        set_task_state(DAG_A, "audit-run", "events.approval", "failed")  # e.g. answered without a reason
        assert _get(world, api).json()["decision"] is None
        assert 'id="decision' not in _get(world, page).text
    finally:
        set_task_state(DAG_A, "audit-run", "events.approval", "awaiting_input")


def test_the_checkpoint_page_shows_rejected_with_the_failed_check(world):
    html = _get(world, f"/walsink/pipelines/{PIPELINE}/checkpoints/{REJECTED_KEY}").text
    assert '<span class="badge s-rejected">REJECTED</span>' in html
    error = re.search(r'<dd class="error failure" id="error">(.*?)</dd>', html, re.S)
    assert error and error.group(1) == REASON
    audit = html[html.index('id="audit"') : html.index("</table>", html.index('id="audit"'))]
    failing = re.findall(
        r'<tr class="failure"><td class="path">(.*?)</td><td>FAILED</td><td>(.*?)</td>', audit
    )
    assert failing == [("not_null(user_id)", "3 of 1,000 rows are NULL")]
    assert XSS not in html and "&lt;script&gt;" in html  # a check's name is escaped like every value
    history = html[html.index('class="grid history"') :]
    assert "1 of 3 audit checks failed" in history and '{"audit"' not in history  # summary, not JSON
    css = _get(world, "/walsink/static/walsink.css").text
    assert re.search(r"\.s-rejected \{ background: var\(--rejected\); \}", css)
    assert re.search(r"\.s-audited \{ background: var\(--audited\); \}", css)
    colours = dict(re.findall(r"--(\w+): (#[0-9a-f]{6})", css))
    assert colours["rejected"] not in (colours["failed"], colours["aborted"])


def test_the_cli_lists_rejected_checkpoints_with_the_reason(world):
    url = world.store.engine.url.render_as_string(hide_password=False)
    status = walsink("--url", url, "status", "--pipeline", PIPELINE)
    assert status.returncode == 0, status.stderr
    assert "REJECTED 1" in status.stdout.splitlines()[0]
    line = next(x for x in status.stdout.splitlines() if REJECTED_KEY in x)
    assert "REJECTED" in line and REASON in line
    listed = walsink("--url", url, "checkpoints", "--state", "REJECTED", "--json")
    assert listed.returncode == 0, listed.stderr
    rows = json.loads(listed.stdout)["checkpoints"]
    assert [(r["key"], r["state"], r["error"]) for r in rows] == [(REJECTED_KEY, "REJECTED", REASON)]
