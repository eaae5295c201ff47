"""The commit-state plugin's JSON API and pages, in-process on Airflow's real api app.

``create_app()`` mounts the plugin exactly as the api-server does (through the
plugin loader), the auth manager is Airflow's SimpleAuthManager and every
token comes from ``POST /auth/token``. The committer table is filled through
the store with the calls the tasks make (write, seal, durable, commit).
"""

from __future__ import annotations

import os
import re
from datetime import timedelta

import pytest
from ui_fixtures import DAG_A, DAG_B, build_world

pytestmark = pytest.mark.airflow


@pytest.fixture(scope="module")
def world(airflow_db, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("ui")
    with pytest.MonkeyPatch.context() as mp:
        yield from build_world(f"sqlite:///{tmp}/committer.db", tmp, mp)


def test_plugin_is_loaded_with_app_and_external_views(world):
    from airflow import plugins_manager

    plugins = {p.name: p for p in plugins_manager._get_plugins()[0]}
    assert "walsink" in plugins, f"walsink plugin not loaded; loaded: {sorted(plugins)}"
    plugin = plugins["walsink"]
    assert [a["url_prefix"] for a in plugin.fastapi_apps] == ["/walsink"]
    views = {v["destination"]: v for v in plugin.external_views}
    assert views["nav"]["category"] == "browse" and views["nav"]["name"] == "Commit state"
    assert views["dag"]["href"] == "/walsink/dags/{DAG_ID}"
    assert views["dag_run"]["href"] == "/walsink/dags/{DAG_ID}/runs/{RUN_ID}"
    # And the UI's plugin endpoint serves them.
    listed = world.client.get("/api/v2/plugins", headers=world.headers("admin")).json()["plugins"]
    assert any(p["name"] == "walsink" for p in listed)


def test_pipelines_overview_counts_latest_commit_and_last_error(world):
    body = world.client.get("/walsink/api/pipelines", headers=world.headers("admin")).json()
    by_name = {p["pipeline"]: p for p in body["pipelines"]}
    assert set(by_name) == {"sales_a", "sales_b", "shared", "notebook"}
    a = by_name["sales_a"]
    assert a["dag_id"] == DAG_A and a["checkpoints"] == 5
    assert a["counts"]["COMMITTED"] == 3 and a["counts"]["DURABLE"] == 1 and a["counts"]["FAILED"] == 1
    assert a["latest_committed"]["checkpoint_key"] == "20260103T000000Z"
    assert a["last_error"]["checkpoint_key"] == "20260105T000000Z"
    assert "checksum mismatch" in a["last_error"]["error"]


def test_checkpoints_keyset_pages_and_state_filter(world):
    h = world.headers("admin")
    url = "/walsink/api/pipelines/sales_a/checkpoints"
    first = world.client.get(url, params={"limit": 2}, headers=h).json()
    assert [c["sequence"] for c in first["checkpoints"]] == [5, 4]
    second = world.client.get(url, params={"limit": 2, "before": first["next_before"]}, headers=h).json()
    assert [c["sequence"] for c in second["checkpoints"]] == [3, 2]
    last = world.client.get(url, params={"limit": 2, "before": second["next_before"]}, headers=h).json()
    assert [c["sequence"] for c in last["checkpoints"]] == [1] and last["next_before"] is None
    back = world.client.get(url, params={"limit": 2, "after": last["checkpoints"][0]["sequence"]}, headers=h)
    assert [c["sequence"] for c in back.json()["checkpoints"]] == [3, 2]

    committed = world.client.get(url, params=[("state", "COMMITTED")], headers=h).json()["checkpoints"]
    assert [c["sequence"] for c in committed] == [3, 2, 1]
    assert world.client.get(url, params={"state": "NOPE"}, headers=h).status_code == 422

    row = committed[0]
    assert row["rows"] == 2 and row["committables"] == 1 and row["attempt"] == 1
    assert row["phases"]["write_s"] is not None and row["phases"]["commit_s"] is not None
    assert row["dag_id"] == DAG_A and row["run_id"] == "run-2"


def test_checkpoint_detail_committables_and_history(world):
    h = world.headers("admin")
    durable = world.client.get(
        "/walsink/api/pipelines/sales_a/checkpoints/20260104T000000Z", headers=h
    ).json()
    assert durable["checkpoint"]["state"] == "DURABLE"
    assert durable["checkpoint"]["phases"]["current"] == "commit"
    assert durable["committables"]["status"] == "available"
    assert sorted(i["path"] for i in durable["committables"]["items"]) == [
        "dt=2026-01-04/part-0.csv",
        "dt=2026-01-04/part-1.csv",
    ]
    assert durable["committables"]["total_rows"] == 3
    assert [t["to_state"] for t in durable["history"]] == ["REGISTERED", "WRITING", "SEALED", "DURABLE"]

    committed = world.client.get(
        "/walsink/api/pipelines/sales_a/checkpoints/20260101T000000Z", headers=h
    ).json()
    # The commit task cleaned the staging area: the API says so instead of failing.
    assert committed["committables"]["status"] == "cleaned"
    assert "cleaned" in committed["committables"]["message"]
    assert committed["history"][-1]["to_state"] == "COMMITTED"
    assert committed["history"][-1]["task_id"] == "commit"

    assert (
        world.client.get(
            "/walsink/api/pipelines/sales_a/checkpoints/20260104T000000Z/history", headers=h
        ).json()["transitions"][0]["to_state"]
        == "REGISTERED"
    )
    assert world.client.get("/walsink/api/pipelines/sales_a/checkpoints/nope", headers=h).status_code == 404
    assert world.client.get("/walsink/api/pipelines/nope", headers=h).status_code == 404


def test_dag_and_run_checkpoints(world):
    h = world.headers("admin")
    dag = world.client.get(f"/walsink/api/dags/{DAG_A}/checkpoints", headers=h).json()["checkpoints"]
    assert [c["checkpoint_key"] for c in dag if c["pipeline"] == "sales_a"] == [
        f"2026010{i}T000000Z" for i in range(1, 6)
    ]
    assert {c["pipeline"] for c in dag} == {"sales_a", "shared"}
    run = world.client.get(f"/walsink/api/dags/{DAG_A}/checkpoints", params={"run_id": "run-3"}, headers=h)
    assert [c["checkpoint_key"] for c in run.json()["checkpoints"]] == ["20260104T000000Z"]


def test_pages_render_with_the_browser_cookie(world):
    """The Airflow UI shows plugin pages in a same-origin iframe: the ``_token`` cookie is the credential."""
    cookies = {"_token": world.tokens["admin"]}
    client = world.client
    client.cookies.clear()
    overview = client.get("/walsink/", cookies=cookies)
    assert overview.status_code == 200 and "sales_a" in overview.text and "sales_b" in overview.text
    pipeline = client.get("/walsink/pipelines/sales_a", cookies=cookies)
    assert pipeline.status_code == 200 and pipeline.text.count('class="cell s-') == 5
    detail = client.get("/walsink/pipelines/sales_a/checkpoints/20260104T000000Z", cookies=cookies)
    assert detail.status_code == 200 and "dt=2026-01-04/part-1.csv" in detail.text
    assert client.get(f"/walsink/dags/{DAG_A}", cookies=cookies).status_code == 200
    run_page = client.get(f"/walsink/dags/{DAG_A}/runs/run-3", cookies=cookies)
    assert run_page.status_code == 200 and "20260104T000000Z" in run_page.text
    css = client.get("/walsink/static/walsink.css", cookies=cookies)
    assert css.status_code == 200 and css.headers["content-type"].startswith("text/css")


def test_extra_link_resolves_to_the_checkpoint_detail(world):
    from airflow_provider_walsink.ui.links import WalsinkCheckpointLink, checkpoint_link

    url = checkpoint_link(DAG_A, "run-3", "sales_a")
    response = world.client.get(url, headers=world.headers("admin"), follow_redirects=False)
    assert response.status_code == 303
    assert response.headers["location"] == "/walsink/pipelines/sales_a/checkpoints/20260104T000000Z"

    class Op:
        pipeline = "sales_a"

    class Key:
        dag_id, run_id, task_id, map_index, try_number = DAG_A, "run-3", "commit", -1, 1

    link = WalsinkCheckpointLink().get_link(Op(), ti_key=Key())
    assert link == "/walsink/link?dag_id=ui_dag_a&run_id=run-3&pipeline=sales_a"


def test_unknown_dag_answers_404(world):
    h = world.headers("admin")
    for url in (
        "/walsink/api/dags/no_such_dag/checkpoints",
        "/walsink/api/dags/no_such_dag/checkpoints?run_id=run-0",
        "/walsink/dags/no_such_dag",
        "/walsink/dags/no_such_dag/runs/run-0",
        "/walsink/link?dag_id=no_such_dag&run_id=run-0",
    ):
        response = world.client.get(url, headers=h, follow_redirects=False)
        assert response.status_code == 404, f"{url} -> {response.status_code}"
        assert "no_such_dag" in response.json()["detail"]
    # A known DAG without checkpoints in that run is an empty 200, not a 404.
    known = world.client.get(f"/walsink/api/dags/{DAG_B}/checkpoints?run_id=nope", headers=h)
    assert known.status_code == 200 and known.json()["checkpoints"] == []


def test_team_user_sees_only_their_dags_pipelines(world):
    alice = world.headers("alice")
    names = [
        p["pipeline"] for p in world.client.get("/walsink/api/pipelines", headers=alice).json()["pipelines"]
    ]
    assert names == ["sales_a"]
    bob = world.headers("bob")
    names = [
        p["pipeline"] for p in world.client.get("/walsink/api/pipelines", headers=bob).json()["pipelines"]
    ]
    assert names == ["sales_b"]
    assert world.client.get("/walsink/api/pipelines/sales_a/checkpoints", headers=alice).status_code == 200
    assert DAG_B not in world.client.get("/walsink/", cookies={"_token": world.tokens["alice"]}).text


@pytest.mark.slow
def test_api_benchmark_runs(tmp_path):
    """bench/bench_api.py end to end on a tiny table (correctness only, no timing is judged)."""
    import subprocess
    import sys
    from pathlib import Path

    repo = Path(__file__).resolve().parent.parent
    pg_admin_url = os.environ.get("WALSINK_TEST_PG_URL", "postgresql+psycopg2://postgres@127.0.0.1:5432/test")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AIRFLOW__", "AIRFLOW_CONN_"))}
    env.pop("AIRFLOW_HOME", None)
    env["WALSINK_BENCH_PG_URL"] = pg_admin_url
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "bench.bench_api",
            "--rows",
            "2000",
            "--pipelines",
            "50",
            "--requests",
            "3",
            "--explain",
        ],
        cwd=repo,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    if result.returncode != 0 and "could not connect" in result.stderr.lower():
        from tests.helpers import missing_prerequisite

        missing_prerequisite("PostgreSQL is unreachable")
    assert result.returncode == 0, result.stderr[-3000:]
    assert "50 pipelines, 2,000 checkpoints" in result.stdout
    assert "EXPLAIN walsink status" in result.stdout  # plans only: on 2,000 rows a Seq Scan is right
    for row in (
        "list API, deep keyset page",
        "baseline: raw indexed SQL",
        "pipelines overview API",
        "walsink status",
    ):
        assert row in result.stdout, result.stdout


