"""A commit SIGKILLed right after the table commit, before COMMITTED is recorded, for each table
target (Iceberg, Delta) on a local warehouse and on the S3 server (moto): the re-run, also after
the committer rows are deleted, leaves every row once (issue 12).

The kill is real: a spawned process reaches the crash point ``table.after_table_commit`` (the
table's commit is done, nothing after it has run) and SIGKILLs itself (``faults.crashpoint``).

* On a local warehouse the whole commit runs through the real :class:`CheckpointCommitter` and
  committer store: the re-run takes the dead try's lease over and records COMMITTED without a
  second table commit; then the committer rows are deleted (retention) and the interval is
  written and committed again.
* On S3 the committer cannot run as a whole (it reads staging through a local
  ``StagingLayout``): the killed process runs the publisher under a lease's epoch, as the
  committer does, and the re-runs are fresh publishers, as a new task try builds.

An abort's tombstone committed while a publish of the attempt is SIGSTOPped just before its
table commit: the resumed publish adds nothing (the catalog's compare-and-swap, or the Delta
log's conditional put on S3, makes it read the table again and meet the tombstone).

Racing committers (one snapshot/version) and zombie commits (nothing added) are shown on both
places in tests/test_iceberg_target.py and tests/test_delta_target.py; with real processes
stopped and resumed, in the crash campaign (tests/test_target_faults.py).
"""

from __future__ import annotations

import io
import multiprocessing
import os
import signal
import time
import uuid
from datetime import timedelta
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from airflow_provider_walsink.core import faults
from airflow_provider_walsink.core.commit import CheckpointCommitter
from airflow_provider_walsink.core.protocol import CheckpointState as S
from airflow_provider_walsink.core.protocol.errors import CommittableError
from airflow_provider_walsink.core.protocol.manifest import Manifest
from airflow_provider_walsink.core.staging.layout import StagingLayout
from airflow_provider_walsink.core.store import CommitterStore
from airflow_provider_walsink.core.targets._tables import local_path
from airflow_provider_walsink.core.targets.base import PublishOutcome
from tests.helpers import ACTOR, forget_checkpoint, stage_checkpoint
from tests.table_fixtures import ctx, place, s3_server, stage_attempt  # noqa: F401

pytestmark = pytest.mark.slow

DAY = [("2026-01-01", 1, "a"), ("2026-01-01", 2, "b"), ("2026-01-01", 3, "c")]
KEY = "20260101T000000Z"
TTL = timedelta(seconds=1)
KILL_POINT = "table.after_table_commit"


def make_publisher(kind: str, spec: dict, mode: str):
    """The publisher of one test table; ``spec`` is picklable, so a spawned process builds the same."""
    if kind == "iceberg":
        from airflow_provider_walsink.core.targets.iceberg import IcebergPublisher

        return IcebergPublisher(
            spec["identifier"], mode, catalog_properties=spec["props"], partition_by=["dt"], create_table=True
        )
    from airflow_provider_walsink.core.targets.delta import DeltaPublisher

    return DeltaPublisher(
        spec["uri"], mode, storage_options=spec["options"], partition_by=["dt"], create_table=True
    )


def table_spec(kind: str, place, tmp_path: Path) -> dict:  # noqa: F811
    if kind == "iceberg":
        props = {
            "type": "sql",
            "uri": f"sqlite:///{tmp_path}/catalog.db",
            "warehouse": place.uri("warehouse"),
        }
        if place.s3:
            props.update(place.s3.iceberg_properties())
        return {"identifier": f"ns.events_{uuid.uuid4().hex[:6]}", "props": props}
    return {
        "uri": place.uri(f"events_{uuid.uuid4().hex[:6]}"),
        "options": place.s3.delta_options() if place.s3 else {},
    }


def commits(kind: str, spec: dict) -> list[str]:
    """The table's commits, oldest first, each named by the walsink attempt it carries."""
    table = make_publisher(kind, spec, "append").load_table()
    if table is None:
        return []
    if kind == "iceberg":
        return [s.summary.get("walsink.attempt-id", "?") for s in table.snapshots()]
    # deltalake's history() stalls against moto: one entry per version after version 0, the empty
    # table walsink creates before its first commit (delta.py _create_empty; one committer here).
    return [f"v{v}" for v in range(1, table.version() + 1)]


def rows(kind: str, spec: dict) -> list[tuple]:
    table = make_publisher(kind, spec, "append").load_table()
    arrow = table.scan().to_arrow() if kind == "iceberg" else table.to_pyarrow_table()
    return sorted((r["dt"], r["id"], r["name"]) for r in arrow.to_pylist())


def _killed_publish(
    kind: str, spec: dict, mode: str, manifest_bytes: bytes, attempt_dir: str, epoch: int
) -> None:
    os.environ[faults.ENV] = KILL_POINT
    manifest = Manifest.from_bytes(manifest_bytes)
    make_publisher(kind, spec, mode).publish(
        manifest, attempt_dir, ctx(manifest, epoch=epoch, on_event=faults.crashpoint)
    )
    os._exit(3)  # not killed: the crash point was never reached


