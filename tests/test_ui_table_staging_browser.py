"""Issue 25 item 1 in headless Chromium (1,280x800): no false error on table targets.

An Iceberg or Delta target stages inside its table (``<location>/_walsink_staging``),
not under the connection's staging root. Before the fix the checkpoint page of a
SEALED or DURABLE table checkpoint looked under the connection's root and showed a
red "manifest … does not exist (the write phase has not sealed it)" instead of its
committables.

The world is ``tests/test_ui_staging_root.py``'s (a DURABLE Delta and a SEALED Iceberg
checkpoint registered with their table's own staging root, two committables each),
served over HTTP on a loopback port; one browser page opens each checkpoint page and
checks what a user sees: the committables listed (count and file names), and nothing
red and no "does not exist" anywhere on the page. (The checkpoint page does not show
the staging root; the API test checks the recorded root.) Screenshots go to
``test-artifacts/ui-table-staging/``.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from test_ui_layout import browser  # noqa: F401 - the shared Chromium fixture
from test_ui_staging_root import (
    FILES,
    KEY,
    TABLES,
    world,  # noqa: F401 - the DURABLE Delta / SEALED Iceberg world
)
from ui_fixtures import serve_on_loopback

pytestmark = [pytest.mark.airflow, pytest.mark.browser]

ARTIFACTS = Path(__file__).resolve().parent.parent / "test-artifacts" / "ui-table-staging"
SCREEN = {"width": 1280, "height": 800}
RED = "rgb(211, 47, 47)"  # --failed: the colour of errors and of the "unavailable" notice

#: Runs in the page: every element painted in the failure red (text, border or background).
RED_ELEMENTS = """(red) => [...document.querySelectorAll('body *')].filter(e => {
  const s = getComputedStyle(e);
  if (s.display === 'none' || s.visibility === 'hidden') return false;
  const borders = ['Top', 'Right', 'Bottom', 'Left'].some(
    side => parseFloat(s['border' + side + 'Width']) > 0 && s['border' + side + 'Color'] === red);
  return s.color === red || s.backgroundColor === red || borders;
}).map(e => `${e.tagName}.${e.className}: ${e.innerText.trim().slice(0, 200)}`)"""


@pytest.fixture(scope="module")
def page(world, browser):  # noqa: F811
    """One Chromium page at 1,280x800, logged in as admin, on the world's app over HTTP."""
    with serve_on_loopback(world.app) as base:
        context = browser.new_context(viewport=SCREEN, base_url=base)
        context.add_cookies([{"name": "_token", "value": world.tokens["admin"], "url": base}])
        try:
            yield context.new_page()
        finally:
            context.close()


@pytest.mark.parametrize("kind", sorted(TABLES))
def test_a_table_checkpoint_page_lists_its_committables_without_a_false_error(page, kind):
    pipeline, state = TABLES[kind]
    response = page.goto(f"/walsink/pipelines/{pipeline}/checkpoints/{KEY}")
    assert response is not None and response.status == 200
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / f"checkpoint-{kind}-{state.lower()}.png"), full_page=True)

    assert page.locator("h1 .badge").first.inner_text() == state
    text = page.locator("body").inner_text()
    # No missing-manifest notice (nor any other notice) where the committables belong.
    assert page.locator("#committables-status").count() == 0, page.locator(
        "#committables-status"
    ).inner_text()
    assert "does not exist" not in text
    assert "has not sealed" not in text
    assert page.locator(".error, .failure, .status-unavailable").count() == 0
    assert page.evaluate(RED_ELEMENTS, RED) == []
    # The committables, as listed in the sealed manifest of the table's own staging root.
    assert f"{len(FILES)} committables in the sealed manifest of attempt 1" in text
    rows = page.locator("table.committables tbody tr")
    assert rows.count() == len(FILES)
    assert sorted(rows.locator("td.path:first-child").all_inner_texts()) == sorted(FILES)
    assert rows.first.locator("td.path").first.is_visible()