def test_connection_forms_test_button_runs_the_hooks_checks(world, monkeypatch, tmp_path):
    """``POST /api/v2/connections/test`` (the form's Test button) reaches WalsinkHook.test_connection."""
    import json

    monkeypatch.setenv("AIRFLOW__CORE__TEST_CONNECTION", "Enabled")
    url = str(world.store.engine.url.render_as_string(hide_password=False))

    def press(extra: dict) -> dict:
        body = {"connection_id": "walsink_form", "conn_type": "walsink", "extra": json.dumps(extra)}
        response = world.client.post("/api/v2/connections/test", json=body, headers=world.headers("admin"))
        assert response.status_code == 200, response.text
        return response.json()

    ok = press({"url": url, "staging_root": str(tmp_path)})
    assert ok["status"] is True and "schema at head" in ok["message"], ok
    (tmp_path / "file").write_text("x")
    bad = press({"url": url, "staging_root": str(tmp_path / "file" / "staging")})
    assert bad["status"] is False and "is not a directory" in bad["message"], bad
    missing = press({"url": f"sqlite:///{tmp_path}/nope/c.db", "staging_root": str(tmp_path)})
    assert missing["status"] is False and "does not exist" in missing["message"], missing


# ------------------------------------------------------------ what the pages say


def _page(world, url: str) -> str:
    response = world.client.get(url, headers=world.headers("admin"))
    assert response.status_code == 200, response.text
    return response.text


