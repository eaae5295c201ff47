"""Issue 24, large histories: the overview and ``walsink status`` page through many pipelines
by keyset, completely (no duplicates, no gaps, stable while pipelines are added), and the
batched summaries, writers and blockers they read agree with a plain count of the rows.

Against SQLite, PostgreSQL and MariaDB (the ``store`` fixture's backends); the API test
runs the real Airflow api app as tests/test_ui_api.py does. Nothing here is timed: the
latency is benchmark 5 (bench/bench_api.py).
"""

from __future__ import annotations

import json
from collections import Counter

import pytest
from helpers import ACTOR
from sqlalchemy import func, select, update

from airflow_provider_walsink.core.protocol.states import ERROR_STATES
from airflow_provider_walsink.core.store import Actor
from airflow_provider_walsink.core.store.models import checkpoint_table as ckpt

#: The states the fill cycles through (every kind: committed, open, error).
STATES = ["COMMITTED", "FAILED", "WRITING", "DURABLE", "ABORTED", "REGISTERED", "SEALED", "REJECTED"]


def _fill(store, count: int, *, prefix: str = "p") -> list[str]:
    """``count`` pipelines with 0 to 3 checkpoints in varied states; some written by two DAGs."""
    names = []
    for i in range(count):
        name = f"{prefix}{i:03d}"
        names.append(name)
        mode = "append" if i % 2 else "overwrite"
        for j in range(i % 4):
            dag = "dag_b" if (i % 5 == 0 and j == 1) else "dag_a"
            # Registered by the owner; the row then says which DAG wrote it (as after a hand-over).
            actor = Actor(name="t", dag_id="dag_a", run_id=f"r{j}", task_id="write", try_number=1)
            store.register(name, f"k{j}", mode=mode, actor=actor)
            state = STATES[(i + j) % len(STATES)]
            with store.engine.begin() as conn:
                conn.execute(
                    update(ckpt)
                    .where(ckpt.c.pipeline == name, ckpt.c.checkpoint_key == f"k{j}")
                    .values(state=state, dag_id=dag)
                )
        if i % 4 == 0:  # a pipeline with no checkpoint yet still has its row
            from airflow_provider_walsink.core.store.models import pipeline_table as pipe
            from airflow_provider_walsink.core.store.store import utcnow

            with store.engine.begin() as conn:
                conn.execute(pipe.insert().values(name=name, mode=mode, next_sequence=1, created_at=utcnow()))
    return names


def _pages(fetch, limit: int) -> list[list[str]]:
    pages, cursor = [], None
    while True:
        page = fetch(cursor, limit)
        if not page:
            return pages
        pages.append(page)
        cursor = page[-1]


def test_pipeline_pages_are_complete_without_duplicates_and_stable_while_pipelines_are_added(store):
    names = _fill(store, 23)
    seen: list[str] = []
    cursor = None
    added = []
    while True:
        page = [r["name"] for r in store.pipeline_page(after=cursor, limit=5)]
        if not page:
            break
        seen += page
        cursor = page[-1]
        if len(seen) == 10:  # between pages: one pipeline before the cursor, one after it
            for name in ("a_before", "z_after"):
                store.register(name, "k", mode="overwrite", actor=ACTOR)
                added.append(name)
    assert len(seen) == len(set(seen)), "a pipeline was listed twice"
    # Every pipeline present from the start is listed once; one added after the cursor too;
    # one added behind the cursor belongs to a page already read (a keyset page never shifts).
    assert set(names) | {"z_after"} == set(seen)
    ordered = [r["name"] for r in store.pipeline_page(limit=1000)]
    assert seen == [n for n in ordered if n != "a_before"], "pages are not in the store's own order"
    with pytest.raises(ValueError, match="limit must be at least 1"):
        store.pipeline_page(limit=0)


def test_batched_summaries_writers_and_blockers_agree_with_plain_counts(store):
    names = _fill(store, 30)
    summaries = store.pipeline_summaries(names + ["no_such_pipeline"])
    writers = store.pipeline_writers(names)
    heads = store.wait_heads(names)
    with store.engine.connect() as conn:
        rows = conn.execute(select(ckpt.c.pipeline, ckpt.c.state, ckpt.c.sequence, ckpt.c.dag_id)).all()
        assert conn.execute(select(func.count()).select_from(ckpt)).scalar_one() == len(rows)
    assert summaries["no_such_pipeline"] == {
        "counts": {},
        "retired": 0,
        "latest_committed": None,
        "last_error": None,
    }
    for name in names:
        mine = [r for r in rows if r.pipeline == name]
        assert summaries[name]["counts"] == dict(Counter(r.state for r in mine)), name
        committed = max((r.sequence for r in mine if r.state == "COMMITTED"), default=None)
        latest = summaries[name]["latest_committed"]
        assert (latest.sequence if latest else None) == committed, name
        errors = {s.value for s in ERROR_STATES}
        failed = max((r.sequence for r in mine if r.state in errors), default=None)
        last_error = summaries[name]["last_error"]
        assert (last_error.sequence if last_error else None) == failed, name
        assert writers[name] == {r.dag_id for r in mine if r.dag_id}, name
        mode, first_open = heads[name]
        assert mode == ("append" if int(name[1:]) % 2 else "overwrite")
        expected = store.first_open(name) if mode == "append" else None
        assert (first_open.sequence if first_open else None) == (expected.sequence if expected else None), (
            name
        )
    assert any(len(w) == 2 for w in writers.values()), "no pipeline with two writers was exercised"


