"""The UI's Abort action on Airflow's real api app (SimpleAuthManager, tokens from
``POST /auth/token``): only users who may edit the pipeline's DAGs get the button or may
post; the form needs a reason and a confirmation; the result is in the checkpoint's
history and in Airflow's audit log. The browser walk is in ``test_ui_browser.py``.
"""

from __future__ import annotations

import json

import pytest
from ui_fixtures import DAG_A, build_world

pytestmark = pytest.mark.airflow

DURABLE_KEY = "20260104T000000Z"  # sales_a, DURABLE in the fixture
FAILED_KEY = "20260105T000000Z"  # sales_a, FAILED before it was durable
PAGE = f"/walsink/pipelines/sales_a/checkpoints/{DURABLE_KEY}"
REASON = "INC-42: <b>partner</b> sent yesterday's file"


@pytest.fixture(scope="module")
def world(airflow_db, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("ui-abort")
    with pytest.MonkeyPatch.context() as mp:
        yield from build_world(f"sqlite:///{tmp}/committer.db", tmp, mp)


def audit_rows(key: str) -> list:
    from airflow.models.log import Log
    from airflow.utils.session import create_session
    from sqlalchemy import select

    with create_session() as session:
        rows = session.scalars(select(Log).where(Log.event == "walsink.abort")).all()
        return [
            (r.owner, r.dag_id, r.run_id, json.loads(r.extra))
            for r in rows
            if json.loads(r.extra)["checkpoint_key"] == key
        ]


def test_the_button_is_only_for_users_who_may_edit_the_dag(world):
    admin = world.client.get(PAGE, headers={**world.headers("admin"), "Accept": "text/html"})
    assert admin.status_code == 200
    assert (
        'id="abort"' in admin.text
        and f'action="/walsink/pipelines/sales_a/checkpoints/{DURABLE_KEY}/abort"' in admin.text
    )
    assert 'method="post"' in admin.text and 'name="confirm"' in admin.text and 'name="reason"' in admin.text
    # alice may read DAG A (the page answers) but not edit it: no button.
    alice = world.client.get(PAGE, headers=world.headers("alice"))
    assert alice.status_code == 200 and DURABLE_KEY in alice.text
    assert 'id="abort"' not in alice.text and "/abort" not in alice.text
    # Nothing to abort on a committed checkpoint, whoever looks.
    committed = world.client.get(
        "/walsink/pipelines/sales_a/checkpoints/20260101T000000Z", headers=world.headers("admin")
    )
    assert 'id="abort"' not in committed.text


def test_a_viewer_cannot_abort(world):
    alice = world.headers("alice")
    form = world.client.post(
        f"{PAGE}/abort",
        data={"reason": "no", "confirm": "yes", "attempt": "1"},
        headers=alice,
        follow_redirects=False,
    )
    api = world.client.post(
        f"/walsink/api/pipelines/sales_a/checkpoints/{DURABLE_KEY}/abort",
        json={"reason": "no"},
        headers=alice,
    )
    assert form.status_code == 403 and api.status_code == 403
    assert "edit the DAGs that write it" in api.json()["detail"]
    # Not by GET either: there is no route that changes state on a GET.
    assert world.client.get(f"{PAGE}/abort", headers=world.headers("admin")).status_code == 405
    assert world.store.require("sales_a", DURABLE_KEY).state.value == "DURABLE"
    assert audit_rows(DURABLE_KEY) == []


def test_the_form_needs_a_reason_a_confirmation_the_same_site_and_the_attempt_shown(world):
    admin = world.headers("admin")
    cases = [
        ({"reason": REASON, "attempt": "1"}, {}, 422, "confirmation"),
        ({"reason": "  ", "confirm": "yes", "attempt": "1"}, {}, 422, "reason"),
        ({"reason": REASON, "confirm": "yes", "attempt": "7"}, {}, 409, "moved on to attempt 1"),
        (
            {"reason": REASON, "confirm": "yes", "attempt": "1"},
            {"Origin": "https://evil.example"},
            403,
            "cross-site",
        ),
    ]
    for data, extra, code, needle in cases:
        response = world.client.post(
            f"{PAGE}/abort", data=data, headers={**admin, **extra}, follow_redirects=False
        )
        assert response.status_code == code, (data, extra, response.text)
        assert needle in response.text
    assert world.store.require("sales_a", DURABLE_KEY).state.value == "DURABLE"


def test_an_admin_aborts_and_sees_aborted_with_the_reason(world):
    before = world.store.require("sales_a", DURABLE_KEY)
    assert world.layout.checkpoint_dir("sales_a", DURABLE_KEY).exists()
    response = world.client.post(
        f"{PAGE}/abort",
        data={"reason": REASON, "confirm": "yes", "attempt": str(before.attempt)},
        headers={**world.headers("admin"), "Origin": "http://127.0.0.1"},
        follow_redirects=False,
    )
    assert response.status_code == 303 and response.headers["location"] == PAGE
    page = world.client.get(PAGE, headers=world.headers("admin")).text
    assert 'class="badge s-aborted">ABORTED</span></h1>' in page.replace("\n", "")
    escaped = "INC-42: &lt;b&gt;partner&lt;/b&gt; sent yesterday&#39;s file"
    assert page.count(escaped) >= 2  # the error line and the history row
    assert 'id="abort"' not in page  # nothing left to abort
    record = world.store.require("sales_a", DURABLE_KEY)
    assert record.state.value == "ABORTED" and record.error == REASON
    history = world.store.history("sales_a", DURABLE_KEY)
    aborted = [h for h in history if h.to_state == "ABORTED" and h.from_state != "ABORTED"]
    assert [(h.from_state, h.actor, h.detail) for h in aborted] == [("DURABLE", "admin (walsink UI)", REASON)]
    assert "staging removed: sales_a/20260104T000000Z/attempt-1-" in history[-1].detail
    assert not world.layout.checkpoint_dir("sales_a", DURABLE_KEY).exists()  # its staging is gone
    [(owner, dag_id, run_id, extra)] = audit_rows(DURABLE_KEY)
    assert (owner, dag_id, run_id) == ("admin", DAG_A, "run-3")
    assert extra["reason"] == REASON and extra["state"] == "ABORTED" and extra["source"] == "walsink UI"


def test_the_api_aborts_for_an_editor_and_answers_409_when_there_is_nothing_to_abort(world):
    url = f"/walsink/api/pipelines/sales_a/checkpoints/{FAILED_KEY}/abort"
    response = world.client.post(
        url, json={"reason": "bad input", "attempt": 1}, headers=world.headers("admin")
    )
    assert response.status_code == 200, response.text
    assert response.json()["state"] == "ABORTED" and response.json()["previous_state"] == "FAILED"
    again = world.client.post(url, json={"reason": "again"}, headers=world.headers("admin"))
    assert again.status_code == 409 and "nothing to abort" in again.json()["detail"]
    empty = world.client.post(url, json={"reason": ""}, headers=world.headers("admin"))
    assert empty.status_code == 422
    assert len(audit_rows(FAILED_KEY)) == 1


def test_an_aborted_checkpoint_is_neither_overdue_nor_the_last_error(world):
    """Issue 47: a checkpoint that failed and missed its commit deadline is OVERDUE and the
    pipeline's last error; once a person aborts it, it is neither (an abort is a decision, and
    nothing is late any more), in the JSON API, the checkpoint page and the overview."""
    from datetime import timedelta

    from airflow_provider_walsink.core.store import Actor
    from airflow_provider_walsink.core.store.store import utcnow
    from tests.helpers import stage_checkpoint

    pipeline, key = "late_sales", "20260110T000000Z"
    actor = Actor(name="w", dag_id=DAG_A, run_id="run-late", task_id="write", try_number=1)
    store, admin = world.store, world.headers("admin")
    stage_checkpoint(store, world.layout, pipeline, key, {"dt=x/a.csv": b"1\n"}, durable=False, actor=actor)
    store.fail(pipeline, key, error="PublishError: target refused", actor=actor, attempt=1)
    store.record_deadline_miss(
        pipeline, key, due_at=utcnow() - timedelta(minutes=5), actor=actor, detail="commit deadline missed"
    )
    api = f"/walsink/api/pipelines/{pipeline}"

    def overview_last_error() -> dict | None:
        listed = world.client.get("/walsink/api/pipelines", headers=admin).json()["pipelines"]
        return next(p for p in listed if p["pipeline"] == pipeline)["last_error"]

    def overdue() -> bool:
        return world.client.get(f"{api}/checkpoints/{key}", headers=admin).json()["checkpoint"]["overdue"]

    assert overdue() is True
    assert overview_last_error()["checkpoint_key"] == key

    aborted = world.client.post(
        f"{api}/checkpoints/{key}/abort",
        json={"reason": "INC-43: interval given up", "attempt": 1},
        headers=admin,
    )
    assert aborted.status_code == 200 and aborted.json()["state"] == "ABORTED", aborted.text

    assert overdue() is False
    listed = world.client.get(f"{api}/checkpoints", headers=admin).json()["checkpoints"]
    assert [(c["checkpoint_key"], c["overdue"]) for c in listed] == [(key, False)]
    assert overview_last_error() is None
    assert world.client.get(api, headers=admin).json()["last_error"] is None
    page = world.client.get(f"/walsink/pipelines/{pipeline}/checkpoints/{key}", headers=admin).text
    assert "badge overdue" not in page and "missed; aborted since" in page
    overview = world.client.get("/walsink/", headers=admin).text
    assert f"/checkpoints/{key}" not in overview  # neither the last error nor "Not committed"