def test_times_follow_airflows_default_timezone(world, monkeypatch):
    record = world.store.get("sales_a", "20260104T000000Z")
    url = "/walsink/pipelines/sales_a/checkpoints/20260104T000000Z"
    monkeypatch.setenv("AIRFLOW__CORE__DEFAULT_TIMEZONE", "Asia/Kolkata")  # +05:30, no DST
    kolkata = (record.created_at + timedelta(hours=5, minutes=30)).strftime("%Y-%m-%d %H:%M:%S IST")
    html = _page(world, url)
    assert kolkata in html
    monkeypatch.setenv("AIRFLOW__CORE__DEFAULT_TIMEZONE", "UTC")
    html = _page(world, url)
    assert record.created_at.strftime("%Y-%m-%d %H:%M:%S UTC") in html and kolkata not in html
    # The machine-readable value stays in the markup and the API stays UTC.
    assert f'datetime="{record.created_at.isoformat(timespec="milliseconds")}Z"' in html


def test_offsets_render_as_key_value_text(world):
    html = _page(world, "/walsink/pipelines/shared/checkpoints/20260102T000000Z")
    facts = html[html.index("Start offsets") : html.index("</dl>")]
    text = re.sub(r"<[^>]+>", "", facts)
    assert "events.0 = 42" in text and "events.1 = 7" in text and "events.0 = 50" in text
    assert "{" not in text and "'" not in text  # no Python or JSON dict syntax


