"""Security of the commit-state plugin: Airflow does not authenticate plugin apps,
so each route must refuse anonymous callers itself, honour per-DAG read access
and escape every piece of user-controlled text.

Runs on Airflow's real api app with SimpleAuthManager (multi-team: ``alice``
may read only ``ui_dag_a``) and tokens from ``POST /auth/token``.
"""

from __future__ import annotations

import os

import pytest
from fastapi.routing import APIRoute
from ui_fixtures import DAG_A, DAG_B, XSS, build_world

pytestmark = pytest.mark.airflow

SAMPLE_PARAMS = {
    "pipeline": "sales_b",
    "checkpoint_key": "20260101T000000Z",
    "dag_id": DAG_B,
    "run_id": "run-0",
    "name": "walsink.css",
}


@pytest.fixture(scope="module")
def world(airflow_db, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("ui-sec")
    with pytest.MonkeyPatch.context() as mp:
        yield from build_world(f"sqlite:///{tmp}/committer.db", tmp, mp)


def plugin_urls() -> list[tuple[str, str]]:
    """Every route of the plugin app (method, URL), with its path parameters filled in."""
    from airflow_provider_walsink.ui import URL_PREFIX
    from airflow_provider_walsink.ui.app import app

    urls = []
    for route in app.routes:
        if isinstance(route, APIRoute):
            path = route.path.replace("{run_id:path}", "{run_id}").format(**SAMPLE_PARAMS)
            for method in sorted(route.methods):
                urls.append((method, f"{URL_PREFIX}{path}?dag_id={DAG_B}&run_id=run-0"))
    assert len(urls) >= 15, urls  # the test must not pass by finding no routes
    assert sum(m == "POST" for m, _ in urls) >= 2, urls  # the abort routes are checked too
    return urls


def _call(client, method: str, url: str, **kwargs):
    if method == "POST":  # a well-formed body: the refusal must come from authentication
        if "/api/" in url:
            kwargs["json"] = {"reason": "anonymous"}
        else:
            kwargs["data"] = {"reason": "anonymous", "confirm": "yes"}
    return client.request(method, url, follow_redirects=False, **kwargs)


def test_every_route_refuses_anonymous_and_forged_tokens(world):
    client = world.client
    client.cookies.clear()
    for method, url in plugin_urls():
        for headers in ({}, {"Accept": "text/html"}):
            response = _call(client, method, url, headers=headers)
            assert response.status_code in (401, 403), f"anonymous {method} {url} -> {response.status_code}"
        forged = _call(client, method, url, headers={"Authorization": "Bearer not-a-jwt"})
        assert forged.status_code in (401, 403), f"forged token {method} {url} -> {forged.status_code}"
        bad_cookie = _call(client, method, url, cookies={"_token": "x.y.z"})
        assert bad_cookie.status_code in (401, 403), f"bad cookie {method} {url} -> {bad_cookie.status_code}"
    # Nothing was aborted by any of those calls.
    assert world.store.require("sales_b", "20260101T000000Z").state.value == "COMMITTED"
    # The refusal is Airflow's: the very same URLs answer for a logged-in admin.
    ok = client.get("/walsink/api/pipelines/sales_b", headers=world.headers("admin"))
    assert ok.status_code == 200


def test_anonymous_page_explains_and_links_to_login(world):
    world.client.cookies.clear()
    response = world.client.get("/walsink/", headers={"Accept": "text/html"})
    assert response.status_code == 401
    assert "/auth/login?next=" in response.text


def test_user_limited_to_another_dag_is_refused_this_dags_pipelines(world):
    alice = world.headers("alice")
    client = world.client
    listed = client.get("/walsink/api/pipelines", headers=alice).json()["pipelines"]
    assert [p["pipeline"] for p in listed] == ["sales_a"]
    refused = [
        "/walsink/api/pipelines/sales_b",
        "/walsink/api/pipelines/sales_b/checkpoints",
        "/walsink/api/pipelines/sales_b/checkpoints/20260101T000000Z",
        "/walsink/api/pipelines/sales_b/checkpoints/20260101T000000Z/committables",
        "/walsink/api/pipelines/sales_b/checkpoints/20260101T000000Z/history",
        f"/walsink/api/dags/{DAG_B}/checkpoints",
        f"/walsink/api/dags/{DAG_B}/checkpoints?run_id=run-0",
        "/walsink/pipelines/sales_b",
        "/walsink/pipelines/sales_b/checkpoints/20260101T000000Z",
        f"/walsink/dags/{DAG_B}",
        f"/walsink/dags/{DAG_B}/runs/run-0",
        f"/walsink/link?dag_id={DAG_B}&run_id=run-0&pipeline=sales_b",
    ]
    for url in refused:
        response = client.get(url, headers=alice, follow_redirects=False)
        assert response.status_code == 403, f"alice GET {url} -> {response.status_code}"
        assert "sales_b" not in response.text.replace(url, "")
    # ...while her own DAG's pipeline answers.
    assert client.get("/walsink/api/pipelines/sales_a/checkpoints", headers=alice).status_code == 200
    assert client.get(f"/walsink/dags/{DAG_A}", headers=alice).status_code == 200
    # The same holds through the browser cookie.
    cookie_page = client.get("/walsink/", cookies={"_token": world.tokens["alice"]})
    assert "sales_a" in cookie_page.text and "sales_b" not in cookie_page.text


def _listed(world, user: str) -> set[str]:
    body = world.client.get("/walsink/api/pipelines", headers=world.headers(user)).json()
    return {p["pipeline"] for p in body["pipelines"]}


def test_admin_sees_every_pipeline_including_those_without_a_dag(world):
    assert _listed(world, "admin") == {"sales_a", "sales_b", "shared", "notebook"}
    for url in ("/walsink/api/pipelines/notebook", "/walsink/api/pipelines/shared/checkpoints"):
        assert world.client.get(url, headers=world.headers("admin")).status_code == 200


def test_viewer_of_some_dags_sees_only_pipelines_all_of_whose_dags_they_read(world):
    """alice reads DAG A only: ``shared`` (written by A and B) and ``notebook`` (no DAG) stay hidden."""
    assert _listed(world, "alice") == {"sales_a"}
    for url in (
        "/walsink/api/pipelines/shared",
        "/walsink/api/pipelines/shared/checkpoints/20260101T000000Z",
        "/walsink/api/pipelines/notebook",
        "/walsink/pipelines/notebook",
    ):
        response = world.client.get(url, headers=world.headers("alice"))
        assert response.status_code == 403, f"alice GET {url} -> {response.status_code}"
    page = world.client.get("/walsink/", cookies={"_token": world.tokens["alice"]}).text
    assert "notebook" not in page and "shared" not in page


def test_viewer_with_no_dag_sees_no_pipeline(world):
    """carol is a viewer of no team: before, she saw every pipeline registered outside Airflow."""
    assert _listed(world, "carol") == set()
    for url in (
        "/walsink/api/pipelines/notebook",
        "/walsink/api/pipelines/sales_a",
        "/walsink/pipelines/notebook",
    ):
        response = world.client.get(url, headers=world.headers("carol"))
        assert response.status_code == 403, f"carol GET {url} -> {response.status_code}"
    assert (
        "No pipelines you may read"
        in world.client.get("/walsink/", cookies={"_token": world.tokens["carol"]}).text
    )


@pytest.mark.parametrize(
    "url",
    [
        "/walsink/",
        "/walsink/pipelines/sales_a",
        "/walsink/pipelines/sales_a/checkpoints/20260105T000000Z",
        f"/walsink/dags/{DAG_A}",
    ],
)
def test_hostile_text_renders_as_text(world, url):
    """Error messages, run ids and actor names are free text; none may become markup."""
    response = world.client.get(url, headers=world.headers("admin"))
    assert response.status_code == 200
    html = response.text
    assert "<script" not in html.lower(), "a <script> element reached the page"
    assert "&lt;script&gt;alert(" in html, "the hostile text should be shown, escaped"


def test_hostile_text_is_plain_json_in_the_api(world):
    response = world.client.get(
        "/walsink/api/pipelines/sales_a/checkpoints/20260105T000000Z", headers=world.headers("admin")
    )
    assert response.headers["content-type"].startswith("application/json")
    body = response.json()
    assert XSS in body["checkpoint"]["error"] and XSS in body["checkpoint"]["run_id"]


def test_manifest_is_read_only_inside_the_staging_root(world, tmp_path):
    """A staging directory swapped for a symlink to elsewhere is refused, not followed."""
    import shutil

    checkpoint_dir = world.layout.checkpoint_dir("sales_a", "20260104T000000Z")
    outside = tmp_path / "elsewhere"
    shutil.copytree(checkpoint_dir, outside)
    moved = checkpoint_dir.with_name("moved-away")
    os.rename(checkpoint_dir, moved)
    os.symlink(outside, checkpoint_dir)
    try:
        body = world.client.get(
            "/walsink/api/pipelines/sales_a/checkpoints/20260104T000000Z/committables",
            headers=world.headers("admin"),
        ).json()
        assert body["status"] == "unavailable" and body["items"] == []
        assert "outside" in body["message"]
    finally:
        os.unlink(checkpoint_dir)
        os.rename(moved, checkpoint_dir)
    assert (
        world.client.get(
            "/walsink/api/pipelines/sales_a/checkpoints/20260104T000000Z/committables",
            headers=world.headers("admin"),
        ).json()["status"]
        == "available"
    )