def test_newest_checkpoints_of_a_page_match_the_keyset_query_also_after_retention(store):
    names = _fill(store, 16)
    with store.engine.begin() as conn:  # retention removed some of p007's newest rows
        conn.execute(ckpt.delete().where(ckpt.c.pipeline == "p007", ckpt.c.sequence == 2))
    for limit in (1, 2, 5):
        newest = store.newest_checkpoints(names, limit)
        for name in names:
            expected = [r.sequence for r in store.checkpoints(name, limit=limit, descending=True)]
            assert [r.sequence for r in newest[name]] == expected, (name, limit)


def test_pipelines_in_states_are_those_with_such_a_checkpoint(store):
    _fill(store, 20)
    with store.engine.connect() as conn:
        rows = conn.execute(select(ckpt.c.pipeline, ckpt.c.state)).all()
    for states in (["FAILED"], ["WRITING", "DURABLE"], ["COMMITTED"], []):
        assert store.pipelines_in_states(states) == sorted({p for p, s in rows if s in states}), states


def test_uncommitted_keyset_pages_cover_every_open_checkpoint_once(store):
    _fill(store, 30)
    with store.engine.connect() as conn:
        expected = {
            (r.pipeline, r.sequence)
            for r in conn.execute(select(ckpt.c.pipeline, ckpt.c.sequence, ckpt.c.state))
            if r.state not in ("COMMITTED", "ABORTED", "SUPERSEDED")
        }
    assert len(expected) > 10
    seen = []
    cursor = None
    while True:
        page = store.uncommitted(None, limit=4, after=cursor)
        seen += [(r.pipeline, r.sequence) for r in page]
        if len(page) < 4:
            break
        cursor = (page[-1].created_at, page[-1].pipeline, page[-1].sequence)
    assert len(seen) == len(set(seen)) and set(seen) == expected


def test_status_of_many_pipelines_is_paged_with_a_hint_and_complete(store, capsys):
    from airflow_provider_walsink.cli import commands as cli

    names = _fill(store, 45)
    url = store.engine.url.render_as_string(hide_password=False)

    def status(*args: str) -> tuple[int, str, str]:
        code = cli.main(["--url", url, "status", *args])
        captured = capsys.readouterr()
        return code, captured.out, captured.err

    code, out, _ = status()
    assert code == 0
    listed = [line.split()[1] for line in out.splitlines() if line.startswith("pipeline ")]
    assert len(listed) == cli.STATUS_PIPELINES
    assert out.splitlines()[-1].startswith(f"... more pipelines after {listed[-1]!r}, not shown")
    assert f"walsink status --after {listed[-1]}" in out.splitlines()[-1]

    seen: list[str] = []
    cursor: str | None = None
    while True:
        code, out, err = status("--json", "--pipelines", "7", *(("--after", cursor) if cursor else ()))
        assert code == 0
        page = json.loads(out)  # stdout holds only the JSON, the hint goes to stderr
        if not page:
            break
        seen += [p["pipeline"] for p in page]
        cursor = page[-1]["pipeline"]
        if len(page) == 7 and "more pipelines" not in err:
            break  # the last full page says nothing more
    assert len(seen) == len(set(seen)) and set(seen) == set(names)
    code, out, _ = status("--after", cursor)
    assert code == 0 and "no pipelines after" in out


@pytest.fixture(scope="module")
def world(airflow_db, tmp_path_factory):
    from ui_fixtures import build_world

    tmp = tmp_path_factory.mktemp("ui-many")
    with pytest.MonkeyPatch.context() as mp:
        yield from build_world(f"sqlite:///{tmp}/committer.db", tmp, mp)