def test_counts_use_correct_plurals(world):
    one = _page(world, "/walsink/pipelines/sales_a/checkpoints/20260105T000000Z")
    two = _page(world, "/walsink/pipelines/sales_a/checkpoints/20260104T000000Z")
    assert "1 committable in the sealed manifest" in one and "1 row," in one
    assert "2 committables in the sealed manifest" in two and "3 rows," in two
    for html in (one, two, _page(world, f"/walsink/dags/{DAG_A}")):
        assert "(s)" not in html and "1 committables" not in html and "1 rows" not in html
        assert "1 files" not in html


def test_history_colours_only_failures_red(world):
    failed = _page(world, "/walsink/pipelines/sales_a/checkpoints/20260105T000000Z")
    history = failed[failed.index('class="grid history"') :]
    rows = re.findall(r"<tr class=\"([^\"]*)\">\s*<td>.*?</tr>", history, re.S)
    assert rows.count("failure") == 1, rows  # the FAILED transition, and it alone
    aborted = _page(world, "/walsink/pipelines/shared/checkpoints/20260102T000000Z")
    durable = _page(world, "/walsink/pipelines/sales_a/checkpoints/20260104T000000Z")
    for html in (aborted, durable):
        assert "failure" not in html[html.index("<main>") :]
    css = world.client.get("/walsink/static/walsink.css", headers=world.headers("admin")).text
    red_rules = [rule for rule in css.split("}") if "var(--failed)" in rule and "{" in rule]
    assert all(
        ".s-failed" in r or ".failure" in r or "--failed:" in r or "status-unavailable" in r
        for r in red_rules
    ), red_rules


def test_checkpoints_link_to_airflows_dag_run_and_task_pages(world):
    html = _page(world, "/walsink/pipelines/sales_a/checkpoints/20260101T000000Z")
    assert f'href="/dags/{DAG_A}"' in html
    assert f'href="/dags/{DAG_A}/runs/run-0"' in html
    assert f'href="/dags/{DAG_A}/runs/run-0/tasks/commit"' in html  # the commit in the history
    assert f'href="/dags/{DAG_A}/runs/run-0/tasks/write"' in html
    body = world.client.get(
        "/walsink/api/pipelines/sales_a/checkpoints/20260101T000000Z", headers=world.headers("admin")
    ).json()
    assert body["checkpoint"]["airflow"] == {"dag": f"/dags/{DAG_A}", "run": f"/dags/{DAG_A}/runs/run-0"}
    # The hostile run id is one path segment, escaped.
    hostile = _page(world, "/walsink/pipelines/sales_a/checkpoints/20260105T000000Z")
    assert f'href="/dags/{DAG_A}/runs/manual__%3Cscript%3Ealert%28%27walsink%27%29%3C%2Fscript%3E"' in hostile


