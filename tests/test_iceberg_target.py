"""The Iceberg target (pyiceberg, SQL catalog on SQLite), on a local warehouse and on the S3 server.

Each test stages Parquet files where the write phase's executors would
(inside the table location), publishes through :class:`IcebergPublisher` and
reads the rows back with pyiceberg.
"""

from __future__ import annotations

import threading
import uuid

import pyarrow as pa
import pytest

from airflow_provider_walsink.core.protocol.errors import CommittableError, FencedError
from airflow_provider_walsink.core.staging.layout import StagingLayout
from airflow_provider_walsink.core.targets.base import PublishOutcome, StagedAttempt
from airflow_provider_walsink.core.targets.iceberg import (
    IcebergPublisher,
    IcebergTargetError,
    marker_property,
)
from airflow_provider_walsink.core.targets.registry import TargetOptions, resolve_target
from tests.helpers import duckdb_iceberg_scan
from tests.table_fixtures import (  # noqa: F401
    Place,
    StorePlace,
    ctx,
    layout_for,
    objects_under,
    place,
    s3_server,
    stage_attempt,
)

pytest.importorskip("pyiceberg")

ROWS_A = [("2026-01-01", 1, "a"), ("2026-01-01", 2, "b"), ("2026-01-02", 3, "c")]


class Target:
    """One Iceberg table in a fresh catalog at ``place``."""

    def __init__(self, place, tmp_path):  # noqa: F811
        self.place = place
        self.props = {
            "type": "sql",
            "uri": f"sqlite:///{tmp_path}/catalog.db",
            "warehouse": place.uri("warehouse"),
        }
        if place.s3:
            self.props.update(place.s3.iceberg_properties())
        elif isinstance(place, StorePlace):
            self.props.update(place.iceberg_properties())
        self.identifier = f"ns.events_{uuid.uuid4().hex[:6]}"

    def publisher(self, mode="append", **kwargs) -> IcebergPublisher:
        kwargs.setdefault("create_table", True)
        return IcebergPublisher(
            self.identifier, mode, catalog_properties=self.props, partition_by=["dt"], **kwargs
        )

    @property
    def staging(self) -> str:
        return self.publisher().staging_root()

    def stage(self, key, rows, **kwargs):
        manifest, attempt_dir = stage_attempt(self.place, self.staging, "events", key, rows, **kwargs)
        if isinstance(self.place, StorePlace):  # as the committer hands it: read through its store
            store = self.place.store(self.staging)
            return manifest, StagedAttempt(store, store.attempt("events", key, manifest.attempt))
        return manifest, attempt_dir

    def rows(self) -> list[tuple]:
        table = self.publisher().load_table()
        return sorted((r["dt"], r["id"], r["name"]) for r in table.scan().to_arrow().to_pylist())

    def snapshots(self) -> list:
        table = self.publisher().load_table()
        return list(table.snapshots()) if table is not None else []


@pytest.fixture
def target(place, tmp_path):  # noqa: F811
    return Target(place, tmp_path)


def test_publish_then_republish_after_a_crash_and_without_committer_state(target):
    manifest, attempt_dir = target.stage("2026-01-01", ROWS_A, files_per_partition=2)
    first = target.publisher().publish(manifest, attempt_dir, ctx(manifest, epoch=1))
    assert first.outcome is PublishOutcome.PUBLISHED and first.published == 4
    assert target.rows() == sorted(ROWS_A)
    (snapshot,) = target.snapshots()
    assert snapshot.summary["walsink.attempt-id"] == manifest.attempt_id
    assert (
        snapshot.summary["walsink.pipeline"] == "events"
        and snapshot.summary["walsink.checkpoint"] == "2026-01-01"
    )
    assert snapshot.summary["walsink.epoch"] == "1"
    assert str(snapshot.snapshot_id) == first.snapshot

    # Killed after the table commit, before COMMITTED: the re-run (a fresh publisher, same lease epoch) finds it.
    again = target.publisher().publish(manifest, attempt_dir, ctx(manifest, epoch=1))
    assert again.outcome is PublishOutcome.ALREADY_PUBLISHED and again.published == 0
    # Committer rows deleted (retention, lost backup): a new lease starts from epoch 0; the table still knows.
    fresh = target.publisher().publish(manifest, attempt_dir, ctx(manifest, epoch=0))
    assert fresh.outcome is PublishOutcome.ALREADY_PUBLISHED
    assert target.rows() == sorted(ROWS_A)
    assert len(target.snapshots()) == 1
    assert target.publisher().published_attempt(manifest) == manifest.attempt_id


