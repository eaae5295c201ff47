"""Benchmark 5: commit-state API latency on a committer table of 1,000,000 checkpoints.

Set-up (not timed): a private PostgreSQL database migrated by the store, then
1,000,000 checkpoint rows bulk-loaded with ``COPY`` (10 pipelines x 100,000,
mostly COMMITTED, a tail of DURABLE/FAILED/WRITING as a running backfill
leaves it) and ``ANALYZE``. A private Airflow home (SQLite metadata, migrated
by ``airflow db migrate``) gives the real api app: ``create_app()`` mounts the
plugin through the plugin loader, SimpleAuthManager checks a real JWT from
``POST /auth/token`` on every request.

Timed, interleaved in rounds, each request through the whole app in-process
(Starlette TestClient: routing, JWT, per-DAG authorization, store query,
JSON): the list API's first page, a deep keyset page, a state-filtered page,
one checkpoint's detail and the pipelines overview. Baselines from the same
run: the raw indexed SQL of the list page on the same engine (the database
floor), and Airflow's own ``GET /api/v2/version`` through the same client (the
HTTP + auth floor). Goal: list p95 < 100 ms. Nothing asserts on a timing.

    .venv/bin/python -m bench.bench_api [--rows 1000000] [--requests 200]
"""

from __future__ import annotations

import argparse
import io
import os
import random
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from datetime import datetime, timedelta
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    __package__ = "bench"

from bench.common import Table, fmt_s, machine, pg_server_version, private_pg_database, remove  # noqa: E402

PIPELINES = 10
DAG_ID = "bench_api_dag"
PAGE = 100
COLUMNS = (
    "pipeline",
    "checkpoint_key",
    "sequence",
    "state",
    "attempt",
    "sealed_attempt",
    "manifest_digest",
    "committables",
    "rows",
    "bytes",
    "error",
    "dag_id",
    "run_id",
    "created_at",
    "updated_at",
    "sealed_at",
    "durable_at",
    "committed_at",
)


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))
    return ordered[index]


def load(url: str, rows: int) -> dict[str, int]:
    """COPY ``rows`` checkpoints into the table; return {pipeline: max sequence}."""
    from sqlalchemy import create_engine, text

    from airflow_provider_walsink.committer import CommitterStore

    CommitterStore.from_url(url).dispose()  # migrate
    per = rows // PIPELINES
    start = datetime(2020, 1, 1)
    engine = create_engine(url)
    raw = engine.raw_connection()
    try:
        cur = raw.cursor()
        for p in range(PIPELINES):
            name = f"bench_p{p}"
            cur.execute(
                "INSERT INTO walsink_pipeline (name, mode, target, dag_id, next_sequence, created_at) "
                "VALUES (%s, 'overwrite', %s, %s, %s, %s)",
                (name, f"/data/{name}", DAG_ID, per + 1, start),
            )
            buf = io.StringIO()
            for seq in range(1, per + 1):
                created = start + timedelta(hours=seq)
                tail = per - seq
                if tail < 20:
                    state = ("WRITING", "DURABLE", "FAILED", "SEALED")[tail % 4]
                elif seq % 5000 == 0:
                    state = "FAILED"
                else:
                    state = "COMMITTED"
                sealed = created + timedelta(seconds=40) if state != "WRITING" else None
                durable = sealed + timedelta(seconds=3) if state in ("DURABLE", "COMMITTED") else None
                committed = durable + timedelta(seconds=2) if state == "COMMITTED" else None
                error = "checksum mismatch in part-00003.parquet" if state == "FAILED" else None
                values = (
                    name,
                    created.strftime("%Y%m%dT%H%M%SZ"),
                    seq,
                    state,
                    1,
                    1 if sealed else None,
                    "sha256:" + "ab" * 32 if sealed else None,
                    8,
                    100_000,
                    12_345_678,
                    error,
                    DAG_ID,
                    f"backfill__{created.isoformat()}",
                    created,
                    committed or durable or sealed or created,
                    sealed,
                    durable,
                    committed,
                )
                buf.write("\t".join("\\N" if v is None else str(v) for v in values) + "\n")
            buf.seek(0)
            cur.copy_expert(f"COPY walsink_checkpoint ({', '.join(COLUMNS)}) FROM STDIN", buf)
        raw.commit()
        cur.close()
    finally:
        raw.close()
    with engine.connect() as conn:
        # VACUUM sets the visibility map as autovacuum would on a live table, so
        # the per-state counts can be index-only scans.
        conn.execution_options(isolation_level="AUTOCOMMIT").execute(text("VACUUM ANALYZE"))
    engine.dispose()
    return {f"bench_p{p}": per for p in range(PIPELINES)}


def airflow_home(root: Path, committer_url: str) -> None:
    """Point this process's Airflow at a private home before Airflow is imported."""
    os.environ.update(
        {
            "AIRFLOW_HOME": str(root),
            "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{root}/airflow.db",
            "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
            "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS": "admin:admin",
            "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE": str(root / "passwords.json"),
            "AIRFLOW__LOGGING__LOGGING_LEVEL": "WARNING",
            "AIRFLOW__WALSINK__UI_CONN_ID": "walsink_bench",
            "AIRFLOW_CONN_WALSINK_BENCH": (
                '{"conn_type": "walsink", "extra": {"url": "%s"}}' % committer_url  # noqa: UP031
            ),
        }
    )
    subprocess.run(
        [sys.executable, "-m", "airflow", "db", "migrate"],
        check=True,
        capture_output=True,
        env=os.environ.copy(),
    )