def test_a_committed_checkpoint_shows_what_it_published(world, monkeypatch):
    """With the committer's ``publication`` record set, the page lists the files or the snapshot."""
    import dataclasses

    from airflow_provider_walsink.core.store.store import CommitterStore

    with_publication = dataclasses.replace
    # A real commit records what it published (the fixture's day 3 went through the committer).
    recorded = world.store.require("sales_a", "20260103T000000Z").publication
    assert recorded["kind"] == "file" and recorded["files"] and recorded["files_total"] >= 1

    publications = {
        "20260101T000000Z": {
            "target": "/data/sales",
            "kind": "files",
            "outcome": "PUBLISHED",
            "files": [f"dt=2026-01-01/part-{i}.csv" for i in range(3)],
            "files_total": 5,
            "snapshot": None,
        },
        "20260102T000000Z": {"target": "iceberg://lake/db.sales", "kind": "iceberg", "snapshot": "4711"},
    }
    real_get = CommitterStore.get

    def get(self, pipeline, key):
        record = real_get(self, pipeline, key)
        if record is None or pipeline != "sales_a":
            return record
        if key == "20260103T000000Z":  # as a commit recorded before publications were kept
            return with_publication(record, publication=None)
        if key not in publications:
            return record
        return with_publication(record, publication=publications[key])

    monkeypatch.setattr(CommitterStore, "get", get)
    files = _page(world, "/walsink/pipelines/sales_a/checkpoints/20260101T000000Z")
    published = files[files.index('id="publication"') :]
    assert "/data/sales" in published and "dt=2026-01-01/part-2.csv" in published
    assert "5 files; the first 3 are listed" in published
    table = _page(world, "/walsink/pipelines/sales_a/checkpoints/20260102T000000Z")
    assert "iceberg://lake/db.sales" in table and 'class="path snapshot">4711<' in table
    api = world.client.get(
        "/walsink/api/pipelines/sales_a/checkpoints/20260102T000000Z", headers=world.headers("admin")
    ).json()
    assert api["checkpoint"]["publication"]["snapshot"] == "4711"
    # Without a publication record the page falls back to the committables (here: cleaned staging).
    plain = _page(world, "/walsink/pipelines/sales_a/checkpoints/20260103T000000Z")
    assert 'id="publication"' not in plain and 'id="committables-status"' in plain


def test_a_writing_checkpoint_says_where_its_job_runs(world, monkeypatch):
    """An attempt whose job can outlive its write task (Spark Connect) records where it runs; the
    page and the JSON API name the runner, the connection and the session, as ``walsink status``
    does. A row without one shows nothing."""
    import dataclasses

    from airflow_provider_walsink.core.store.store import CommitterStore

    job = {"runner": "spark_connect", "conn_id": "spark_connect_prod", "session_id": "3f1c0a5e-session"}
    real_get = CommitterStore.get

    def get(self, pipeline, key):
        record = real_get(self, pipeline, key)
        if record is not None and (pipeline, key) == ("sales_a", "20260104T000000Z"):
            return dataclasses.replace(record, write_job=job)
        return record

    monkeypatch.setattr(CommitterStore, "get", get)
    page = _page(world, "/walsink/pipelines/sales_a/checkpoints/20260104T000000Z")
    shown = page[page.index('id="write-job"') :]
    # The words walsink history prints (core/runners: describe_job_ref), HTML-escaped.
    assert shown.startswith(
        'id="write-job" class="path">spark_connect on connection &#39;spark_connect_prod&#39;, '
        "session 3f1c0a5e-session</dd>"
    ), shown[:200]
    api = world.client.get(
        "/walsink/api/pipelines/sales_a/checkpoints/20260104T000000Z", headers=world.headers("admin")
    ).json()
    assert api["checkpoint"]["write_job"] == job
    plain = _page(world, "/walsink/pipelines/sales_a/checkpoints/20260103T000000Z")
    assert 'id="write-job"' not in plain


def test_extra_link_is_relative_whatever_base_url_says(monkeypatch):
    from airflow_provider_walsink.ui.links import WalsinkCheckpointLink

    class Op:
        pipeline = "sales_a"

    class Key:
        dag_id, run_id, task_id, map_index, try_number = DAG_A, "run-3", "commit", -1, 1

    monkeypatch.setenv("AIRFLOW__API__BASE_URL", "http://old-host:8080")
    assert WalsinkCheckpointLink().get_link(Op(), ti_key=Key()) == (
        "/walsink/link?dag_id=ui_dag_a&run_id=run-3&pipeline=sales_a"
    )
    monkeypatch.setenv("AIRFLOW__API__BASE_URL", "https://airflow.example.com:8443/airflow/")
    assert WalsinkCheckpointLink().get_link(Op(), ti_key=Key()) == (
        "/airflow/walsink/link?dag_id=ui_dag_a&run_id=run-3&pipeline=sales_a"
    )
