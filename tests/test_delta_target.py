"""The Delta target (deltalake), on a local directory and on the S3 server.

Each test stages Parquet files where the write phase's executors would
(inside the table directory), publishes through :class:`DeltaPublisher` and
reads the rows back with deltalake.
"""

from __future__ import annotations

import dataclasses
import subprocess
import sys
import threading
import uuid
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import DeltaTable

from airflow_provider_walsink.core.protocol.errors import CommittableError, FencedError
from airflow_provider_walsink.core.staging.layout import StagingLayout
from airflow_provider_walsink.core.targets._tables import SCHEMA_SAMPLE, Storage
from airflow_provider_walsink.core.targets.base import PublishOutcome
from airflow_provider_walsink.core.targets.delta import DeltaPublisher, DeltaTargetError, app_id
from airflow_provider_walsink.core.targets.registry import TargetOptions, resolve_target
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

ROOT = Path(__file__).resolve().parents[1]
ROWS_A = [("2026-01-01", 1, "a"), ("2026-01-01", 2, "b"), ("2026-01-02", 3, "c")]


class Target:
    """One Delta table at ``place``."""

    def __init__(self, place):  # noqa: F811
        self.place = place
        self.uri = place.uri(f"events_{uuid.uuid4().hex[:6]}")
        self.options = place.s3.delta_options() if place.s3 else {}

    def publisher(self, mode="append", **kwargs) -> DeltaPublisher:
        kwargs.setdefault("create_table", True)
        return DeltaPublisher(self.uri, mode, storage_options=self.options, partition_by=["dt"], **kwargs)

    @property
    def staging(self) -> str:
        return self.publisher().staging_root()

    def stage(self, key, rows, **kwargs):
        return stage_attempt(self.place, self.staging, "events", key, rows, **kwargs)

    def table(self) -> DeltaTable:
        return DeltaTable(self.uri, storage_options=self.options or None)

    def rows(self) -> list[tuple]:
        return sorted((r["dt"], r["id"], r["name"]) for r in self.table().to_pyarrow_table().to_pylist())

    def version(self) -> int | None:
        """The table's version: 0 is the empty table walsink creates before its first commit."""
        dt = self.publisher().load_table()
        return dt.version() if dt is not None else None


@pytest.fixture
def target(place):  # noqa: F811
    return Target(place)


def test_publish_then_republish_after_a_crash_and_without_committer_state(target):
    manifest, attempt_dir = target.stage("2026-01-01", ROWS_A, files_per_partition=2)
    first = target.publisher().publish(manifest, attempt_dir, ctx(manifest, epoch=1))
    assert first.outcome is PublishOutcome.PUBLISHED and first.published == 4
    assert target.rows() == sorted(ROWS_A)
    assert target.table().transaction_version(app_id(manifest)) == 1
    assert target.table().transaction_version(app_id(manifest, manifest.attempt_id)) == 1
    if target.place.kind == "local":  # deltalake's history() stalls against moto's server
        (commit,) = [c for c in target.table().history() if c.get("walsink.attempt-id")]
        assert commit["walsink.attempt-id"] == manifest.attempt_id and commit["walsink.epoch"] == "1"

    again = target.publisher().publish(manifest, attempt_dir, ctx(manifest, epoch=1))
    assert again.outcome is PublishOutcome.ALREADY_PUBLISHED and again.published == 0
    fresh = target.publisher().publish(manifest, attempt_dir, ctx(manifest, epoch=0))
    assert fresh.outcome is PublishOutcome.ALREADY_PUBLISHED
    assert target.rows() == sorted(ROWS_A)
    assert target.version() == 1
    assert target.publisher().published_attempt(manifest) == manifest.attempt_id


