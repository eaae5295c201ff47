"""Test helpers: stage and seal checkpoints without Spark, read back targets."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any, NoReturn

import pytest

from airflow_provider_walsink.core.commit import CheckpointWriter
from airflow_provider_walsink.core.staging.layout import StagingLayout
from airflow_provider_walsink.core.store import Actor, CommitterStore

REPO = Path(__file__).resolve().parent.parent
IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")


def missing_prerequisite(message: str) -> NoReturn:
    """A service or tool a test needs is absent: skip on a developer's machine, fail under CI.

    CI installs and starts everything the suite needs, so there a missing
    prerequisite is a broken run, never a silently smaller one.
    """
    if IN_CI:
        pytest.fail(f"{message} (CI=true: a missing prerequisite fails the run)")
    pytest.skip(message)


ACTOR = Actor(name="tests", dag_id="tests", run_id="run", task_id="task", try_number=1)


def stage_checkpoint(
    store: CommitterStore,
    layout: StagingLayout,
    pipeline: str,
    key: str,
    files: dict[str, bytes],
    *,
    mode: str = "overwrite",
    durable: bool = True,
    start_offsets: dict | None = None,
    end_offsets: dict | None = None,
    actor: Actor = ACTOR,
):
    """Register, write ``files`` (relative path → bytes) into a new attempt and seal it."""
    store.register(pipeline, key, mode=mode, actor=actor)
    writer = CheckpointWriter(store, layout, pipeline, key, actor=actor)
    attempt_dir = writer.begin(start_offsets=start_offsets)
    for rel, data in files.items():
        path = attempt_dir / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    writer.add_files(files, rows={rel: data.count(b"\n") for rel, data in files.items()}, writer="test-0")
    manifest, digest = writer.seal(start_offsets=start_offsets, end_offsets=end_offsets)
    if durable:
        store.mark_durable(pipeline, key, attempt=writer.attempt, actor=actor)
    return writer.record, manifest, attempt_dir


def stage_tables(
    store: CommitterStore,
    layout: StagingLayout,
    pipeline: str,
    key: str,
    tables: dict,
    *,
    file_format: str = "parquet",
    mode: str = "overwrite",
    durable: bool = True,
    partition_columns: tuple[str, ...] = (),
    actor: Actor = ACTOR,
):
    """:func:`stage_checkpoint` for data: each pyarrow table (relative path → table) is
    written as ``file_format`` (parquet, json lines or csv with a header) and counted."""
    import json

    import pyarrow.csv as pcsv
    import pyarrow.parquet as pq

    store.register(pipeline, key, mode=mode, actor=actor)
    writer = CheckpointWriter(store, layout, pipeline, key, actor=actor, partition_columns=partition_columns)
    attempt_dir = writer.begin()
    for rel, table in tables.items():
        path = attempt_dir / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        if file_format == "parquet":
            pq.write_table(table, path)
        elif file_format == "json":
            path.write_text("".join(json.dumps(row) + "\n" for row in table.to_pylist()))
        elif file_format == "csv":
            pcsv.write_csv(table, path)
        else:
            path.write_bytes(b"\0" * 16)  # a format nothing here reads
    writer.add_files(tables, rows={rel: t.num_rows for rel, t in tables.items()}, writer="test-0")
    manifest, _ = writer.seal(file_format=file_format)
    if durable:
        store.mark_durable(pipeline, key, attempt=writer.attempt, actor=actor)
    return writer.record, manifest, attempt_dir


def forget_checkpoint(store: CommitterStore, pipeline: str, key: str) -> None:
    """What retention does to a checkpoint's committer rows (its pipeline row too)."""
    from sqlalchemy import delete

    from airflow_provider_walsink.core.store.models import (
        checkpoint_table,
        pipeline_table,
        transition_table,
        version_table,
    )

    record = store.require(pipeline, key)
    with store.engine.begin() as conn:
        conn.execute(delete(transition_table).where(transition_table.c.checkpoint_id == record.id))
        conn.execute(delete(version_table).where(version_table.c.checkpoint_id == record.id))
        conn.execute(delete(checkpoint_table).where(checkpoint_table.c.id == record.id))
        conn.execute(delete(pipeline_table).where(pipeline_table.c.name == pipeline))


def target_files(root: Path) -> dict[str, bytes]:
    """Every visible data file under a target (bookkeeping and hidden files excluded)."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames if not d.startswith(("_", "."))]
        for name in filenames:
            if not name.startswith(("_", ".")):
                path = Path(dirpath) / name
                out[str(path.relative_to(root))] = path.read_bytes()
    return out


def python_spark_submit(directory: Path, application: Path) -> Path:
    """A stand-in ``spark-submit`` in ``directory`` that runs ``application`` with this Python and
    its arguments (spark-submit's command line is ``[binary, options..., application, args...]``):
    for tests of what a write task hands its job, without starting Spark."""
    import stat
    import sys

    submit = directory / "spark-submit"
    submit.write_text(
        f"#!{sys.executable}\nimport os, sys\nargs = sys.argv[1:]\ni = args.index({str(application)!r})\n"
        "os.execv(sys.executable, [sys.executable, *args[i:]])\n"
    )
    submit.chmod(submit.stat().st_mode | stat.S_IXUSR)
    return submit


#: Where ``scripts/setup.sh`` installs DuckDB's own Iceberg reader (``pip --target``, inside the
#: git-ignored ``.venv``): DuckDB 1.4.4 with its ``iceberg`` and ``avro`` extension packages. The
#: packaged extensions exist only for that release, not for the DuckDB 2.0 the project pins (and
#: the audit needs: ``ColumnExpression`` takes a name literally only from 2.0), so the reader runs
#: in a subprocess with this directory first on its path, never beside the project's DuckDB.
DUCKDB_ICEBERG_DIR = REPO / ".venv" / "duckdb-iceberg"

_ICEBERG_SCAN = """
import json, sys
from pathlib import Path
import duckdb, duckdb_ext
sql, params = json.loads(sys.argv[1])
extensions = Path(list(duckdb_ext.__path__)[0]) / "extensions"
con = duckdb.connect()
con.execute("SET autoinstall_known_extensions = false")  # offline: never downloads an extension
con.execute("SET extension_directory = ?", [str(extensions)])
con.execute("LOAD iceberg")
print(json.dumps([list(row) for row in con.execute(sql, params).fetchall()], default=str))
"""


def duckdb_iceberg_scan(sql: str, params: list[Any]) -> list[tuple[Any, ...]]:
    """Rows of ``sql`` (which reads with ``iceberg_scan(?)``) through DuckDB's own Iceberg reader,
    offline; values as JSON gives them (dates as text). Skipped where set-up did not install the
    reader, failed under CI."""
    if not (DUCKDB_ICEBERG_DIR / "duckdb_ext").is_dir():
        missing_prerequisite(
            f"DuckDB's Iceberg reader is not installed in {DUCKDB_ICEBERG_DIR} (scripts/setup.sh)"
        )
    env = {**os.environ, "PYTHONPATH": str(DUCKDB_ICEBERG_DIR)}
    done = subprocess.run(
        [sys.executable, "-c", _ICEBERG_SCAN, json.dumps([sql, params])],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, f"DuckDB's iceberg_scan failed: {done.stderr[-2000:]}"
    return [tuple(row) for row in json.loads(done.stdout)]
