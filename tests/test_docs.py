"""The docs check: every relative link in README.md and docs/ resolves (files, and the
heading anchors they point at), and every ```python snippet in them compiles.

Markdown is parsed with markdown-it (installed with Airflow), so links inside code
blocks and code spans are not mistaken for links, and reference-style links count.
"""

from __future__ import annotations

import re
from pathlib import Path
from urllib.parse import unquote, urlsplit

import pytest
from markdown_it import MarkdownIt

REPO = Path(__file__).resolve().parent.parent
PAGES = sorted([REPO / "README.md", *(REPO / "docs").glob("**/*.md")])
_md = MarkdownIt("commonmark")


def _rel(page: Path) -> str:
    return str(page.relative_to(REPO))


def _tokens(page: Path):
    def walk(tokens):
        for token in tokens:
            yield token
            yield from walk(token.children or [])

    return list(walk(_md.parse(page.read_text(encoding="utf-8"))))


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to dashes."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def _anchors(page: Path) -> set[str]:
    tokens = _tokens(page)
    seen: dict[str, int] = {}
    out = set()
    for i, token in enumerate(tokens):
        if token.type == "heading_open":
            slug = _slug(tokens[i + 1].content)
            n = seen.get(slug, 0)
            seen[slug] = n + 1
            out.add(slug if n == 0 else f"{slug}-{n}")
    return out


def _links(page: Path) -> list[str]:
    out = []
    for token in _tokens(page):
        if token.type == "link_open":
            out.append(token.attrs.get("href", ""))
        elif token.type == "image":
            out.append(token.attrs.get("src", ""))
    return out


def _relative(href: str) -> bool:
    parts = urlsplit(href)
    return not parts.scheme and not parts.netloc and not href.startswith("mailto:")


@pytest.mark.parametrize("page", PAGES, ids=_rel)
def test_relative_links_resolve(page):
    broken = []
    for href in filter(_relative, _links(page)):
        parts = urlsplit(href)
        target = (page.parent / unquote(parts.path)).resolve() if parts.path else page
        if not target.exists():
            broken.append(
                f"{href} (no {target.relative_to(REPO) if target.is_relative_to(REPO) else target})"
            )
        elif not target.is_relative_to(REPO):
            broken.append(f"{href} (outside the repository)")
        elif parts.fragment and target.suffix == ".md" and parts.fragment not in _anchors(target):
            broken.append(f"{href} (no heading #{parts.fragment} in {_rel(target)})")
    assert not broken, f"{_rel(page)}: broken links: {broken}"


def _python_snippets(page: Path) -> list[tuple[int, str]]:
    return [
        (token.map[0] + 1 if token.map else 0, token.content)
        for token in _tokens(page)
        if token.type == "fence" and token.info.strip().split(" ")[0].lower() in ("python", "py")
    ]


SNIPPETS = [(page, line, code) for page in PAGES for line, code in _python_snippets(page)]


@pytest.mark.parametrize(("page", "line", "code"), SNIPPETS, ids=[f"{_rel(p)}:{n}" for p, n, _ in SNIPPETS])
def test_python_snippets_compile(page, line, code):
    try:
        compile(code, f"{_rel(page)}:{line}", "exec")
    except SyntaxError as exc:
        pytest.fail(f"{_rel(page)}, snippet at line {line} does not compile: {exc}")


def test_the_check_finds_what_it_looks_for(tmp_path):
    """The check itself: a dead link, a dead anchor and a broken snippet are all noticed."""
    page = tmp_path / "page.md"
    (tmp_path / "there.md").write_text("# A heading\n")
    page.write_text(
        "[ok](there.md) [ok](there.md#a-heading) [dead](missing.md) [dead anchor](there.md#nope) "
        "[web](https://example.com) `[not a link](nowhere.md)`\n\n"
        "```python\nx = (\n```\n\n```python\nprint('fine')\n```\n"
    )
    hrefs = [h for h in _links(page) if _relative(h)]
    assert hrefs == ["there.md", "there.md#a-heading", "missing.md", "there.md#nope"]
    assert _anchors(tmp_path / "there.md") == {"a-heading"}
    snippets = _python_snippets(page)
    assert len(snippets) == 2
    with pytest.raises(SyntaxError):
        compile(snippets[0][1], "page.md", "exec")
    assert len(PAGES) >= 5 and SNIPPETS  # the real check looks at the real pages


def test_quickstart_dag_parses_as_written(tmp_path):
    """The quickstart's (and README's) DAG snippet, saved as the page says, is a DAG
    Airflow loads without import errors, with the three tasks the page describes. (The
    whole page, job included, runs through a real scheduler in
    ``tests/test_e2e_quickstart.py``.)"""
    from airflow.dag_processing.dagbag import DagBag

    snippets = [code for _, code in _python_snippets(REPO / "docs" / "quickstart.md")]
    dag_code = next(code for code in snippets if "walsink_pipeline(" in code)
    readme = [code for _, code in _python_snippets(REPO / "README.md")]
    assert any(dag_code.strip() in code for code in readme), (
        "README's DAG snippet drifted from the quickstart"
    )
    (tmp_path / "my_events.py").write_text(dag_code)
    bag = DagBag(dag_folder=str(tmp_path))
    assert bag.import_errors == {}
    assert sorted(bag.dags["my_events"].task_ids) == ["events.commit", "events.durable", "events.write"]