def _killed_commit(kind: str, spec: dict, mode: str, store_url: str, staging: str) -> None:
    os.environ[faults.ENV] = KILL_POINT
    layout = StagingLayout(staging)
    store = CommitterStore.from_url(store_url, migrate=False)
    publisher = make_publisher(kind, spec, mode)
    CheckpointCommitter(store, layout, publisher, mode=mode, lease_ttl=TTL).commit("events", KEY, actor=ACTOR)
    os._exit(3)


def run_killed(target, *args) -> None:
    proc = multiprocessing.get_context("spawn").Process(target=target, args=args)
    proc.start()
    proc.join(300)
    assert proc.exitcode == -signal.SIGKILL, f"expected a SIGKILL at {KILL_POINT}, exit code {proc.exitcode}"


@pytest.mark.parametrize("kind", ["iceberg", "delta"])
@pytest.mark.parametrize("mode", ["append", "overwrite"])
def test_a_publish_killed_after_the_table_commit_is_found_by_every_rerun(kind, mode, place, tmp_path):  # noqa: F811
    spec = table_spec(kind, place, tmp_path)
    staging = make_publisher(kind, spec, mode).staging_root()
    manifest, attempt_dir = stage_attempt(place, staging, "events", KEY, DAY, files_per_partition=2)
    lease_epoch = 1_700_000_000_000  # a lease token as the store hands them out (>= the clock in ms)
    run_killed(_killed_publish, kind, spec, mode, manifest.to_bytes(), attempt_dir, lease_epoch)
    assert rows(kind, spec) == sorted(DAY)  # the table commit landed before the kill
    landed = commits(kind, spec)
    assert len(landed) == 1

    # The retry (a new task try, its own lease, a higher token) finds the attempt in the table.
    retry = make_publisher(kind, spec, mode).publish(
        manifest, attempt_dir, ctx(manifest, epoch=lease_epoch + 5)
    )
    assert retry.outcome is PublishOutcome.ALREADY_PUBLISHED and retry.published == 0
    # Committer rows deleted, or restored from an old backup: a token from scratch; the table still knows.
    again = make_publisher(kind, spec, mode).publish(manifest, attempt_dir, ctx(manifest, epoch=0))
    assert again.outcome is PublishOutcome.ALREADY_PUBLISHED
    assert commits(kind, spec) == landed and rows(kind, spec) == sorted(DAY)

    # Committer rows deleted and the interval written again: a new attempt of the same rows.
    rewrite, rewrite_dir = stage_attempt(place, staging, "events", KEY, DAY, attempt=2)
    publisher = make_publisher(kind, spec, mode)
    if mode == "overwrite":
        result = publisher.publish(rewrite, rewrite_dir, ctx(rewrite, epoch=lease_epoch + 10))
        assert result.outcome is PublishOutcome.PUBLISHED and result.partitions_replaced == ["dt=2026-01-01"]
        assert len(commits(kind, spec)) == 2
    else:
        # The table cannot tell a crashed attempt from rows committed before retention: refused.
        with pytest.raises(CommittableError, match="will not retract"):
            publisher.publish(rewrite, rewrite_dir, ctx(rewrite, epoch=lease_epoch + 10))
        assert commits(kind, spec) == landed
    assert rows(kind, spec) == sorted(DAY)


def _parquet_day() -> dict[str, bytes]:
    day = pa.table({"id": pa.array([r[1] for r in DAY], pa.int64()), "name": [r[2] for r in DAY]})
    buf = io.BytesIO()
    pq.write_table(day, buf)
    return {"dt=2026-01-01/part-00000.parquet": buf.getvalue()}