@pytest.mark.airflow
def test_overview_api_pages_only_readable_pipelines_completely_while_pipelines_are_added(world):
    """The overview answers a page of pipelines and a cursor; paging with it lists each
    pipeline the user may read once (none other), whatever lies between them, and a
    pipeline registered meanwhile after the cursor shows up on a later page."""
    from ui_fixtures import DAG_A, DAG_B

    def register(name: str, dag_id: str) -> None:
        actor = Actor(name="t", dag_id=dag_id, run_id="r", task_id="write", try_number=1)
        world.store.register(name, "k1", mode="overwrite", actor=actor)

    for i in range(12):
        register(f"m_a{i:02d}", DAG_A)
        register(f"m_b{i:02d}", DAG_B)  # interleaved in name order with alice's: filtered per batch
    alice = world.headers("alice")

    def overview(user_headers, **params) -> dict:
        response = world.client.get("/walsink/api/pipelines", params=params, headers=user_headers)
        assert response.status_code == 200, response.text
        return response.json()

    seen: list[str] = []
    cursor = None
    pages = 0
    while True:
        body = overview(alice, limit=4, **({"after": cursor} if cursor else {}))
        names = [p["pipeline"] for p in body["pipelines"]]
        assert len(names) <= 4 and body["total_entries"] == len(names)
        seen += names
        pages += 1
        if pages == 2:
            register("m_a99", DAG_A)  # after the cursor: must appear
            register("a_early", DAG_A)  # before it: on a page already read
        cursor = body["next_after"]
        if cursor is None:
            break
        assert cursor == names[-1]
    expected = {f"m_a{i:02d}" for i in range(12)} | {"sales_a", "m_a99"}
    assert len(seen) == len(set(seen)), "a pipeline was listed twice"
    assert set(seen) == expected
    assert pages == 4  # 14 readable pipelines in pages of 4: the last one says there is no next
    first = overview(world.headers("admin"), limit=500)
    assert first["next_after"] is None and {p["pipeline"] for p in first["pipelines"]} >= expected
    assert world.client.get("/walsink/api/pipelines", params={"limit": 0}, headers=alice).status_code == 422
    page = world.client.get("/walsink/", params={"limit": 3}, headers=alice)
    assert page.status_code == 200 and "Next pipelines" in page.text


def test_page_queries_use_indexes_not_a_scan_of_the_history_on_postgresql(pg_url):
    """On 100,000 checkpoints (analyzed), EXPLAIN of every statement the overview, the status
    page and "not committed" send shows no sequential scan of the checkpoint table: the
    planner would choose one if a statement needed the history. A plan shape, not a timing."""
    from sqlalchemy import event, text

    from airflow_provider_walsink.core.store import CommitterStore

    store = CommitterStore.from_url(pg_url)
    with store.engine.begin() as conn:
        conn.execute(
            text(
                "INSERT INTO walsink_pipeline (name, mode, dag_id, next_sequence, retired, created_at) "
                "SELECT 'p' || lpad(i::text, 3, '0'), CASE WHEN i % 2 = 0 THEN 'append' ELSE 'overwrite' END, "
                "'dag_' || (i % 7), 501, 0, now() FROM generate_series(0, 199) i"
            )
        )
        conn.execute(
            text(
                "INSERT INTO walsink_checkpoint (pipeline, checkpoint_key, sequence, state, attempt, dag_id, "
                "created_at, updated_at, lease_epoch, version) "
                "SELECT 'p' || lpad(i::text, 3, '0'), 'k' || s, s, "
                "CASE WHEN s = 500 THEN 'WRITING' WHEN s % 97 = 0 THEN 'FAILED' ELSE 'COMMITTED' END, 1, "
                "'dag_' || (i % 7), now() - (501 - s) * interval '1 hour', now(), 1, 1 "
                "FROM generate_series(1, 500) s, generate_series(0, 199) i"
            )
        )
    with store.engine.connect() as conn:
        conn.execution_options(isolation_level="AUTOCOMMIT").execute(
            text("VACUUM ANALYZE walsink_checkpoint")
        )
    statements: list[tuple[str, object]] = []

    def capture(conn, cursor, statement, parameters, context, executemany) -> None:
        if statement.lstrip().upper().startswith("SELECT"):
            statements.append((statement, parameters))

    page = [r["name"] for r in store.pipeline_page(after="p050", limit=100)]
    event.listen(store.engine, "before_cursor_execute", capture)
    try:
        store.pipeline_page(after="p050", limit=100)
        store.pipeline_summaries(page)
        store.pipeline_writers(page)
        store.wait_heads(page)
        store.newest_checkpoints(page, 10)
        store.uncommitted(None, limit=100)
        store.pipelines_in_states(["FAILED", "WRITING"])
    finally:
        event.remove(store.engine, "before_cursor_execute", capture)
    assert len(statements) >= 9
    with store.engine.connect() as conn:
        for statement, parameters in statements:
            plan = "\n".join(conn.exec_driver_sql("EXPLAIN " + statement, parameters).scalars())
            assert "Seq Scan on walsink_checkpoint" not in plan, f"{statement}\n{plan}"
    store.dispose()
