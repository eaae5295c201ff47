"""Issue 23: commit a checkpoint staged on an object store into an Iceberg or Delta table on the
same store, by reference (the staged objects become the table's data files; nothing is copied).

Real parts only: a real Spark job (``writer="executors"``) stages to ``s3://`` on moto's S3
server and seals its manifest there; the durability gate checks the attempt on the store; the
real committer (SQLite committer table) publishes it through the Iceberg (pyiceberg
``SqlCatalog``, warehouse on the bucket) or Delta (deltalake, ``storage_options``) publisher;
the tables are read back with their own libraries.
"""

from __future__ import annotations

import uuid
from pathlib import Path

import pyarrow.fs as pafs
import pytest

from airflow_provider_walsink.core.commit import CheckpointCommitter
from airflow_provider_walsink.core.commit import commit as commit_module
from airflow_provider_walsink.core.protocol import CheckpointState as S
from airflow_provider_walsink.core.protocol.errors import CommittableError, PathEscapeError
from airflow_provider_walsink.core.protocol.manifest import Committable
from airflow_provider_walsink.core.spark import CheckpointJob, ProtocolArgs
from airflow_provider_walsink.core.staging.object_store import StagingStore
from airflow_provider_walsink.core.targets.base import StagedAttempt, StaticContext
from airflow_provider_walsink.triggers.durable import evaluate_durability
from tests.helpers import ACTOR, forget_checkpoint
from tests.table_fixtures import ACCESS_KEY, REGION, SECRET_KEY, S3Server, s3_server  # noqa: F401

pytestmark = [pytest.mark.spark, pytest.mark.slow]

DAYS = {"2026-01-01": 12, "2026-01-02": 7}


def _store_options(server) -> dict[str, str]:
    if not isinstance(server, S3Server):  # fake-gcs-server, Azurite: their roots' options
        return dict(server.options)
    return {
        "endpoint_url": server.endpoint,
        "access_key": ACCESS_KEY,
        "secret_key": SECRET_KEY,
        "region": REGION,
    }


def _uri(server, path: str) -> str:
    """``path`` in the server's bucket (Azure: container) as a URI of the server's kind."""
    if isinstance(server, S3Server):
        return f"s3://{server.bucket}/{path}"
    return server.root(path) if hasattr(server, "root") else f"gs://{server.bucket}/{path}"


def _publisher(kind: str, server, tmp_path: Path, prefix: str, mode: str):
    if kind == "iceberg":
        from airflow_provider_walsink.core.targets.iceberg import IcebergPublisher
        from tests.model.stores import of_server

        props = {
            "type": "sql",
            "uri": f"sqlite:///{tmp_path}/catalog.db",
            "warehouse": _uri(server, f"{prefix}/warehouse"),
            **(
                server.iceberg_properties()
                if isinstance(server, S3Server)
                else of_server(server).iceberg_properties()
            ),
        }
        return IcebergPublisher(
            "ns.events", mode, catalog_properties=props, partition_by=["dt"], create_table=True
        )
    from airflow_provider_walsink.core.targets.delta import DeltaPublisher

    return DeltaPublisher(
        f"s3://{server.bucket}/{prefix}/events",
        mode,
        storage_options=server.delta_options(),
        partition_by=["dt"],
        create_table=True,
    )


def _source(days: dict[str, int], salt: str = "") -> list[tuple[str, str, int]]:
    return [(f"{salt}{day}-{i}", day, i) for day, n in days.items() for i in range(n)]


