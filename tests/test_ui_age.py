"""Issue 25 item 3: per checkpoint its age in its state, a "not committed for longer than X"
filter (API and page), and a link from a checkpoint to the failing task try's log.

The fixture's ``sales_a/20260105T000000Z`` failed in try 2 of a run three hours ago
(its times moved back in the committer table); everything else is fresh.
"""

from __future__ import annotations

from datetime import timedelta
from urllib.parse import quote

import pytest
from sqlalchemy import update
from ui_fixtures import XSS, build_world

from airflow_provider_walsink.core.store.models import checkpoint_table as ckpt
from airflow_provider_walsink.core.store.store import utcnow

pytestmark = pytest.mark.airflow

OLD = "20260105T000000Z"


@pytest.fixture(scope="module")
def world(airflow_db, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("ui-age")
    with pytest.MonkeyPatch.context() as mp:
        for world in build_world(f"sqlite:///{tmp}/committer.db", tmp, mp):
            three_hours_ago = utcnow() - timedelta(hours=3)
            with world.store.engine.begin() as conn:
                conn.execute(
                    update(ckpt)
                    .where(ckpt.c.pipeline == "sales_a", ckpt.c.checkpoint_key == OLD)
                    .values(created_at=three_hours_ago, updated_at=three_hours_ago)
                )
            yield world


def _get(world, url: str, user: str = "admin"):
    return world.client.get(url, headers=world.headers(user), follow_redirects=False)


def test_each_checkpoint_says_how_long_it_has_been_in_its_state(world):
    rows = {
        c["checkpoint_key"]: c
        for c in _get(world, "/walsink/api/pipelines/sales_a/checkpoints").json()["checkpoints"]
    }
    old = rows[OLD]
    assert old["state"] == "FAILED"
    assert 3 * 3600 - 5 < old["age_s"] < 3 * 3600 + 60
    assert old["state_since"] == old["updated_at"]
    assert rows["20260104T000000Z"]["age_s"] < 600


def test_not_committed_for_longer_than_filters_the_api(world):
    stuck = _get(world, "/walsink/api/checkpoints?not_committed_for=1h").json()["checkpoints"]
    assert [(c["pipeline"], c["checkpoint_key"]) for c in stuck] == [("sales_a", OLD)]
    every = _get(world, "/walsink/api/checkpoints").json()["checkpoints"]
    keys = {(c["pipeline"], c["checkpoint_key"], c["state"]) for c in every}
    assert ("sales_a", "20260104T000000Z", "DURABLE") in keys
    assert not any(state in ("COMMITTED", "ABORTED") for _, _, state in keys)
    page = _get(world, "/walsink/api/pipelines/sales_a/checkpoints?not_committed_for=2h").json()
    assert [c["checkpoint_key"] for c in page["checkpoints"]] == [OLD]
    assert (
        _get(world, "/walsink/api/pipelines/sales_a/checkpoints?not_committed_for=4h").json()["checkpoints"]
        == []
    )
    # A reader of team B's DAG only sees its own pipelines' stuck checkpoints.
    assert all(
        c["pipeline"] != "sales_a"
        for c in _get(world, "/walsink/api/checkpoints", "bob").json()["checkpoints"]
    )


def test_an_age_without_a_unit_is_refused_with_the_accepted_forms(world):
    response = _get(world, "/walsink/api/checkpoints?not_committed_for=1")
    assert response.status_code == 422
    assert "15m" in response.json()["detail"]
    assert _get(world, "/walsink/api/checkpoints").status_code == 200
    assert world.client.get("/walsink/api/checkpoints").status_code == 401  # authenticated, as every route


def test_overview_lists_what_is_not_committed_with_the_filter(world):
    page = _get(world, "/walsink/?not_committed_for=1h").text
    assert 'id="not-committed-for"' in page and '<option value="1h" selected>' in page
    assert f"/walsink/pipelines/sales_a/checkpoints/{OLD}" in page
    assert "/walsink/pipelines/sales_a/checkpoints/20260104T000000Z" not in page
    assert "for 3.0 h" in page
    all_open = _get(world, "/walsink/").text
    assert "/walsink/pipelines/sales_a/checkpoints/20260104T000000Z" in all_open
    pipeline_page = _get(world, "/walsink/pipelines/sales_a?not_committed_for=1h").text
    assert f"/checkpoints/{OLD}" in pipeline_page and "/checkpoints/20260104T000000Z" not in pipeline_page


def test_a_checkpoint_links_to_the_failing_task_trys_log(world):
    from airflow_provider_walsink.ui.links import task_log_link

    expected = f"/dags/ui_dag_a/runs/{quote('manual__' + XSS, safe='')}/tasks/write?try_number=2"
    assert task_log_link("ui_dag_a", f"manual__{XSS}", "write", 2) == expected
    body = _get(world, f"/walsink/api/pipelines/sales_a/checkpoints/{OLD}").json()
    assert body["log"]["url"] == expected
    assert (body["log"]["task_id"], body["log"]["try_number"], body["log"]["state"]) == ("write", 2, "FAILED")
    page = _get(world, f"/walsink/pipelines/sales_a/checkpoints/{OLD}").text
    assert 'id="task-log"' in page and expected.replace("&", "&amp;") in page
    response = _get(world, f"/walsink/pipelines/sales_a/checkpoints/{OLD}/log")
    assert response.status_code == 303 and response.headers["location"] == expected
    # The list rows link there too; a checkpoint no Airflow task touched has no log to show.
    assert (
        f"/walsink/pipelines/sales_a/checkpoints/{OLD}/log" in _get(world, "/walsink/pipelines/sales_a").text
    )
    assert _get(world, "/walsink/pipelines/notebook/checkpoints/20260101T000000Z/log").status_code == 404
    assert world.client.get(f"/walsink/pipelines/sales_a/checkpoints/{OLD}/log").status_code == 401