def test_a_zombie_and_the_lease_holder_racing_to_create_the_table_publish_once(target):
    """deltalake's create is not put-if-absent: two creators at once both write a version, each
    with its actions (seen on local files). walsink's creation carries no data, so a fenced-out
    committer (epoch 1) and the lease holder (epoch 2) publishing one checkpoint into a missing
    table at the same moment leave its rows once: the data goes in a normal commit, where the
    log's conflict check and the marker decide."""
    manifest, attempt_dir = target.stage("2026-01-01", ROWS_A)
    barrier = threading.Barrier(2, timeout=60)

    def at(name):
        if name == "table.before_table_commit" and not barrier.broken:
            try:
                barrier.wait()  # both commit at once, each on the table as it loaded it
            except threading.BrokenBarrierError:
                pass

    results, errors = [], []

    def run(epoch):
        try:
            results.append(
                target.publisher().publish(manifest, attempt_dir, ctx(manifest, epoch=epoch, on_event=at))
            )
        except Exception as e:  # reported below: the zombie may be refused (fenced)
            errors.append(e)

    threads = [threading.Thread(target=run, args=(epoch,)) for epoch in (1, 2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert all(isinstance(e, FencedError) for e in errors), errors
    assert [r.outcome for r in results].count(PublishOutcome.PUBLISHED) == 1, results
    assert target.rows() == sorted(ROWS_A)


def test_racing_committers_on_one_checkpoint_make_one_version(target):
    """Both read 'no transaction for this app id' before either commits; the table refuses the second."""
    seed, seed_dir = target.stage("seed", [("2026-01-09", 0, "seed")])
    target.publisher().publish(seed, seed_dir, ctx(seed))
    manifest, attempt_dir = target.stage("2026-01-01", ROWS_A)
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
            results.append(
                target.publisher().publish(manifest, attempt_dir, ctx(manifest, epoch=1, on_event=at))
            )
        except Exception as e:  # reported below
            errors.append(e)

    threads = [threading.Thread(target=run) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors, errors
    assert sorted(r.outcome for r in results) == [PublishOutcome.ALREADY_PUBLISHED, PublishOutcome.PUBLISHED]
    assert seen.count("table.before_table_commit") == 2 and seen.count("table.after_table_commit") == 1
    assert target.version() == 2
    assert target.rows() == sorted([*ROWS_A, ("2026-01-09", 0, "seed")])


def test_zombie_with_a_lower_or_equal_version_is_fenced_and_adds_nothing(target):
    """deltalake itself would accept the same or a lower transaction version: walsink refuses."""
    current, current_dir = target.stage("2026-01-01", ROWS_A, attempt=2)
    target.publisher().publish(current, current_dir, ctx(current, epoch=3))
    zombie, zombie_dir = target.stage("2026-01-01", [("2026-01-01", 99, "zombie")], attempt=1)
    for epoch in (2, 3):
        with pytest.raises(FencedError, match="fencing token 3"):
            target.publisher().publish(zombie, zombie_dir, ctx(zombie, epoch=epoch))
    assert target.version() == 1
    assert target.rows() == sorted(ROWS_A)
    assert target.publisher().published_marker(zombie, need_id=False).epoch == 3


def test_newer_attempt_retracts_the_older_one_in_overwrite(target):
    old, old_dir = target.stage("2026-01-01", [("2026-01-01", 1, "old")], attempt=1)
    target.publisher("overwrite").publish(old, old_dir, ctx(old, epoch=1))
    new, new_dir = target.stage("2026-01-01", [("2026-01-01", 2, "new")], attempt=2)
    result = target.publisher("overwrite").publish(new, new_dir, ctx(new, epoch=2))
    assert result.files_rolled_back == 1
    assert target.rows() == [("2026-01-01", 2, "new")]
    assert target.publisher("overwrite").published_attempt(new) == new.attempt_id
    if target.place.kind == "local":  # another attempt's id comes from history(), which stalls against moto
        assert target.publisher("overwrite").published_attempt(old) == new.attempt_id


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
    assert result.partitions_replaced == ["dt=2026-01-01"] and result.files_rolled_back == 1
    assert target.rows() == [("2026-01-01", 7, "x"), ("2026-01-01", 8, "y"), ("2026-01-02", 3, "c")]
    assert target.version() == 2


@pytest.mark.parametrize("record_schema", [True, False], ids=["schema-in-manifest", "footers"])
def test_schema_mismatch_fails_clearly_and_leaves_the_table_unchanged(target, record_schema):
    good, good_dir = target.stage("2026-01-01", ROWS_A)
    target.publisher().publish(good, good_dir, ctx(good))
    bad_table = pa.table({"dt": pa.array(["2026-01-03"]), "id": pa.array(["x"]), "colour": pa.array(["red"])})
    bad, bad_dir = target.stage("2026-01-03", [], table=bad_table, record_schema=record_schema)
    assert (bad.file_schema is not None) is record_schema
    with pytest.raises(DeltaTargetError) as e:
        target.publisher().publish(bad, bad_dir, ctx(bad))
    message = str(e.value)
    assert "missing columns ['name']" in message and "columns not in the table ['colour']" in message
    assert "column 'id' is string, the table has int64" in message and "table unchanged" in message
    assert target.version() == 1
    assert target.rows() == sorted(ROWS_A)


def _count_footer_reads(monkeypatch) -> list[str]:
    read: list[str] = []
    original = Storage.footers

    def counting(self, files):
        read.extend(location for location, _ in files)
        return original(self, files)

    monkeypatch.setattr(Storage, "footers", counting)
    return read


def test_a_recorded_schema_spares_the_footer_reads_and_rows_come_from_the_manifest(target, monkeypatch):
    rows = [("2026-01-01", i, f"n{i}") for i in range(12)]
    manifest, attempt_dir = target.stage("2026-01-01", rows, files_per_partition=6)
    assert manifest.file_schema is not None and len(manifest.committables) == 6
    read = _count_footer_reads(monkeypatch)
    target.publisher().publish(manifest, attempt_dir, ctx(manifest))
    # Only the first and the last file's footers confirm the recorded schema.
    assert len(read) == SCHEMA_SAMPLE == 2
    assert read == [f"{attempt_dir}/{manifest.committables[i].path}" for i in (0, -1)]
    assert target.rows() == sorted(rows)
    stats = target.table().get_add_actions(flatten=True).column("num_records").to_pylist()
    assert sorted(stats) == sorted(c.rows for c in manifest.committables) == [2] * 6


def test_without_a_recorded_schema_every_footer_is_read(target, monkeypatch):
    manifest, attempt_dir = target.stage("2026-01-01", ROWS_A, files_per_partition=3, record_schema=False)
    read = _count_footer_reads(monkeypatch)
    target.publisher().publish(manifest, attempt_dir, ctx(manifest))
    assert len(read) == len(manifest.committables) == 6
    assert target.rows() == sorted(ROWS_A)


def test_a_manifest_recording_another_schema_than_its_files_is_refused(target):
    good, good_dir = target.stage("2026-01-01", ROWS_A)
    target.publisher().publish(good, good_dir, ctx(good))
    # The files hold id as a string; the manifest claims the table's schema (id int64).
    bad_table = pa.table({"dt": pa.array(["2026-01-03"]), "id": pa.array(["x"]), "name": pa.array(["y"])})
    bad, bad_dir = target.stage("2026-01-03", [], table=bad_table)
    lying = dataclasses.replace(bad, file_schema=good.file_schema)
    with pytest.raises(CommittableError) as e:
        target.publisher().publish(lying, bad_dir, ctx(lying))
    message = str(e.value)
    assert "has the schema [id: string, name: string]" in message
    assert "its manifest records [id: int64, name: string]" in message and "table left unchanged" in message
    assert target.version() == 1 and target.rows() == sorted(ROWS_A)


def test_a_missing_or_resized_staged_file_is_refused_without_reading_footers(target, monkeypatch):
    good, good_dir = target.stage("2026-01-01", ROWS_A)
    target.publisher().publish(good, good_dir, ctx(good))
    manifest, attempt_dir = target.stage(
        "2026-01-05", [("2026-01-05", i, "z") for i in range(6)], files_per_partition=3
    )
    fs, path = target.place.storage.fs_and_path(f"{attempt_dir}/{manifest.committables[1].path}")
    fs.delete_file(path)
    read = _count_footer_reads(monkeypatch)
    with pytest.raises(CommittableError) as e:
        target.publisher().publish(manifest, attempt_dir, ctx(manifest))
    assert f"{manifest.committables[1].path}: missing from staging" in str(e.value)
    assert "table left unchanged" in str(e.value) and read == []
    assert target.version() == 1 and target.rows() == sorted(ROWS_A)


def test_finish_removes_only_what_no_version_references(target):
    orphan, orphan_dir = target.stage("2026-01-01", [("2026-01-01", 5, "never committed")], attempt=1)
    manifest, attempt_dir = target.stage("2026-01-01", ROWS_A, attempt=2)
    publisher = target.publisher()
    publisher.publish(manifest, attempt_dir, ctx(manifest))
    removed = publisher.finish(manifest, layout_for(target.place, target.staging))
    assert any(r.endswith("attempt-1") for r in removed)
    assert any(r.endswith("attempt-2/_manifest.json") for r in removed)
    assert target.rows() == sorted(ROWS_A)
    fs, path = target.place.storage.fs_and_path(f"{orphan_dir}/{orphan.committables[0].path}")
    assert fs.get_file_info(path).type.name == "NotFound"
    # Nothing else left under the checkpoint (pyarrow's deletes left empty marker objects on S3).
    checkpoint = f"{target.staging}/events/2026-01-01"
    assert objects_under(target.place, checkpoint) == sorted(
        f"attempt-2/{c.path}" for c in manifest.committables
    )


def test_resolved_from_uris(tmp_path):
    options = TargetOptions(
        mode="overwrite",
        layout=StagingLayout(tmp_path / "staging"),
        partition_by=("dt",),
        connections=lambda conn_id: {
            "login": "AK",
            "password": "SK",
            "extra": {"endpoint_url": "http://127.0.0.1:9"},
        },
        extra={"conn_id": "s3"},
    )
    local = resolve_target(f"delta://{tmp_path}/t?create_table=true", options)
    assert isinstance(local, DeltaPublisher) and local.table_uri == f"{tmp_path}/t" and local.create_table
    remote = resolve_target("delta+s3://bucket/tables/t", options)
    assert remote.table_uri == "s3://bucket/tables/t"
    assert remote.storage_options["AWS_ACCESS_KEY_ID"] == "AK"
    assert "SK" not in remote.describe() and "AK" not in remote.describe()
    with pytest.raises(DeltaTargetError, match="three slashes"):
        resolve_target("delta://relative/t", options)


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
    from tests.helpers import ACTOR, stage_checkpoint
    from tests.table_fixtures import Place, events_table

    target = Target(Place("local", str(tmp_path / "tables")))
    layout = StagingLayout(target.staging)
    day = events_table(ROWS_A).filter(pa.compute.equal(events_table(ROWS_A)["dt"], "2026-01-01"))
    buf = _io.BytesIO()
    pq.write_table(day.drop_columns(["dt"]), buf)
    stage_checkpoint(
        sqlite_store, layout, "events", "2026-01-01", {"dt=2026-01-01/p-0.parquet": buf.getvalue()}
    )

    class Killed(Exception):
        pass

    class DiesAfterTheTableCommit(DeltaPublisher):
        def publish(self, manifest, attempt_dir, ctx):
            super().publish(manifest, attempt_dir, ctx)
            raise Killed("worker lost after the table commit")

    dying = DiesAfterTheTableCommit(target.uri, "append", partition_by=["dt"], create_table=True)
    with pytest.raises(Killed):
        CheckpointCommitter(sqlite_store, layout, dying, mode="append").commit(
            "events", "2026-01-01", actor=ACTOR
        )
    assert target.version() == 1
    summary = CheckpointCommitter(sqlite_store, layout, target.publisher(), mode="append").commit(
        "events", "2026-01-01", actor=ACTOR
    )
    assert summary.state == "COMMITTED" and summary.already_published == 1 and summary.published == 0
    assert target.version() == 1
    assert target.rows() == [("2026-01-01", 1, "a"), ("2026-01-01", 2, "b")]


V1_ROWS = [("2026-01-01", 1, "v1"), ("2026-01-02", 2, "v1")]
V2_ROWS = [("2026-01-01", 5, "v2")]
OTHER_ROWS = [("2026-01-03", 9, "other")]


@pytest.mark.parametrize("mode", ["append", "overwrite"])
def test_reprocess_retracts_the_superseded_attempt_in_the_same_commit(target, mode):
    """v2 covers one of v1's two partitions: one Delta commit removes both v1 files and adds v2's."""
    other, other_dir = target.stage("2026-01-03", OTHER_ROWS)
    target.publisher(mode).publish(other, other_dir, ctx(other, epoch=1))
    v1, v1_dir = target.stage("2026-01-01", V1_ROWS, attempt=1)
    target.publisher(mode).publish(v1, v1_dir, ctx(v1, epoch=1))
    v2, v2_dir = target.stage("2026-01-01", V2_ROWS, attempt=2)
    reprocess = ctx(v2, epoch=2, supersedes=v1.attempt_id)

    result = target.publisher(mode).publish(v2, v2_dir, reprocess)

    assert result.outcome is PublishOutcome.PUBLISHED and result.files_rolled_back == 2
    assert target.rows() == sorted(OTHER_ROWS + V2_ROWS)
    assert target.version() == 3  # one commit: removes and adds together
    table = target.table()
    assert table.transaction_version(app_id(v2)) == 2
    assert table.transaction_version(app_id(v2, v2.attempt_id)) == 2
    # Crash after the table commit, re-run: already there. v1's zombie (lease epoch 1): fenced.
    assert target.publisher(mode).publish(v2, v2_dir, reprocess).outcome is PublishOutcome.ALREADY_PUBLISHED
    with pytest.raises(FencedError):
        target.publisher(mode).publish(v1, v1_dir, ctx(v1, epoch=1))
    assert target.rows() == sorted(OTHER_ROWS + V2_ROWS) and target.version() == 3
    # Time travel: version 2 still reads v1, and finish() leaves v1's files for it.
    target.publisher(mode).finish(v2, layout_for(target.place, target.staging))
    old = DeltaTable(target.uri, version=2, storage_options=target.options or None).to_pyarrow_table()
    assert sorted((r["dt"], r["id"], r["name"]) for r in old.to_pylist()) == sorted(OTHER_ROWS + V1_ROWS)


def test_append_still_refuses_an_attempt_that_is_not_the_superseded_one(target):
    v1, v1_dir = target.stage("2026-01-01", V1_ROWS, attempt=1)
    target.publisher().publish(v1, v1_dir, ctx(v1, epoch=1))
    v2, v2_dir = target.stage("2026-01-01", V2_ROWS, attempt=2)
    with pytest.raises(CommittableError, match="will not retract"):
        target.publisher().publish(v2, v2_dir, ctx(v2, epoch=2, supersedes=uuid.uuid4().hex))
    assert target.rows() == sorted(V1_ROWS) and target.version() == 1


def test_a_commit_process_never_imports_pandas(tmp_path):
    """pyarrow's ``pa.table()`` asks pandas whether it was handed a DataFrame, importing it: every
    Delta commit process paid about 0.2 s for the file listing of an ``overwrite`` (issue 35's
    released-together run spent most of its leader's time there). Staged here, published by a
    fresh interpreter that imports only walsink."""
    target = Target(Place("local", str(tmp_path / "tables")))
    attempts = [
        target.stage(key, [r for r in ROWS_A if r[0] == key])[1] for key in ("2026-01-01", "2026-01-02")
    ]
    script = f"""
import sys
from airflow_provider_walsink.core.protocol.manifest import read_manifest
from airflow_provider_walsink.core.targets.delta import DeltaPublisher
from airflow_provider_walsink.core.targets.base import StaticContext
publisher = DeltaPublisher({target.uri!r}, "overwrite", partition_by=["dt"], create_table=True)
for attempt_dir in {attempts!r}:
    manifest = read_manifest(attempt_dir + "/_manifest.json")
    publisher.publish(manifest, attempt_dir, StaticContext.for_manifest(manifest, epoch=1))
print(sorted(m for m in sys.modules if m.split(".")[0] == "pandas")[:3])
"""
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, cwd=ROOT, check=False
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert len(target.table().file_uris()) == 2  # both published: the overwrite listed the table's files
    assert done.stdout.strip() == "[]", f"pandas imported by a Delta commit: {done.stdout.strip()}"


# ------------------------------------------------------------------ GCS and Azure (issue 48)


def wasb_resolver(server, conn_id: str = "wasb_lake"):
    """A ``ConnectionResolver`` holding one ``wasb`` connection for Azurite's account, as Airflow gives it."""
    fields = {"conn_id": conn_id, "conn_type": "wasb", "host": server.endpoint, "login": server.account,
              "password": server.key, "extra": {}}  # fmt: skip
    return lambda name: fields if name == conn_id else None


def test_a_delta_table_on_azure_publishes_by_reference_once_with_the_wasb_connections_credentials(
    azurite_server,  # noqa: F811
):
    """``delta+abfss://`` on Azurite, its deltalake options and the log reads derived from a ``wasb``
    connection only: first commit, a re-run (already published), a newer attempt replacing the
    older in ``overwrite`` (whose id is then read from the log's commit records through the
    store), a zombie with a lower token refused, and the clean-up keeping the referenced files."""
    server = azurite_server
    on_azure = StorePlace(
        "abfss", server.root(f"delta-{uuid.uuid4().hex[:8]}"), options=server.options, server=server
    )
    target = Target(on_azure)
    uri = target.uri.replace("abfss://", "delta+abfss://")
    options = TargetOptions(mode="overwrite", layout=None, partition_by=("dt",),
                            connections=wasb_resolver(server), extra={"conn_id": "wasb_lake"})  # fmt: skip
    publisher = resolve_target(uri + "?create_table=true", options)
    assert publisher.storage_options == {"account_name": server.account, "account_key": server.key,
                                         "endpoint": server.endpoint, "allow_http": "true"}  # fmt: skip
    assert server.key not in publisher.describe() and server.endpoint in publisher.describe()
    publisher.check_writable()  # the container and the table's location, with the connection's key
    target.options = publisher.storage_options  # read back with the same options
    target.publisher = lambda mode="overwrite", **kw: resolve_target(
        uri + "?create_table=true", dataclasses.replace(options, mode=mode)
    )
    assert target.staging.startswith(on_azure.root) and target.staging.endswith("/_walsink_staging")

    old, old_dir = target.stage("2026-01-01", [("2026-01-01", 1, "old")], attempt=1)
    assert target.publisher().publish(old, old_dir, ctx(old, epoch=1)).outcome is PublishOutcome.PUBLISHED
    again = target.publisher().publish(old, old_dir, ctx(old, epoch=1))
    assert again.outcome is PublishOutcome.ALREADY_PUBLISHED
    new, new_dir = target.stage("2026-01-01", ROWS_A, attempt=2)
    result = target.publisher().publish(new, new_dir, ctx(new, epoch=2))
    assert result.files_rolled_back == 1 and target.rows() == sorted(ROWS_A)
    # By reference: the table's files are the staged objects, inside its _walsink_staging.
    assert all(f.startswith(f"{new_dir}/") for f in target.table().file_uris())
    assert target.publisher().published_attempt(old) == new.attempt_id  # from the log, through the store
    with pytest.raises(FencedError):
        target.publisher().publish(old, old_dir, ctx(old, epoch=1))
    # The clean-up drops the committed attempt's manifest and keeps attempt 1, which older versions
    # of the table still reference (until VACUUM).
    removed = target.publisher().finish(new, target.staging)
    assert [r.rsplit("/", 2)[1:] for r in removed] == [[new_dir.rsplit("/", 1)[1], "_manifest.json"]]
    # Exactly attempt 1 (kept whole) and attempt 2's data files stay: no other manifest, no marker blob.
    checkpoint, files = old_dir.rsplit("/", 1)[0], [f"{old_dir.rsplit('/', 1)[1]}/_manifest.json"]
    for manifest, where in ((old, old_dir), (new, new_dir)):
        files += [f"{where.rsplit('/', 1)[1]}/{c.path}" for c in manifest.committables]
    assert objects_under(on_azure, checkpoint) == sorted(files)
    assert target.rows() == sorted(ROWS_A) and target.version() == 2


def test_a_delta_table_on_gcs_or_azure_takes_its_credentials_from_a_connection_only(tmp_path):
    """No conn_id: refused naming the kind of connection (never the environment's credentials); a
    connection of the wrong type is refused by the staging connection readers; a ``google_cloud_platform``
    connection's key or emulator endpoint becomes object_store's service-account key."""
    import json

    from airflow_provider_walsink.hooks.staging import StagingConnectionError

    def options(conn: dict | None = None, **extra) -> TargetOptions:
        return TargetOptions(mode="append", layout=None, connections=lambda name: conn,
                             extra={"conn_id": "c", **extra} if conn else extra)  # fmt: skip

    for uri, kind in (("delta+gs://b/t", "'google_cloud_platform'"),
                      ("delta+abfss://c@acct.dfs.core.windows.net/t", "'wasb' or 'adls'")):  # fmt: skip
        with pytest.raises(DeltaTargetError, match=f"names no conn_id: .* only with a {kind} connection"):
            resolve_target(uri, options())
    aws = {"conn_id": "c", "conn_type": "aws", "login": "a", "password": "b", "extra": {}}
    with pytest.raises(StagingConnectionError, match="connection 'c' is of type 'aws'"):
        resolve_target("delta+gs://b/t", options(aws))
    emulator = {"conn_id": "c", "conn_type": "google_cloud_platform",
                "extra": {"is_anonymous": True, "endpoint_url": "http://127.0.0.1:4443"}}  # fmt: skip
    publisher = resolve_target("delta+gs://b/t", options(emulator))
    key = json.loads(publisher.storage_options["google_service_account_key"])
    assert key["gcs_base_url"] == "http://127.0.0.1:4443" and key["disable_oauth"] is True
    assert publisher.storage_options["allow_http"] == "true"
    keyfile = {"type": "service_account", "client_email": "w@p.iam.gserviceaccount.com",
               "private_key": "-----BEGIN PRIVATE KEY-----\nnot-real\n", "private_key_id": "1",
               "token_uri": "https://oauth2.googleapis.com/token"}  # fmt: skip
    keyed = {"conn_id": "c", "conn_type": "google_cloud_platform", "extra": {"keyfile_dict": keyfile}}
    publisher = resolve_target("delta+gs://b/t", options(keyed))
    assert json.loads(publisher.storage_options["google_service_account_key"]) == keyfile
    assert "not-real" not in publisher.describe()


def _walsink_txns(target: Target, version: int) -> list[dict]:
    """The application transactions walsink wrote in one table version, as its log entry holds them."""
    import json

    fs, path = target.place.storage.fs_and_path(f"{target.uri}/_delta_log/{version:020d}.json")
    with fs.open_input_stream(path) as f:
        lines = f.read().decode().splitlines()
    return [json.loads(line)["txn"] for line in lines if line.startswith('{"txn"')]


def test_markers_carry_their_commit_time_as_delta_readers_expect(target):
    """Spark's Delta drops an application transaction without ``lastUpdated`` at the next log
    checkpoint of a table that sets ``delta.setTransactionRetentionDuration``; with its commit time
    it is dropped only by age, in every engine."""
    import time

    manifest, attempt_dir = target.stage("2026-01-01", ROWS_A)
    before = int(time.time() * 1000)
    target.publisher().publish(manifest, attempt_dir, ctx(manifest, epoch=1))
    txns = _walsink_txns(target, target.version())
    assert {t["appId"] for t in txns} >= {app_id(manifest), app_id(manifest, manifest.attempt_id)}
    assert all(before <= t["lastUpdated"] <= int(time.time() * 1000) for t in txns), txns

    # An abort's tombstone too.
    other, _ = target.stage("2026-01-09", ROWS_A, attempt=7)
    from airflow_provider_walsink.core.targets._tables import CheckpointRef

    ref = CheckpointRef(other.pipeline, other.checkpoint_key)
    assert target.publisher().tombstone(ref, frozenset({other.attempt_id})) is None
    (tomb,) = _walsink_txns(target, target.version())
    assert tomb["appId"] == app_id(other, other.attempt_id) and tomb["lastUpdated"] >= before


def test_a_table_that_expires_markers_is_refused_and_a_rerun_never_publishes_twice(tmp_path, sqlite_store):
    """With ``delta.setTransactionRetentionDuration`` set, Delta drops walsink's markers on its own
    (here after a second: the marker of the first checkpoint is gone from the table). A re-run of
    that checkpoint with its committer rows gone would then publish it twice, and the clean-up would
    delete files the table references: every use of the table is refused instead, naming the
    property, the table unchanged; through the commit sequence the checkpoint stays uncommitted
    with the error recorded."""
    import time

    from airflow_provider_walsink.core.commit import CheckpointCommitter
    from airflow_provider_walsink.core.protocol.errors import TargetStateError
    from tests.helpers import ACTOR, stage_checkpoint
    from tests.table_fixtures import Place

    target = Target(Place("local", str(tmp_path / "tables")))
    manifest, attempt_dir = target.stage("2026-01-01", ROWS_A)
    target.publisher().publish(manifest, attempt_dir, ctx(manifest, epoch=1))
    target.table().alter.set_table_properties({"delta.setTransactionRetentionDuration": "interval 1 seconds"})
    version = target.table().version()
    time.sleep(1.5)
    assert target.table().transaction_version(app_id(manifest)) is None  # expired by the table itself

    # The re-run: the write task ran again (its committer rows lost) and staged a new attempt.
    rerun, rerun_dir = target.stage("2026-01-01", ROWS_A, attempt=2)
    publisher = target.publisher()
    for action in (
        lambda: publisher.publish(rerun, rerun_dir, ctx(rerun, epoch=2)),
        lambda: publisher.published_marker(manifest),
        lambda: publisher.finish(manifest, layout_for(target.place, target.staging)),
    ):
        with pytest.raises(TargetStateError, match="delta.setTransactionRetentionDuration"):
            action()
    assert target.table().version() == version
    assert target.rows() == sorted(ROWS_A)
    fs, path = target.place.storage.fs_and_path(f"{attempt_dir}/{manifest.committables[0].path}")
    assert fs.get_file_info(path).type.name == "File"  # the clean-up deleted nothing

    # Through the commit sequence: a new checkpoint stays uncommitted, its error recorded.
    layout = StagingLayout(target.staging)
    import io

    import pyarrow.parquet as pq

    buf = io.BytesIO()
    pq.write_table(pa.table({"id": [9], "name": ["late"]}), buf)
    stage_checkpoint(
        sqlite_store,
        layout,
        "events",
        "2026-01-05",
        {"dt=2026-01-05/p-0.parquet": buf.getvalue()},
        mode="append",
    )
    with pytest.raises(TargetStateError):
        CheckpointCommitter(sqlite_store, layout, publisher, mode="append").commit(
            "events", "2026-01-05", actor=ACTOR
        )
    record = sqlite_store.get("events", "2026-01-05")
    assert record.state != "COMMITTED" and "delta.setTransactionRetentionDuration" in (record.error or "")
    assert target.table().version() == version