def _stage(
    spark, store, staging: StagingStore, key: str, rows: list[tuple[str, str, int]], mode: str, server
):
    """The write task and the durability sensor: a real Spark job stages to the store and seals
    there; the gate marks the checkpoint DURABLE from the store's listing. Returns the job."""
    store.register("events", key, mode=mode, actor=ACTOR)
    record = store.start_attempt("events", key, actor=ACTOR, staging_root=staging.root_uri)
    protocol = ProtocolArgs(
        pipeline="events",
        checkpoint_key=key,
        sequence=record.sequence,
        attempt=record.attempt,
        attempt_id=record.attempt_id,
        staging_root=staging.root_uri,
        partition_by=("dt",),
    )
    with CheckpointJob(spark, protocol, storage_options=_store_options(server), writer="executors") as job:
        job.stage(spark.createDataFrame(rows, "id string, dt string, n int"))
    manifest = staging.read_manifest(job.location, expected_digest=job.sealed_digest)
    store.seal_manifest(
        manifest,
        manifest_uri=f"{job.location.uri}/_manifest.json",
        manifest_digest=job.sealed_digest,
        actor=ACTOR,
    )
    status = evaluate_durability(store, staging, "events", key, actor=ACTOR, verify_checksums=True)
    assert status.durable, status.message
    return job, manifest


def _data_files(kind: str, publisher) -> list[str]:
    table = publisher.load_table()
    if table is None:
        return []
    if kind == "iceberg":
        return [task.file.file_path for task in table.scan().plan_files()]
    return list(table.file_uris())


def _rows(kind: str, publisher) -> list[tuple[str, str, int]]:
    table = publisher.load_table()
    arrow = table.scan().to_arrow() if kind == "iceberg" else table.to_pyarrow_table()
    return sorted((r["id"], r["dt"], r["n"]) for r in arrow.to_pylist())


def _version(kind: str, publisher) -> object:
    table = publisher.load_table()
    if table is None:
        return None
    return table.current_snapshot().snapshot_id if kind == "iceberg" else table.version()


@pytest.fixture
def bucket_prefix() -> str:
    return uuid.uuid4().hex[:12]


#: The emulators' session fixtures (Iceberg only on GCS and Azure here: Delta on abfss:// runs in
#: test_delta_target.py and the e2e DAG; deltalake's GCS client needs the XML API fake-gcs-server lacks).
STORES = {"s3": "s3_server", "gs": "gcs_server", "abfss": "azurite_server"}