def test_racing_committers_on_one_checkpoint_make_one_snapshot(target):
    """Both check the marker before either commits (a stale table handle): the loser must not re-add the files."""
    manifest, attempt_dir = target.stage("2026-01-01", ROWS_A)
    target.publisher().load_table() or target.publisher()._create(manifest, target.place.storage.footers(
        [(f"{attempt_dir}/{c.path}", c.size) for c in manifest.committables]))  # fmt: skip
    barrier = threading.Barrier(2, timeout=60)

    seen = []

    def at(name):
        seen.append(name)
        if name == "table.before_table_commit" and not barrier.broken:
            try:
                barrier.wait()
            except threading.BrokenBarrierError:
                pass

    results, errors = [], []

    def run():
        try:
            c = ctx(manifest, epoch=1, on_event=at)
            results.append(target.publisher().publish(manifest, attempt_dir, c))
        except Exception as e:  # reported below
            errors.append(e)

    threads = [threading.Thread(target=run) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors, errors
    assert sorted(r.outcome for r in results) == [PublishOutcome.ALREADY_PUBLISHED, PublishOutcome.PUBLISHED]
    # Both reached the commit with the marker absent; one commit landed, the other conflicted and re-checked.
    assert seen.count("table.before_table_commit") == 2 and seen.count("table.after_table_commit") == 1
    snapshots = target.snapshots()
    assert [s.summary.get("walsink.attempt-id") for s in snapshots] == [manifest.attempt_id]
    assert target.rows() == sorted(ROWS_A)


def test_zombie_with_a_lower_epoch_is_fenced_and_adds_nothing(target):
    current, current_dir = target.stage("2026-01-01", ROWS_A, attempt=2)
    target.publisher().publish(current, current_dir, ctx(current, epoch=3))
    zombie, zombie_dir = target.stage("2026-01-01", [("2026-01-01", 99, "zombie")], attempt=1)
    before = target.snapshots()
    for epoch in (2, 3):  # lower, and equal with another attempt
        with pytest.raises(FencedError, match="fencing token 3"):
            target.publisher().publish(zombie, zombie_dir, ctx(zombie, epoch=epoch))
    assert target.snapshots() == before
    assert target.rows() == sorted(ROWS_A)
    marker = target.publisher().published_marker(zombie)
    assert (marker.attempt_id, marker.epoch) == (current.attempt_id, 3)


def test_newer_attempt_retracts_the_older_one_in_overwrite(target):
    old, old_dir = target.stage("2026-01-01", [("2026-01-01", 1, "old")], attempt=1)
    target.publisher("overwrite").publish(old, old_dir, ctx(old, epoch=1))
    new, new_dir = target.stage("2026-01-01", [("2026-01-01", 2, "new")], attempt=2)
    result = target.publisher("overwrite").publish(new, new_dir, ctx(new, epoch=2))
    assert result.files_rolled_back == 1
    assert target.rows() == [("2026-01-01", 2, "new")]
    marker = target.publisher("overwrite").load_table().metadata.properties[marker_property(new)]
    assert old.attempt_id in marker


def test_append_never_retracts_another_attempt_it_holds(target):
    """After retention the table cannot tell a crashed attempt from committed rows: refused, unchanged."""
    old, old_dir = target.stage("2026-01-01", [("2026-01-01", 1, "old")], attempt=1)
    target.publisher().publish(old, old_dir, ctx(old, epoch=1))
    new, new_dir = target.stage("2026-01-01", [("2026-01-01", 2, "new")], attempt=2)
    with pytest.raises(CommittableError, match="will not retract"):
        target.publisher().publish(new, new_dir, ctx(new, epoch=2))
    assert target.rows() == [("2026-01-01", 1, "old")]


def test_overwrite_replaces_the_partition(target):
    first, first_dir = target.stage("2026-01-01", ROWS_A)
    target.publisher("overwrite").publish(first, first_dir, ctx(first))
    second, second_dir = target.stage("2026-01-01b", [("2026-01-01", 7, "x"), ("2026-01-01", 8, "y")])
    result = target.publisher("overwrite").publish(second, second_dir, ctx(second))
    assert result.partitions_replaced == ["dt=2026-01-01"]
    assert target.rows() == [("2026-01-01", 7, "x"), ("2026-01-01", 8, "y"), ("2026-01-02", 3, "c")]
    assert len(target.snapshots()) == 2
    assert target.snapshots()[-1].summary.operation.value == "overwrite"


def test_schema_mismatch_fails_clearly_and_leaves_the_table_unchanged(target):
    good, good_dir = target.stage("2026-01-01", ROWS_A)
    target.publisher().publish(good, good_dir, ctx(good))
    bad_table = pa.table(
        {
            "dt": pa.array(["2026-01-03"]),
            "id": pa.array(["not-a-number"]),
            "colour": pa.array(["red"]),
        }
    )
    bad, bad_dir = target.stage("2026-01-03", [], table=bad_table)
    before = target.snapshots()
    with pytest.raises(IcebergTargetError) as e:
        target.publisher().publish(bad, bad_dir, ctx(bad))
    message = str(e.value)
    assert "missing columns ['name']" in message and "columns not in the table ['colour']" in message
    assert "column 'id' is string, the table has int64" in message and "table unchanged" in message
    assert target.snapshots() == before
    assert target.rows() == sorted(ROWS_A)


def test_missing_table_without_create_table_is_a_clear_error(target):
    manifest, attempt_dir = target.stage("2026-01-01", ROWS_A)
    with pytest.raises(IcebergTargetError, match="does not exist.*create_table"):
        target.publisher(create_table=False).publish(manifest, attempt_dir, ctx(manifest))


@pytest.mark.parametrize("place", ["local", "s3", "gs", "abfss"], indirect=True)
def test_finish_removes_only_what_no_snapshot_references(target):
    """On every store (issue 48: on gs:// the clean-up removed nothing, on abfss:// it left marker
    blobs): the never-committed attempt goes and so does the committed one's manifest; every object
    the table references stays, and nothing else is left under the checkpoint."""
    target.stage("2026-01-01", [("2026-01-01", 5, "never committed")], attempt=1)
    manifest, attempt_dir = target.stage("2026-01-01", ROWS_A, attempt=2)
    publisher = target.publisher()
    publisher.publish(manifest, attempt_dir, ctx(manifest))
    removed = publisher.finish(manifest, layout_for(target.place, target.staging))
    assert any(r.endswith("attempt-1") for r in removed)
    assert any(r.endswith("attempt-2/_manifest.json") for r in removed)
    assert target.rows() == sorted(ROWS_A)  # every referenced data file is still readable
    checkpoint = f"{target.staging}/events/2026-01-01"
    assert objects_under(target.place, checkpoint) == sorted(
        f"attempt-2/{c.path}" for c in manifest.committables
    )


def test_resolved_from_a_uri_with_catalog_from_a_connection(tmp_path):
    props = {"type": "sql", "uri": f"sqlite:///{tmp_path}/c.db", "warehouse": f"file://{tmp_path}/wh"}
    options = TargetOptions(
        mode="append",
        layout=StagingLayout(tmp_path / "staging"),
        partition_by=("dt",),
        connections=lambda conn_id: {"conn_type": "generic", "extra": props} if conn_id == "lake" else {},
        extra={"create_table": True},
    )
    publisher = resolve_target("iceberg://lake/sales.orders", options)
    assert isinstance(publisher, IcebergPublisher)
    assert publisher.identifier == "sales.orders" and publisher.catalog_properties["uri"] == props["uri"]
    described = IcebergPublisher(
        "a.b",
        "append",
        catalog_properties={
            "type": "rest",
            "uri": "https://u:pw@cat.example/api",
            "s3.secret-access-key": "S",
        },
    ).describe()
    assert "pw" not in described and "S" not in described.replace("Iceberg", "").replace("table", "")


@pytest.mark.spark
def test_files_staged_by_spark_are_committed_and_int96_is_refused_clearly(spark, tmp_path):
    """Spark's partitionBy output (no dt column in the files) with TIMESTAMP_MICROS; INT96 gets a clear error."""
    import datetime as dt

    from airflow_provider_walsink.core.protocol.manifest import Committable, build_manifest
    from airflow_provider_walsink.core.spark.job import hadoop_uri

    props = {"type": "sql", "uri": f"sqlite:///{tmp_path}/c.db", "warehouse": f"file://{tmp_path}/wh"}
    publisher = IcebergPublisher("ns.spark_events", "overwrite", catalog_properties=props, create_table=True)
    rows = [("2026-01-01", 1, dt.datetime(2026, 1, 1, 5)), ("2026-01-02", 2, dt.datetime(2026, 1, 2, 6))]
    df = spark.createDataFrame(rows, "dt string, id long, ts timestamp")

    def staged(attempt: int, timestamp_type: str):
        attempt_dir = tmp_path / "staging" / "events" / "2026-01" / f"attempt-{attempt}"
        spark.conf.set("spark.sql.parquet.outputTimestampType", timestamp_type)
        try:
            df.coalesce(1).write.partitionBy("dt").parquet(hadoop_uri(attempt_dir))
        finally:
            spark.conf.unset("spark.sql.parquet.outputTimestampType")
        files = sorted(p for p in attempt_dir.rglob("*.parquet"))
        committables = [Committable(str(p.relative_to(attempt_dir)), p.stat().st_size, None) for p in files]
        manifest = build_manifest(
            pipeline="events", checkpoint_key="2026-01", sequence=1, attempt=attempt, file_format="parquet",
            committables=committables, attempt_id=uuid.uuid4().hex, partition_columns=("dt",),
        )  # fmt: skip
        return manifest, attempt_dir

    int96, int96_dir = staged(1, "INT96")
    with pytest.raises(IcebergTargetError, match="INT96.*TIMESTAMP_MICROS"):
        publisher.publish(int96, int96_dir, ctx(int96))

    manifest, attempt_dir = staged(2, "TIMESTAMP_MICROS")
    result = publisher.publish(manifest, attempt_dir, ctx(manifest))
    assert result.outcome is PublishOutcome.PUBLISHED
    got = publisher.load_table().scan().to_arrow().to_pylist()
    assert sorted((r["dt"], r["id"]) for r in got) == [("2026-01-01", 1), ("2026-01-02", 2)]
    assert all(r["ts"] is not None for r in got)


def test_an_empty_overwrite_checkpoint_still_replaces_its_partition_once(target):
    from airflow_provider_walsink.core.protocol.manifest import build_manifest

    first, first_dir = target.stage("2026-01-01", ROWS_A)
    target.publisher("overwrite").publish(first, first_dir, ctx(first))
    empty = build_manifest(
        pipeline="events", checkpoint_key="2026-01-01b", sequence=2, attempt=1, file_format="parquet",
        committables=[], attempt_id=uuid.uuid4().hex, partition_columns=("dt",), partitions=("dt=2026-01-01",),
    )  # fmt: skip
    empty_dir = f"{target.staging}/events/2026-01-01b/attempt-1"
    assert (
        target.publisher("overwrite").publish(empty, empty_dir, ctx(empty)).outcome
        is PublishOutcome.PUBLISHED
    )
    again = target.publisher("overwrite").publish(empty, empty_dir, ctx(empty))
    assert again.outcome is PublishOutcome.ALREADY_PUBLISHED
    assert target.rows() == [("2026-01-02", 3, "c")]


def test_committer_killed_after_the_table_commit_then_rerun_commits_once(tmp_path, sqlite_store):
    """Through the real committer and store: publish lands, the task dies before COMMITTED, the re-run records it."""
    import io as _io

    import pyarrow.parquet as pq

    from airflow_provider_walsink.core.commit import CheckpointCommitter
    from airflow_provider_walsink.core.targets._tables import local_path
    from tests.helpers import ACTOR, stage_checkpoint
    from tests.table_fixtures import Place, events_table

    target = Target(Place("local", str(tmp_path / "tables")), tmp_path)
    publisher = target.publisher()
    layout = StagingLayout(local_path(publisher.staging_root()))
    buf = _io.BytesIO()
    pq.write_table(
        events_table(ROWS_A)
        .filter(pa.compute.equal(events_table(ROWS_A)["dt"], "2026-01-01"))
        .drop_columns(["dt"]),
        buf,
    )
    files = {"dt=2026-01-01/part-00000.parquet": buf.getvalue()}
    stage_checkpoint(sqlite_store, layout, "events", "2026-01-01", files, mode="append")

    class Killed(Exception):
        pass

    class DiesAfterTheTableCommit(type(publisher)):
        def publish(self, manifest, attempt_dir, ctx):
            super().publish(manifest, attempt_dir, ctx)
            raise Killed("worker lost after the table commit")

    dying = DiesAfterTheTableCommit(
        target.identifier, "append", catalog_properties=target.props, partition_by=["dt"], create_table=True
    )
    with pytest.raises(Killed):
        CheckpointCommitter(sqlite_store, layout, dying, mode="append").commit(
            "events", "2026-01-01", actor=ACTOR
        )
    assert len(target.snapshots()) == 1
    summary = CheckpointCommitter(sqlite_store, layout, target.publisher(), mode="append").commit(
        "events", "2026-01-01", actor=ACTOR
    )
    assert summary.state == "COMMITTED" and summary.already_published == 1 and summary.published == 0
    assert len(target.snapshots()) == 1
    assert target.rows() == [("2026-01-01", 1, "a"), ("2026-01-01", 2, "b")]


V1_ROWS = [("2026-01-01", 1, "v1"), ("2026-01-02", 2, "v1")]
V2_ROWS = [("2026-01-01", 5, "v2")]
OTHER_ROWS = [("2026-01-03", 9, "other")]


@pytest.mark.parametrize("mode", ["append", "overwrite"])
def test_reprocess_retracts_the_superseded_attempt_in_the_same_snapshot(target, mode):
    """v2 covers one of v1's two partitions: one snapshot removes both v1 files and adds v2's."""
    other, other_dir = target.stage("2026-01-03", OTHER_ROWS)
    target.publisher(mode).publish(other, other_dir, ctx(other, epoch=1))
    v1, v1_dir = target.stage("2026-01-01", V1_ROWS, attempt=1)
    target.publisher(mode).publish(v1, v1_dir, ctx(v1, epoch=1))
    v2, v2_dir = target.stage("2026-01-01", V2_ROWS, attempt=2)
    reprocess = ctx(v2, epoch=2, supersedes=v1.attempt_id)

    result = target.publisher(mode).publish(v2, v2_dir, reprocess)

    assert result.outcome is PublishOutcome.PUBLISHED and result.files_rolled_back == 2
    assert target.rows() == sorted(OTHER_ROWS + V2_ROWS)
    *_, before, last = target.snapshots()
    assert last.summary["walsink.attempt-id"] == v2.attempt_id and last.summary.operation.value == "overwrite"
    assert len(target.snapshots()) == 3
    marker = target.publisher(mode).published_marker(v2)
    assert (marker.attempt_id, marker.epoch, marker.previous) == (v2.attempt_id, 2, (v1.attempt_id,))
    # Crash after the table commit, re-run: already there. v1's zombie (lease epoch 1): fenced.
    assert target.publisher(mode).publish(v2, v2_dir, reprocess).outcome is PublishOutcome.ALREADY_PUBLISHED
    with pytest.raises(FencedError, match="fencing token 2"):
        target.publisher(mode).publish(v1, v1_dir, ctx(v1, epoch=1))
    assert target.rows() == sorted(OTHER_ROWS + V2_ROWS) and len(target.snapshots()) == 3
    # Time travel: the snapshot before still reads v1, and finish() leaves v1's files for it.
    target.publisher(mode).finish(v2, layout_for(target.place, target.staging))
    table = target.publisher(mode).load_table()
    old = table.scan(snapshot_id=before.snapshot_id).to_arrow().to_pylist()
    assert sorted((r["dt"], r["id"], r["name"]) for r in old) == sorted(OTHER_ROWS + V1_ROWS)


def test_duckdb_own_iceberg_reader_reads_the_table_as_pyiceberg_does(tmp_path):
    """DuckDB's ``iceberg_scan`` (offline extension; skipped without it) reads a walsink table
    as pyiceberg does: ``dt`` from the metadata (the staged files have none), an overwrite's
    replaced partition and a reprocess's retracted attempt gone, the other day kept."""
    target = Target(Place("local", str(tmp_path / "tables")), tmp_path)
    other, other_dir = target.stage("2026-01-03", OTHER_ROWS)
    target.publisher("overwrite").publish(other, other_dir, ctx(other, epoch=1))
    v1, v1_dir = target.stage("2026-01-01", V1_ROWS, attempt=1)
    target.publisher("overwrite").publish(v1, v1_dir, ctx(v1, epoch=1))
    v2, v2_dir = target.stage("2026-01-01", V2_ROWS, attempt=2)
    target.publisher("overwrite").publish(v2, v2_dir, ctx(v2, epoch=2, supersedes=v1.attempt_id))
    location = target.publisher().load_table().metadata_location
    read = duckdb_iceberg_scan(
        "SELECT CAST(dt AS VARCHAR), id, name FROM iceberg_scan(?) ORDER BY ALL", [location]
    )
    assert read == target.rows() == sorted(OTHER_ROWS + V2_ROWS)


def test_reprocess_finds_the_superseded_files_by_its_snapshot_when_staged_elsewhere(target):
    """v2 staged under another root: v1's files are those its committing snapshot added."""
    v1, v1_dir = target.stage("2026-01-01", V1_ROWS, attempt=1)
    target.publisher().publish(v1, v1_dir, ctx(v1, epoch=1))
    moved = target.staging.replace("_walsink_staging", "_walsink_staging_moved")
    v2, v2_dir = stage_attempt(target.place, moved, "events", "2026-01-01", V2_ROWS, attempt=2)
    result = target.publisher().publish(v2, v2_dir, ctx(v2, epoch=2, supersedes=v1.attempt_id))
    assert result.files_rolled_back == 2
    assert target.rows() == sorted(V2_ROWS)


def test_append_still_refuses_an_attempt_that_is_not_the_superseded_one(target):
    v1, v1_dir = target.stage("2026-01-01", V1_ROWS, attempt=1)
    target.publisher().publish(v1, v1_dir, ctx(v1, epoch=1))
    v2, v2_dir = target.stage("2026-01-01", V2_ROWS, attempt=2)
    with pytest.raises(CommittableError, match="will not retract"):
        target.publisher().publish(v2, v2_dir, ctx(v2, epoch=2, supersedes=uuid.uuid4().hex))
    assert target.rows() == sorted(V1_ROWS) and len(target.snapshots()) == 1


def test_retracting_files_from_several_manifests_survives_threads_sharing_an_evaluator(
    tmp_path, monkeypatch, caplog
):
    """pyiceberg 0.12 evaluates the parent snapshot's manifests in threads, and an evaluator, once
    built for a partition spec, is shared; it keeps the current manifest in an attribute. When
    another thread sets it between the set and the read (what a busy machine does), the manifest
    holding the files to delete is judged by another's partition bounds, and the commit fails
    ("Missing required files to delete"). The pauses below make that interleaving the usual one;
    the publish must succeed at the first commit, with no conflict to retry."""
    import logging
    import time

    from pyiceberg.expressions import visitors

    from tests.table_fixtures import Place

    def eval_with_pauses(self, manifest):
        if partitions := manifest.partitions:
            if partitions[0].lower_bound == b"2026-01-01":  # v1's manifest: read late
                self.partition_fields = partitions
                time.sleep(0.3)
            else:  # the others: set late, inside that window
                time.sleep(0.1)
                self.partition_fields = partitions
            return visitors.visit(self.partition_filter, self)
        return True

    target = Target(Place("local", str(tmp_path / "tables")), tmp_path)
    v1, v1_dir = target.stage("2026-01-01", [("2026-01-01", 1, "v1")], attempt=1)
    target.publisher().publish(v1, v1_dir, ctx(v1, epoch=1))
    for day in range(2, 12):  # more manifests than pyiceberg's threads: later ones share an evaluator
        other, other_dir = target.stage(f"2026-01-{day:02d}", [(f"2026-01-{day:02d}", day, "other")])
        target.publisher().publish(other, other_dir, ctx(other, epoch=1))
    monkeypatch.setattr(visitors._ManifestEvalVisitor, "eval", eval_with_pauses)
    v2, v2_dir = target.stage("2026-01-01", V2_ROWS, attempt=2)
    with caplog.at_level(logging.INFO, logger="airflow_provider_walsink.core.targets.iceberg"):
        result = target.publisher().publish(v2, v2_dir, ctx(v2, epoch=2, supersedes=v1.attempt_id))
    assert [r.getMessage() for r in caplog.records if "conflicted" in r.getMessage()] == []
    assert result.files_rolled_back == 1 and len(target.snapshots()) == 12
    assert [r for r in target.rows() if r[0] == "2026-01-01"] == V2_ROWS


def test_a_namespace_created_meanwhile_still_gives_the_table_location_as_staging_root(tmp_path):
    """Two write tasks of a new table race to create its namespace (pyiceberg checks, then
    inserts); the loser's insert fails on the catalog's unique key. Its staging root must still be
    the table's location, never "none" (the attempt would silently stage under the connection's root:
    seen in a fresh-clone run of the S3 example on the cluster, tests/test_e2e_connect_cluster.py). The race is injected at the
    catalog's boundary: the namespace appears, then the losing insert's error is raised."""
    import sqlalchemy.exc
    from pyiceberg.catalog import load_catalog

    props = {"type": "sql", "uri": f"sqlite:///{tmp_path}/c.db", "warehouse": f"file://{tmp_path}/wh"}
    publisher = IcebergPublisher("race.events", "overwrite", catalog_properties=props, create_table=True)
    catalog = publisher.catalog

    def lost_the_race(namespace, properties=None):
        load_catalog(catalog.name, **props).create_namespace("race")  # the winner, another process
        raise sqlalchemy.exc.IntegrityError(
            "INSERT INTO iceberg_namespace_properties", {}, Exception("unique")
        )

    catalog.create_namespace_if_not_exists = lost_the_race
    root = publisher.staging_root()
    assert root == f"file://{tmp_path}/wh/race/events/_walsink_staging", root

    # An error that leaves the namespace missing is raised, not turned into "no staging root".
    other = IcebergPublisher("gone.events", "overwrite", catalog_properties=props, create_table=True)

    def refused(namespace, properties=None):
        raise PermissionError("not allowed to create namespaces")

    other.catalog.create_namespace_if_not_exists = refused
    with pytest.raises(PermissionError):
        other.staging_root()
