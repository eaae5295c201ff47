"""``dag.test()`` of the example DAGs re-run over committed intervals: ``skip`` ends the write
task skipped and changes nothing; ``replace`` (asked by the run's conf, as a backfill's
``--dag-run-conf`` does) writes a new version that supersedes the committed one, with real Spark.

The same through the real scheduler and ``airflow backfill create``: tests/test_e2e_backfill.py.
"""

from __future__ import annotations

from datetime import UTC, date, datetime
from pathlib import Path

import pytest

from tests.test_example_dags import (  # noqa: F401 - fixtures
    committer_url,
    examples,
    load_dag,
    read_target,
    walsink_env,
)

pytestmark = [pytest.mark.spark, pytest.mark.airflow, pytest.mark.slow]

REPLACE = {"walsink_reprocess": "replace"}


def run(dag, day: date, conf: dict | None = None) -> dict[str, str]:
    from airflow.utils.state import DagRunState

    dr = dag.test(logical_date=datetime(day.year, day.month, day.day, tzinfo=UTC), run_conf=conf)
    states = {ti.task_id.rpartition(".")[2]: ti.state for ti in dr.get_task_instances()}
    assert dr.state == DagRunState.SUCCESS, states
    return states


def _rewrite_csv(path: Path, keep: int) -> list[str]:
    """The "fixed" input of a day: its header and first ``keep`` rows; returns their event ids."""
    lines = path.read_text().splitlines(keepends=True)
    path.write_text("".join(lines[: keep + 1]))
    return [line.split(",", 1)[0] for line in lines[1 : keep + 1]]


@pytest.mark.parametrize("committer_url", ["sqlite"], indirect=True)
def test_overwrite_example_skip_then_replace(airflow_db, walsink_env, committer_url):  # noqa: F811
    dag = load_dag(airflow_db, "walsink_daily_overwrite")
    store, home = walsink_env["store"], walsink_env["home"]
    day, other = date(2026, 4, 1), date(2026, 4, 2)
    key = f"{day:%Y%m%d}T000000Z"
    run(dag, day)
    run(dag, other)
    v1 = store.require("daily_events", key)
    target = home / "target/daily_events"
    assert {r["event_id"] for r in read_target(target) if str(r["dt"]) == day.isoformat()} == {
        e["event_id"] for e in examples.daily_events(day)
    }

    # A fix upstream: the day's input is now smaller. A plain re-run skips, loudly.
    kept = _rewrite_csv(examples.daily_events_path(home / "raw/daily_events", day), keep=300)
    before = sorted(p.name for p in target.rglob("*.parquet"))
    states = run(dag, day)
    assert states == {"write": "skipped", "durable": "skipped", "commit": "skipped"}
    assert sorted(p.name for p in target.rglob("*.parquet")) == before
    assert store.require("daily_events", key) == v1

    # Reprocess with replace: the interval now holds the new version only, exactly once.
    states = run(dag, day, REPLACE)
    assert states == {"write": "success", "durable": "success", "commit": "success"}
    rows = read_target(target)
    got = [r["event_id"] for r in rows if str(r["dt"]) == day.isoformat()]
    assert sorted(got) == sorted(kept) and len(got) == len(set(got)) == 300
    # The other day is untouched.
    assert sorted(r["event_id"] for r in rows if str(r["dt"]) == other.isoformat()) == sorted(
        e["event_id"] for e in examples.daily_events(other)
    )
    v2 = store.require("daily_events", key)
    assert (v2.state.value, v2.version, v2.rows) == ("COMMITTED", 2, 300)
    [old] = store.versions("daily_events", key)
    assert old.state.value == "SUPERSEDED" and old.attempt_id == v1.sealed_attempt_id
    assert old.superseded_by_attempt_id == v2.sealed_attempt_id and old.rows == v1.rows


@pytest.mark.parametrize("committer_url", ["sqlite"], indirect=True)
def test_append_example_replace_rereads_exactly_the_replaced_input(airflow_db, walsink_env, committer_url):  # noqa: F811
    dag = load_dag(airflow_db, "walsink_incremental_append")
    store, home = walsink_env["store"], walsink_env["home"]
    first, second = date(2026, 5, 1), date(2026, 5, 2)
    run(dag, first)
    run(dag, second)
    key = f"{first:%Y%m%d}T000000Z"
    v1 = store.require("incoming_events", key)
    names = examples.arrival_file_names(datetime(first.year, first.month, first.day))
    later = examples.arrival_file_names(datetime(second.year, second.month, second.day))

    # Correct one file of the first interval (its first record's value), then reprocess it.
    fixed = home / "raw/incoming" / names[0]
    text = fixed.read_text().splitlines(keepends=True)
    fixed.write_text("".join(text[1:]))  # the first record was bad: dropped
    states = run(dag, first, REPLACE)
    assert states["write"] == "success" and states["commit"] == "success"

    v2 = store.require("incoming_events", key)
    assert (v2.version, v2.start_offsets, v2.end_offsets) == (2, v1.start_offsets, v1.end_offsets)
    assert [v.state.value for v in store.versions("incoming_events", key)] == ["SUPERSEDED"]
    # Every record once: the first interval's new version (without the dropped record) and the
    # second interval's rows, which the reprocess did not read again.
    expected = {
        (n, r["line"], r["user_id"], r["value"])
        for n in names + later
        for r in examples.arrival_records(n)
        if not (n == names[0] and r["line"] == 0)
    }
    got = [
        (r["file"], r["line"], r["user_id"], r["value"]) for r in read_target(home / "target/incoming_events")
    ]
    assert len(got) == len(set(got)) == len(expected)
    assert set(got) == expected
    assert store.last_committed_offsets("incoming_events") == {"incoming": later[-1]}