@pytest.mark.parametrize(
    ("kind", "on"), [("iceberg", "s3"), ("delta", "s3"), ("iceberg", "gs"), ("iceberg", "abfss")]
)
def test_a_checkpoint_staged_on_an_object_store_is_committed_into_a_table_on_the_same_store_by_reference(
    kind,
    on,
    request,
    spark,
    sqlite_store,
    tmp_path,
    bucket_prefix,
    monkeypatch,
):
    """Staged by executors on moto (and, for Iceberg, fake-gcs-server and Azurite), durable on the
    store, committed by reference: the table's data files are exactly the staged objects, each row
    once; a re-run is a no-op that says so; a commit raising after the table commit, re-run,
    publishes nothing twice, also after the committer rows are deleted (the table's marker decides)."""
    server = request.getfixturevalue(STORES[on])
    mode = "overwrite"
    publisher = _publisher(kind, server, tmp_path, bucket_prefix, mode)
    root = publisher.staging_root()
    assert root is not None and root.startswith(_uri(server, f"{bucket_prefix}/"))
    staging = StagingStore.open(root, _store_options(server))
    source = _source(DAYS)
    job, manifest = _stage(spark, sqlite_store, staging, "k1", source, mode, server)
    staged_uris = sorted(f"{job.location.uri}/{c.path}" for c in manifest.committables)
    assert all(u.startswith(_uri(server, "")) for u in staged_uris)

    committer = CheckpointCommitter(sqlite_store, staging, publisher, mode=mode)
    summary = committer.commit("events", "k1", actor=ACTOR)
    assert summary.state == "COMMITTED" and not summary.already_committed
    assert summary.published == len(manifest.committables)
    # By reference: the table's data files are the staged objects themselves, nothing copied.
    assert sorted(_data_files(kind, publisher)) == staged_uris
    keys = {k for k in server.list(f"{bucket_prefix}/") if k.endswith(".parquet")}
    assert keys == {u.split("/", 3)[3] for u in staged_uris}
    assert _rows(kind, publisher) == sorted(source)
    committed_version = _version(kind, publisher)
    # The clean-up after COMMITTED dropped the manifest only: the data files stay referenced.
    fs_info = staging.filesystem.get_file_info(job.location.manifest_path)
    assert fs_info.type == pafs.FileType.NotFound

    again = CheckpointCommitter(sqlite_store, staging, publisher, mode=mode).commit(
        "events", "k1", actor=ACTOR
    )
    assert again.already_committed and again.state == "COMMITTED" and again.published == 0
    assert _version(kind, publisher) == committed_version and _rows(kind, publisher) == sorted(source)

    # A second checkpoint: the commit raises right after the table commit (before COMMITTED).
    second = _source({"2026-01-03": 5}, salt="b")
    _stage(spark, sqlite_store, staging, "k2", second, mode, server)

    def crash_after_publish(name: str) -> None:
        if name == "commit.after_publish":
            raise RuntimeError("killed after the table commit")

    monkeypatch.setattr(commit_module, "crashpoint", crash_after_publish)
    with pytest.raises(RuntimeError, match="killed after the table commit"):
        CheckpointCommitter(sqlite_store, staging, publisher, mode=mode).commit("events", "k2", actor=ACTOR)
    monkeypatch.undo()
    assert sqlite_store.require("events", "k2").state is not S.COMMITTED
    landed = _version(kind, publisher)
    assert _rows(kind, publisher) == sorted(source + second)
    rerun = CheckpointCommitter(sqlite_store, staging, publisher, mode=mode).commit(
        "events", "k2", actor=ACTOR
    )
    assert rerun.state == "COMMITTED" and rerun.published == 0 and rerun.already_published > 0
    assert _version(kind, publisher) == landed and _rows(kind, publisher) == sorted(source + second)

    # Retention deletes k1's committer rows; the interval is written and committed again: the
    # table's marker says it holds k1, so its partitions are replaced, never added twice.
    forget_checkpoint(sqlite_store, "events", "k1")
    _stage(spark, sqlite_store, staging, "k1", source, mode, server)
    redo = CheckpointCommitter(sqlite_store, staging, publisher, mode=mode).commit(
        "events", "k1", actor=ACTOR
    )
    assert redo.state == "COMMITTED" and sorted(redo.partitions_replaced) == [
        "dt=2026-01-01",
        "dt=2026-01-02",
    ]
    assert _rows(kind, publisher) == sorted(source + second)


@pytest.mark.parametrize("kind", ["iceberg", "delta"])
@pytest.mark.parametrize("damage", ["deleted", "resized"])
def test_an_object_deleted_or_resized_after_durability_is_refused_before_the_table_changes(
    kind,
    damage,
    spark,
    s3_server,  # noqa: F811
    sqlite_store,
    tmp_path,
    bucket_prefix,
):
    mode = "append"
    publisher = _publisher(kind, s3_server, tmp_path, bucket_prefix, mode)
    staging = StagingStore.open(publisher.staging_root(), _store_options(s3_server))
    job, manifest = _stage(spark, sqlite_store, staging, "k1", _source(DAYS), mode, s3_server)
    victim = manifest.committables[-1].path
    path = staging.committable(job.location, victim)
    if damage == "deleted":
        staging.filesystem.delete_file(path)
        expected = f"{victim}: missing from staging"
    else:
        with staging.filesystem.open_output_stream(path) as f:
            f.write(b"not parquet")
        expected = f"{victim}: 11 bytes staged, the manifest records {manifest.committables[-1].size}"
    before = _version(kind, publisher)
    committer = CheckpointCommitter(sqlite_store, staging, publisher, mode=mode)
    with pytest.raises(CommittableError, match="table left unchanged") as err:
        committer.commit("events", "k1", actor=ACTOR)
    assert expected in str(err.value)
    assert _version(kind, publisher) == before  # no table commit (Iceberg: no table either)
    record = sqlite_store.require("events", "k1")
    assert record.state is S.FAILED and victim in (record.error or "")


