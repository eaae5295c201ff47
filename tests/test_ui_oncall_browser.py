"""Issue 25 items 2 to 5 in headless Chromium (1,280x800): what an on-call engineer sees.

The real Airflow api app (plugin, auth manager) with the UI fixtures' committer
table plus ``tests/test_ui_waiting.py``'s blocked and refused checkpoints, served
over HTTP on a loopback port. The browser checks that a blocked checkpoint is shown
blocked in its own colour (not as a running write), a refused one as refused, and
that the overview's "not committed for longer than" control filters the list and
each row links to the log of the task try that failed it; that a checkpoint two runs
wrote names the run that committed it (``tests/test_ui_concurrent_runs.py``) and that a
reprocessed checkpoint shows each version's own phases (``tests/test_ui_version_phases.py``);
and that a partition-scheduled pipeline's checkpoints are named by their partition keys as
written, in partition order (issue 47). Screenshots go to ``test-artifacts/ui-oncall/``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import json
from datetime import timedelta
from pathlib import Path
from urllib.parse import quote

import pytest
from helpers import stage_checkpoint
from sqlalchemy import update
from test_ui_concurrent_runs import add_concurrent_runs
from test_ui_layout import browser  # noqa: F401 - the shared Chromium fixture
from test_ui_partition_keys import ENCODED, KEYS
from test_ui_version_phases import add_reprocessed
from test_ui_waiting import add_waiting_checkpoints
from ui_fixtures import DAG_A, build_world, serve_on_loopback

from airflow_provider_walsink.core.commit import CheckpointCommitter
from airflow_provider_walsink.core.protocol.partition_keys import PartitionSpec
from airflow_provider_walsink.core.store import Actor
from airflow_provider_walsink.core.store.models import checkpoint_table as ckpt
from airflow_provider_walsink.core.store.store import utcnow
from airflow_provider_walsink.core.targets import FilePublisher

pytestmark = [pytest.mark.airflow, pytest.mark.browser]

ARTIFACTS = Path(__file__).resolve().parent.parent / "test-artifacts" / "ui-oncall"
SCREEN = {"width": 1280, "height": 800}
OLD = "20260105T000000Z"  # sales_a: FAILED in try 2, three hours ago
ORANGE = "rgb(239, 108, 0)"  # --blocked
PURPLE = "rgb(106, 27, 154)"  # --refused


#: The partition-scheduled pipeline ``regions``: a run's partition key names its checkpoint
#: and the target partition ``region=<key>`` it replaces (docs/backfill.md, "Partitioned runs").
REGIONS = PartitionSpec(column="region")
#: Not committed; the other two are.
OPEN_KEY = "eu west 1"


def add_partitioned(world, tmp) -> None:
    """``regions``: one run per partition key of ``KEYS``, registered in that order (münchen-ü,
    eu west 1, a=b: not sorted), each checkpoint named and staged as the write task of a
    partitioned run names and stages it; the commit task published all but ``OPEN_KEY``."""
    publisher = FilePublisher(tmp / "regions-target", "overwrite", layout=world.layout)
    committer = CheckpointCommitter(world.store, world.layout, publisher, mode="overwrite")
    for i, key in enumerate(KEYS):
        checkpoint = REGIONS.checkpoint_key(key)
        writer = Actor(name="w", dag_id=DAG_A, run_id=f"partitioned__{i}", task_id="write", try_number=1)
        files = {f"{REGIONS.target_partition(key)}/part-0.csv": b"r\n"}
        stage_checkpoint(world.store, world.layout, "regions", checkpoint, files, actor=writer)
        if key != OPEN_KEY:
            committer.commit("regions", checkpoint, actor=dataclasses.replace(writer, task_id="commit"))


@pytest.fixture(scope="module")
def served(airflow_db, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("ui-oncall")
    with pytest.MonkeyPatch.context() as mp:
        for world in build_world(f"sqlite:///{tmp}/committer.db", tmp, mp):
            add_waiting_checkpoints(world, tmp)
            add_concurrent_runs(world, tmp)
            add_reprocessed(world)
            add_partitioned(world, tmp)
            then = utcnow() - timedelta(hours=3)
            with world.store.engine.begin() as conn:
                conn.execute(
                    update(ckpt)
                    .where(ckpt.c.pipeline == "sales_a", ckpt.c.checkpoint_key == OLD)
                    .values(created_at=then, updated_at=then)
                )
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


def _shot(page, name: str) -> None:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / f"{name}.png"), full_page=True)


def test_a_blocked_checkpoint_is_shown_blocked_not_writing(served, page):
    _, base = served
    page.goto(f"{base}/walsink/pipelines/orders")
    row = page.locator("table.checkpoints tbody tr", has=page.locator("a.ckpt", has_text="k2"))
    badge = row.locator(".badge.wait")
    assert badge.inner_text() == "BLOCKED by k1"
    assert badge.evaluate("e => getComputedStyle(e).backgroundColor") == ORANGE
    assert "walsink abort orders k1" in row.locator("td.error").inner_text()
    # No phase counts up as a running write (the amber italics of an open phase).
    assert row.locator("td.phases small.open").count() == 0
    cell = page.locator("#timeline a.cell[href$='/checkpoints/k2']")
    assert cell.evaluate("e => getComputedStyle(e).backgroundColor") == ORANGE
    _shot(page, "pipeline-blocked")
    row.locator("a.ckpt").click()
    page.wait_for_url("**/checkpoints/k2")
    assert "by k1 (FAILED)" in page.locator("#waiting").inner_text()
    page.locator("#waiting a", has_text="k1").click()
    page.wait_for_url("**/checkpoints/k1")


def test_a_refused_commit_is_shown_refused(served, page):
    _, base = served
    page.goto(f"{base}/walsink/pipelines/ledger")
    row = page.locator("table.checkpoints tbody tr", has=page.locator("a.ckpt", has_text="c2"))
    badge = row.locator(".badge.wait")
    assert badge.inner_text() == "REFUSED"
    assert badge.evaluate("e => getComputedStyle(e).backgroundColor") == PURPLE
    assert "offsets" in row.locator("td.error").inner_text()


def test_overview_filters_what_is_not_committed_and_links_the_log(served, page):
    _, base = served
    page.goto(f"{base}/walsink/")
    table = page.locator("h2#uncommitted ~ table.checkpoints")
    assert table.locator("a.ckpt", has_text="20260104T000000Z").count() == 1
    page.select_option("#not-committed-for", "1h")
    page.get_by_role("button", name="Filter").click()
    page.wait_for_url("**not_committed_for=1h**")
    rows = table.locator("tbody tr")
    assert rows.count() == 1
    assert rows.first.locator("a.ckpt").inner_text() == OLD
    assert "for 3.0 h" in rows.first.locator("td.state").inner_text()
    _shot(page, "overview-not-committed-1h")
    href = rows.first.locator("a.log").get_attribute("href")
    response = page.request.get(base + href, max_redirects=0)
    assert response.status == 303
    location = response.headers["location"]
    assert location.startswith("/dags/ui_dag_a/runs/manual__") and location.endswith(
        "/tasks/write?try_number=2"
    )


def test_two_runs_one_interval_names_the_committing_run(served, page):
    _, base = served
    page.goto(f"{base}/walsink/pipelines/twice/checkpoints/20260201T000000Z")
    assert page.locator("a.af-run").inner_text() == "backfill__2026-02-01"
    assert page.locator("a.af-dag").inner_text() == "ui_dag_b"
    page.goto(f"{base}/walsink/dags/ui_dag_b")
    assert page.locator("table.checkpoints a.ckpt", has_text="20260201T000000Z").count() == 2  # twice, race
    _shot(page, "dag-tab-committing-run")


def test_a_reprocessed_checkpoint_shows_each_versions_phases(served, page):
    _, base = served
    page.goto(f"{base}/walsink/pipelines/sales_a/checkpoints/20260101T000000Z")
    table = page.locator("#version-phases")
    assert table.is_visible()
    assert "2 (current)" in table.inner_text()
    times = table.locator("td.num:not([rowspan])").all_inner_texts()
    # Eight phase rows (two versions), none of them hours long: each version counts its own.
    assert len(times) == 8 and not [t for t in times if t.endswith((" h", " min"))], times
    _shot(page, "checkpoint-version-phases")
    page.goto(f"{base}/walsink/pipelines/sales_a")
    row = page.locator("table.checkpoints tbody tr", has=page.locator("a.ckpt", has_text="20260101T000000Z"))
    assert " h" not in row.locator("td.phases").inner_text()


def test_partition_keys_as_written_in_partition_order(served, page):
    """Issue 47: a partition-scheduled pipeline whose runs registered münchen-ü, eu west 1 and a=b
    in that order. The timeline reads a=b, eu west 1, münchen-ü; each checkpoint page is headed
    by its key as written with the encoded key beside it, and names the partition it replaced in
    the same characters for every key (``region=a=b``, not Spark's ``region=a%3Db``); the overview
    and the JSON name them as written, and ``walsink history`` finds each by it."""
    from airflow_provider_walsink.cli.commands import main

    world, base = served
    in_order = sorted(KEYS)
    assert in_order == ["a=b", "eu west 1", "münchen-ü"] and KEYS != in_order

    def on(key: str):
        return lambda url: url.endswith(f"/walsink/pipelines/regions/checkpoints/{quote(ENCODED[key])}")

    page.goto(f"{base}/walsink/pipelines/regions")
    cells = page.locator("#timeline a.cell")
    titles = cells.evaluate_all("cells => cells.map(c => c.title)")
    assert titles == [
        f"#{KEYS.index(k) + 1} {k}: {'DURABLE' if k == OPEN_KEY else 'COMMITTED'}" for k in in_order
    ]
    # The list below it: newest first, by the keys as written (the encoded key on hover).
    keys = page.locator("table.checkpoints a.ckpt")
    assert keys.all_inner_texts() == list(reversed(KEYS))
    assert page.locator("table.checkpoints td.key").first.get_attribute("title") == ENCODED["a=b"]
    assert "a=b (seq 3)" in page.locator("dl.facts").inner_text()
    _shot(page, "pipeline-partition-keys")

    # Each checkpoint page, from its cell of the timeline, left to right.
    for i, key in enumerate(in_order):
        if i:
            page.goto(f"{base}/walsink/pipelines/regions")
        cells.nth(i).click()
        page.wait_for_url(on(key))
        assert page.locator("#checkpoint-key").inner_text() == key
        assert page.locator("#encoded-key").inner_text() == f"({ENCODED[key]})"
        if key == OPEN_KEY:  # not published yet: its staged committables name the partition
            assert page.locator("table.committables td.path").nth(1).inner_text() == f"region={key}"
            continue
        replaced = page.locator("#partitions-replaced span")
        assert replaced.all_inner_texts() == [f"region={key}"]
        # The directory as the target names it, on hover: Spark escaped '=' (and only that).
        assert replaced.first.get_attribute("title") == REGIONS.target_partition(key)
        if key == "a=b":
            assert REGIONS.target_partition(key) == "region=a%3Db"
            _shot(page, "checkpoint-partition-a=b")

    # The pipeline page's search takes the key as written.
    page.goto(f"{base}/walsink/pipelines/regions")
    page.fill("#find input[name=key]", "münchen-ü")
    page.get_by_role("button", name="Go").click()
    page.wait_for_url(on("münchen-ü"))
    assert page.locator("#checkpoint-key").inner_text() == "münchen-ü"

    # The overview: the latest commit and what is not committed, by the keys as written.
    page.goto(f"{base}/walsink/")
    row = page.locator("table.pipelines tbody tr", has=page.locator("a.pipeline", has_text="regions"))
    assert row.locator("td").nth(5).locator("a").inner_text() == "a=b"
    open_row = page.locator("h2#uncommitted ~ table.checkpoints a.ckpt", has_text=OPEN_KEY)
    assert open_row.count() == 1 and open_row.get_attribute("href").endswith(quote(ENCODED[OPEN_KEY]))
    _shot(page, "overview-partition-keys")

    # The JSON the pages are made from carries the key as written beside the checkpoint key.
    listed = page.request.get(f"{base}/walsink/api/pipelines/regions/checkpoints").json()["checkpoints"]
    assert [(c["checkpoint_key"], c["partition_key"]) for c in listed] == [
        (ENCODED[k], k) for k in reversed(KEYS)
    ]

    # `walsink history` finds each checkpoint by its key as written.
    url = world.store.engine.url.render_as_string(hide_password=False)

    def walsink(*args: str) -> str:
        # Its results only (the server thread's access log goes to the captured stdout).
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            assert main(["--url", url, *args]) == 0
        return out.getvalue()

    for key in KEYS:
        assert walsink("history", "regions", key).startswith(f"regions/{key} ({ENCODED[key]}): ")
        checkpoint = json.loads(walsink("history", "regions", key, "--json"))["checkpoint"]
        assert (checkpoint["key"], checkpoint["partition_key"]) == (ENCODED[key], key)