def run(rows: int, requests: int) -> Table:
    scratch = Path(tempfile.mkdtemp(prefix="walsink-bench-api-"))
    try:
        with private_pg_database() as url:
            t0 = time.perf_counter()
            maxima = load(url, rows)
            load_s = time.perf_counter() - t0
            airflow_home(scratch, url)
            return measure(url, maxima, requests, rows, load_s)
    finally:
        remove(scratch)


def measure(url: str, maxima: dict[str, int], requests: int, rows: int, load_s: float) -> Table:
    from airflow.api_fastapi.app import create_app
    from airflow.api_fastapi.auth.managers.simple.simple_auth_manager import SimpleAuthManager
    from fastapi.testclient import TestClient
    from sqlalchemy import create_engine, text

    rng = random.Random(5)
    engine = create_engine(url)
    app = create_app(apps="core")
    raw_sql = text(
        "SELECT * FROM walsink_checkpoint WHERE pipeline = :p AND sequence < :s ORDER BY sequence DESC LIMIT :n"
    )
    with TestClient(app, base_url="http://127.0.0.1") as client:
        password = SimpleAuthManager.get_passwords()["admin"]
        token = client.post("/auth/token", json={"username": "admin", "password": password}).json()[
            "access_token"
        ]
        headers = {"Authorization": f"Bearer {token}"}

        def api(path: str, **params: object) -> Callable[[], None]:
            def call() -> None:
                response = client.get(path, params=params or None, headers=headers)
                if response.status_code != 200:
                    raise RuntimeError(f"GET {path} -> {response.status_code}: {response.text[:300]}")

            return call

        def deep_page() -> None:
            p = f"bench_p{rng.randrange(PIPELINES)}"
            api(f"/walsink/api/pipelines/{p}/checkpoints", limit=PAGE, before=rng.randrange(2, maxima[p]))()

        def raw_page() -> None:
            p = f"bench_p{rng.randrange(PIPELINES)}"
            with engine.connect() as conn:
                conn.execute(raw_sql, {"p": p, "s": rng.randrange(2, maxima[p]), "n": PAGE + 1}).all()

        def detail() -> None:
            p = f"bench_p{rng.randrange(PIPELINES)}"
            key = (datetime(2020, 1, 1) + timedelta(hours=rng.randrange(1, maxima[p]))).strftime(
                "%Y%m%dT%H%M%SZ"
            )
            api(f"/walsink/api/pipelines/{p}/checkpoints/{key}")()

        cases: dict[str, Callable[[], None]] = {
            "list API, first page (100)": api("/walsink/api/pipelines/bench_p0/checkpoints", limit=PAGE),
            "list API, deep keyset page (100)": deep_page,
            "list API, state=FAILED (100)": api(
                "/walsink/api/pipelines/bench_p1/checkpoints", state="FAILED"
            ),
            "checkpoint detail API": detail,
            "pipelines overview API (10 pipelines)": api("/walsink/api/pipelines"),
            "baseline: raw indexed SQL, deep page": raw_page,
            "baseline: Airflow GET /api/v2/version": api("/api/v2/version"),
        }
        for call in cases.values():  # warm-up: connections, caches, first-call imports
            for _ in range(5):
                call()
        timings: dict[str, list[float]] = {name: [] for name in cases}
        overview_every = 10  # the overview counts over 1M rows: sample it less often
        for i in range(requests):
            for name, call in cases.items():
                if name.startswith("pipelines overview") and i % overview_every:
                    continue
                start = time.perf_counter()
                call()
                timings[name].append(time.perf_counter() - start)

    with engine.connect() as conn:
        plan = (
            conn.execute(
                text("EXPLAIN " + raw_sql.text),
                {"p": "bench_p3", "s": maxima["bench_p3"] // 2, "n": PAGE + 1},
            )
            .scalars()
            .all()
        )
    engine.dispose()

    raw_p50 = percentile(timings["baseline: raw indexed SQL, deep page"], 50)
    http_p50 = percentile(timings["baseline: Airflow GET /api/v2/version"], 50)
    table = Table(
        f"Commit-state API latency, {rows:,} checkpoints on PostgreSQL {pg_server_version(url)}",
        ["request", "n", "p50", "p95", "p50 / raw SQL p50", "p50 / Airflow /version p50"],
    )
    for name, values in timings.items():
        p50, p95 = percentile(values, 50), percentile(values, 95)
        table.rows.append(
            [name, len(values), fmt_s(p50), fmt_s(p95), f"{p50 / raw_p50:.1f}x", f"{p50 / http_p50:.1f}x"]
        )
    list_p95 = max(percentile(timings[n], 95) for n in cases if n.startswith("list API"))
    table.notes += [
        f"Goal: list API p95 < 100 ms; measured worst list p95 {fmt_s(list_p95)} "
        f"({'met' if list_p95 < 0.1 else 'NOT met'}).",
        f"Load: {rows:,} rows by COPY + VACUUM ANALYZE in {load_s:.1f} s (not timed above).",
        "Each API request goes through Airflow's api app in-process: JWT check, per-DAG authorization "
        "(auth manager), store query, JSON. Requests are interleaved round by round.",
        "Plan of the list query: " + " → ".join(line.strip() for line in plan[:2]),
    ]
    return table


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--requests", type=int, default=200)
    args = parser.parse_args(argv)
    print(
        machine(
            tempfile.gettempdir(), {"command": "python -m bench.bench_api " + " ".join(sys.argv[1:])}
        ).render()
    )
    print()
    print(run(args.rows, args.requests).render(), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
