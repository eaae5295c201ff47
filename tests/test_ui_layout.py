"""The commit-state pages fit Airflow's frame: headless Chromium measures element boxes.

Airflow shows the DAG and DAG-run tabs in an iframe narrower than the screen.
Here the real Airflow api app (plugin, auth manager, the UI fixtures' committer
table with long hostile values) is served over HTTP on a loopback port; the
browser loads each tab inside a same-origin iframe as wide as Airflow's frame
on a 1,280x800 and on a 1,366x768 screen, and checks that every column (the
error included) lies inside the frame, nothing scrolls sideways, and each cut
value carries the whole text in its tooltip.

``tests/test_ui_browser.py`` repeats the measurement inside the real Airflow UI.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from ui_fixtures import DAG_A, build_world, serve_on_loopback

pytestmark = [pytest.mark.airflow, pytest.mark.browser]

CHROMIUM = "/usr/bin/chromium"
ARTIFACTS = Path(__file__).resolve().parent.parent / "test-artifacts" / "ui-layout"
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
#: Screen -> width of Airflow 3.3's plugin frame on it (the DAG tab: the screen less the
#: navigation bar, the DAG's side panel and paddings; 1,030 px on a 1,440 px screen).
FRAMES = {(1280, 800): 870, (1366, 768): 956}
PAGES = [f"/walsink/dags/{DAG_A}", f"/walsink/dags/{DAG_A}/runs/run-3", "/walsink/pipelines/sales_a"]


@pytest.fixture(scope="module")
def served(airflow_db, tmp_path_factory):
    """The world's Airflow app on a loopback port (uvicorn in a thread)."""
    tmp = tmp_path_factory.mktemp("ui-layout")
    with pytest.MonkeyPatch.context() as mp:
        for world in build_world(f"sqlite:///{tmp}/committer.db", tmp, mp):
            with serve_on_loopback(world.app) as url:
                yield world, url


@pytest.fixture(scope="module")
def browser():
    if not os.path.exists(CHROMIUM):
        from tests.helpers import missing_prerequisite

        missing_prerequisite(f"{CHROMIUM} is missing: apt-get install chromium chromium-driver")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        instance = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        try:
            yield instance
        finally:
            instance.close()


#: Runs inside the frame: the frame's width, the document's, and every cell's box.
MEASURE = """() => {
  const width = document.documentElement.clientWidth;
  const cells = [...document.querySelectorAll('table.checkpoints th, table.checkpoints td')].map(e => {
    const r = e.getBoundingClientRect();
    return {tag: e.tagName, text: e.innerText.trim(), left: r.left, right: r.right, width: r.width,
            cls: e.className, title: e.getAttribute('title'), scroll: e.scrollWidth, client: e.clientWidth};
  });
  return {width, scrollWidth: document.documentElement.scrollWidth, cells,
          headers: [...document.querySelectorAll('table.checkpoints th')].map(e => e.innerText.trim())};
}"""


@pytest.mark.parametrize("screen", list(FRAMES), ids=lambda s: f"{s[0]}x{s[1]}")
@pytest.mark.parametrize("path", PAGES)
def test_tab_fits_airflows_frame(served, browser, screen, path):
    world, base = served
    frame_width = FRAMES[screen]
    context = browser.new_context(viewport={"width": screen[0], "height": screen[1]})
    try:
        context.add_cookies([{"name": "_token", "value": world.tokens["admin"], "url": base}])
        page = context.new_page()
        # A host page on the same origin, framing the tab as Airflow does.
        host = f"{base}/__layout_host__"
        page.route(
            host,
            lambda route: route.fulfill(
                content_type="text/html",
                body=f'<!doctype html><body style="margin:0"><iframe id="f" src="{path}" '
                f'style="border:0;width:{frame_width}px;height:{screen[1] - 120}px"></iframe></body>',
            ),
        )
        page.goto(host)
        frame = page.frame_locator("#f")
        frame.locator("table.checkpoints tbody tr").first.wait_for()
        inner = next(f for f in page.frames if f.url.endswith(path))
        m = inner.evaluate(MEASURE)
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        name = path.strip("/").replace("/", "-")
        page.screenshot(path=str(ARTIFACTS / f"{name}-{screen[0]}x{screen[1]}.png"))
    finally:
        context.close()

    assert m["width"] == frame_width
    assert m["scrollWidth"] <= m["width"], f"the page scrolls sideways: {m['scrollWidth']} > {m['width']}"
    assert "Error" in m["headers"] and "Run" in m["headers"] and "Lease holder" in m["headers"]
    for cell in m["cells"]:
        assert cell["left"] >= 0 and cell["right"] <= m["width"] + 0.5, f"outside the frame: {cell}"
        if cell["tag"] == "TH":
            assert cell["width"] >= 40, f"column too narrow to read: {cell}"
        if "cut" in cell["cls"].split() and cell["scroll"] > cell["client"]:
            # Cut with an ellipsis: the tooltip carries the whole value.
            assert cell["title"] and cell["title"].strip() == cell["text"], cell
    errors = [c for c in m["cells"] if c["tag"] == "TD" and "error" in c["cls"].split()]
    assert errors and min(c["width"] for c in errors) >= 120, "the error column is squeezed out"
    if path.endswith(DAG_A) or path.endswith("sales_a"):
        hostile = [c for c in errors if "checksum mismatch" in c["text"]]
        assert hostile, "the long error is shown (wrapped), not hidden"