@pytest.mark.parametrize("kind", ["iceberg", "delta"])
def test_a_manifest_path_escaping_the_attempt_is_refused_before_anything_is_read(
    kind,
    spark,
    s3_server,  # noqa: F811
    sqlite_store,
    tmp_path,
    bucket_prefix,
):
    """The committer reads only sealed manifests, which never name ``..``; a publisher given one
    anyway (a tool, a forged manifest) refuses it by the store's confinement, table untouched."""
    import copy

    mode = "append"
    publisher = _publisher(kind, s3_server, tmp_path, bucket_prefix, mode)
    staging = StagingStore.open(publisher.staging_root(), _store_options(s3_server))
    job, manifest = _stage(spark, sqlite_store, staging, "k1", _source(DAYS), mode, s3_server)
    # An object outside the attempt that the forged path would name.
    outside = f"{staging.base}/events/k1/x.parquet"
    with staging.filesystem.open_output_stream(outside) as f:
        f.write(b"PAR1")
    hostile = copy.copy(manifest)
    first = manifest.committables[0]
    object.__setattr__(hostile, "committables", (Committable("../x.parquet", 4, first.rows, None, "e"),))
    with pytest.raises(PathEscapeError, match=r"\.\."):
        publisher.publish(hostile, StagedAttempt(staging, job.location), StaticContext.for_manifest(hostile))
    assert _version(kind, publisher) is None


@pytest.mark.parametrize("kind", ["iceberg", "delta"])
def test_with_table_fencing_the_tables_marker_decides_after_a_crash_and_lost_committer_rows(
    kind,
    spark,
    s3_server,  # noqa: F811
    sqlite_store,
    tmp_path,
    bucket_prefix,
    monkeypatch,
):
    """``append`` with ``fencing="table"``: the commit raises after the table commit, retention
    deletes the committer rows, the interval is written again (a new attempt): the commit finds the
    first attempt in the table's marker, records it COMMITTED and publishes nothing: each row once."""
    mode = "append"
    publisher = _publisher(kind, s3_server, tmp_path, bucket_prefix, mode)
    staging = StagingStore.open(publisher.staging_root(), _store_options(s3_server))
    source = _source(DAYS)
    first, first_manifest = _stage(spark, sqlite_store, staging, "k1", source, mode, s3_server)

    def crash_after_publish(name: str) -> None:
        if name == "commit.after_publish":
            raise RuntimeError("killed after the table commit")

    # The step is the commit sequence's, whichever fencing (core/commit/commit.py).
    monkeypatch.setattr(commit_module, "crashpoint", crash_after_publish)
    committer = CheckpointCommitter(sqlite_store, staging, publisher, mode=mode, fencing="table")
    with pytest.raises(RuntimeError, match="killed after the table commit"):
        committer.commit("events", "k1", actor=ACTOR)
    monkeypatch.undo()
    landed = _version(kind, publisher)
    assert sorted(_data_files(kind, publisher)) == sorted(
        f"{first.location.uri}/{c.path}" for c in first_manifest.committables
    )

    forget_checkpoint(sqlite_store, "events", "k1")
    _stage(spark, sqlite_store, staging, "k1", source, mode, s3_server)
    summary = CheckpointCommitter(sqlite_store, staging, publisher, mode=mode, fencing="table").commit(
        "events", "k1", actor=ACTOR
    )
    record = sqlite_store.require("events", "k1")
    assert summary.state == "COMMITTED" and summary.published == 0
    assert record.sealed_attempt_id == first_manifest.attempt_id  # the attempt the table holds
    assert record.committables == first_manifest.expected_count  # read from its manifest on the store
    assert _version(kind, publisher) == landed and _rows(kind, publisher) == sorted(source)