@pytest.mark.parametrize("kind", ["iceberg", "delta"])
@pytest.mark.parametrize("mode", ["append", "overwrite"])
def test_a_commit_killed_after_the_table_commit_is_finished_by_the_rerun_also_after_retention(
    kind, mode, tmp_path, sqlite_store
):
    """Local warehouse, the real committer and store: SIGKILL, lease takeover, COMMITTED without a
    second table commit; committer rows deleted, the interval written again: each row once."""
    from tests.table_fixtures import Place

    store = sqlite_store
    spec = table_spec(kind, Place("local", str(tmp_path / "tables")), tmp_path)
    layout = StagingLayout(local_path(make_publisher(kind, spec, mode).staging_root()))
    store_url = store.engine.url.render_as_string(hide_password=False)
    stage_checkpoint(store, layout, "events", KEY, _parquet_day(), mode=mode)
    run_killed(_killed_commit, kind, spec, mode, store_url, str(layout.root))
    assert store.require("events", KEY).state is S.COMMITTING  # the table has it, the committer does not
    assert rows(kind, spec) == sorted(DAY)
    landed = commits(kind, spec)
    assert len(landed) == 1

    time.sleep(TTL.total_seconds() * 1.5)  # the dead try's lease runs out
    committer = CheckpointCommitter(store, layout, make_publisher(kind, spec, mode), mode=mode, lease_ttl=TTL)
    summary = committer.commit("events", KEY, actor=ACTOR)
    assert summary.state == "COMMITTED" and summary.lease_taken_over_from
    assert summary.published == 0 and summary.already_published == 1
    assert commits(kind, spec) == landed and rows(kind, spec) == sorted(DAY)

    # Retention deletes the checkpoint's committer rows; the interval is written and committed again.
    forget_checkpoint(store, "events", KEY)
    stage_checkpoint(store, layout, "events", KEY, _parquet_day(), mode=mode)
    committer = CheckpointCommitter(store, layout, make_publisher(kind, spec, mode), mode=mode, lease_ttl=TTL)
    if mode == "overwrite":
        summary = committer.commit("events", KEY, actor=ACTOR)
        assert summary.state == "COMMITTED" and summary.partitions_replaced == ["dt=2026-01-01"]
        assert len(commits(kind, spec)) == 2
    else:
        with pytest.raises(CommittableError, match="will not retract"):
            committer.commit("events", KEY, actor=ACTOR)
        assert store.require("events", KEY).state is S.FAILED
        assert commits(kind, spec) == landed
    assert rows(kind, spec) == sorted(DAY)


def _stopped_publish(
    kind: str, spec: dict, mode: str, manifest_bytes: bytes, attempt_dir: str, epoch: int, out
) -> None:
    """A publish SIGSTOPped just before its table commit (a zombie); reports how it ended."""
    os.environ[faults.ENV], os.environ[faults.SIGNAL_ENV] = "table.before_table_commit", "STOP"
    manifest = Manifest.from_bytes(manifest_bytes)
    try:
        make_publisher(kind, spec, mode).publish(
            manifest, attempt_dir, ctx(manifest, epoch=epoch, on_event=faults.crashpoint)
        )
        out.put("published")
    except Exception as exc:  # noqa: BLE001 - reported to the test
        out.put(type(exc).__name__)


def _process_state(pid: int) -> str:
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rpartition(")")[2].split()[0]


@pytest.mark.parametrize("kind", ["iceberg", "delta"])
@pytest.mark.parametrize("mode", ["append", "overwrite"])
def test_an_abort_tombstone_lands_before_a_stopped_publish_which_then_adds_nothing(
    kind,
    mode,
    place,  # noqa: F811
    tmp_path,
):
    """An abort's tombstone (Iceberg: an empty snapshot and a property; Delta: the attempt's app
    transaction at -1) committed while a publish of the attempt is stopped just before its table
    commit: resumed, the publish meets the tombstone (the catalog's compare-and-swap, or the
    Delta log's put-if-absent on S3) and adds nothing, on a local warehouse and on S3."""
    from airflow_provider_walsink.core.targets._tables import AbortedInTableError, CheckpointRef

    spec = table_spec(kind, place, tmp_path)
    staging = make_publisher(kind, spec, mode).staging_root()
    earlier = [("2025-12-31", 0, "z")]  # the table exists: an abort may not create it
    manifest0, dir0 = stage_attempt(place, staging, "events", "20251231T000000Z", earlier)
    make_publisher(kind, spec, mode).publish(manifest0, dir0, ctx(manifest0, epoch=1))
    manifest, attempt_dir = stage_attempt(place, staging, "events", KEY, DAY)

    mp = multiprocessing.get_context("spawn")
    out = mp.Queue()
    zombie = mp.Process(
        target=_stopped_publish, args=(kind, spec, mode, manifest.to_bytes(), attempt_dir, 2, out)
    )
    zombie.start()
    try:
        deadline = time.monotonic() + 120
        while _process_state(zombie.pid) != "T":
            assert zombie.is_alive(), "the publish ended before its stop"
            assert time.monotonic() < deadline, "the publish never reached its stop"
            time.sleep(0.05)
        ref = CheckpointRef("events", KEY, manifest.attempt_id)
        refused_by = make_publisher(kind, spec, mode).tombstone(ref, frozenset({manifest.attempt_id}))
        assert refused_by is None  # the tombstone was committed
        after_abort = commits(kind, spec)
        assert len(after_abort) == 2 and rows(kind, spec) == earlier
    finally:
        os.kill(zombie.pid, signal.SIGCONT)
        zombie.join(120)
    assert out.get(timeout=5) == AbortedInTableError.__name__
    assert commits(kind, spec) == after_abort and rows(kind, spec) == earlier
    with pytest.raises(AbortedInTableError):  # nor will any later publish of the attempt
        make_publisher(kind, spec, mode).publish(manifest, attempt_dir, ctx(manifest, epoch=3))
