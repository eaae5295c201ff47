"""``CheckpointWriter`` staging through a :class:`StagingStore` (issue 23): on moto's real S3 API
server the attempt is recorded under the store's root, described from the store's metadata and
sealed by the store's conditional put; the durability gate then finds it complete. A local store
is its layout (the local path is unchanged)."""

from __future__ import annotations

import io
import uuid
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from airflow_provider_walsink.core.commit.writer import CheckpointWriter
from airflow_provider_walsink.core.protocol import CheckpointState as S
from airflow_provider_walsink.core.protocol.checksum import Hasher
from airflow_provider_walsink.core.protocol.manifest import digest_of
from airflow_provider_walsink.core.staging.object_store import (
    AttemptLocation,
    StagingStore,
    StagingStoreError,
)
from airflow_provider_walsink.triggers.durable import evaluate_durability
from tests.helpers import ACTOR
from tests.table_fixtures import ACCESS_KEY, REGION, SECRET_KEY, s3_server  # noqa: F401


def _parquet(ids: list[str]) -> bytes:
    buf = io.BytesIO()
    pq.write_table(pa.table({"id": pa.array(ids, pa.string())}), buf)
    return buf.getvalue()


@pytest.fixture
def s3_store(s3_server) -> StagingStore:  # noqa: F811
    options = {"endpoint_url": s3_server.endpoint, "access_key": ACCESS_KEY, "secret_key": SECRET_KEY,
               "region": REGION}  # fmt: skip
    return StagingStore.open(f"s3://{s3_server.bucket}/{uuid.uuid4().hex[:12]}/staging", options)


def test_a_writer_stages_and_seals_through_an_object_store(sqlite_store, s3_store):
    sqlite_store.register("p", "k1", mode="append", actor=ACTOR)
    writer = CheckpointWriter(sqlite_store, s3_store, "p", "k1", actor=ACTOR, partition_columns=("dt",))
    location = writer.begin()
    assert isinstance(location, AttemptLocation)
    record = sqlite_store.require("p", "k1")
    assert record.state is S.WRITING and record.staging_root == s3_store.root_uri
    assert location.uri.startswith(f"{s3_store.root_uri}/p/k1/attempt-1-{record.attempt_id}")
    payloads = {"dt=2026-01-01/a.parquet": _parquet(["a", "b"]), "dt=2026-01-02/b.parquet": _parquet(["c"])}
    for rel, data in payloads.items():
        with s3_store.filesystem.open_output_stream(s3_store.committable(location, rel)) as out:
            out.write(data)
    writer.add_files(list(payloads), rows={"dt=2026-01-01/a.parquet": 2, "dt=2026-01-02/b.parquet": 1},
                     checksum="crc32", writer="t")  # fmt: skip
    by_path = {c.path: c for c in writer.committables}
    for rel, data in payloads.items():
        hasher = Hasher("crc32")
        hasher.update(data)
        assert (by_path[rel].size, by_path[rel].checksum) == (len(data), hasher.value())
    manifest, digest = writer.seal(file_format="parquet", job="t", end_offsets={"src": 3})
    # The seal is on the store, byte for byte what the committer table records.
    stored = s3_store.read_manifest(location, expected_digest=digest)
    assert stored == manifest and stored.attempt_id == record.attempt_id
    record = sqlite_store.require("p", "k1")
    assert record.state is S.SEALED and record.manifest_digest == digest == digest_of(manifest.to_bytes())
    assert record.manifest_uri == f"{location.uri}/_manifest.json"
    status = evaluate_durability(sqlite_store, s3_store, "p", "k1", actor=ACTOR, verify_checksums=True)
    assert status.durable, status.message
    # Nothing was written locally.
    assert not Path(s3_store.root_uri).exists()


def test_a_file_missing_from_the_store_is_refused_when_described(sqlite_store, s3_store):
    sqlite_store.register("p", "k1", mode="append", actor=ACTOR)
    writer = CheckpointWriter(sqlite_store, s3_store, "p", "k1", actor=ACTOR)
    location = writer.begin()
    with pytest.raises(FileNotFoundError) as err:
        writer.add_files(["missing.parquet"])
    assert str(err.value) == f"{location.uri}/missing.parquet: not staged"
    assert writer.committables == []


def test_a_writer_refuses_a_store_other_than_the_checkpoints_recorded_root(sqlite_store, s3_store, tmp_path):
    sqlite_store.register("p", "k1", mode="append", actor=ACTOR)
    first = sqlite_store.start_attempt("p", "k1", actor=ACTOR, staging_root=str(tmp_path / "elsewhere"))
    assert first.staging_root == str(tmp_path / "elsewhere")
    writer = CheckpointWriter(sqlite_store, s3_store, "p", "k1", actor=ACTOR)
    with pytest.raises(
        StagingStoreError, match="stage every attempt of a checkpoint under its recorded root"
    ):
        writer.begin()
    assert (
        s3_store.list_attempt(s3_store.attempt("p", "k1", 2, sqlite_store.require("p", "k1").attempt_id))
        == {}
    )


def test_a_local_store_is_its_layout(sqlite_store, tmp_path):
    store = StagingStore.open(tmp_path / "staging")
    sqlite_store.register("p", "k1", mode="append", actor=ACTOR)
    writer = CheckpointWriter(sqlite_store, store, "p", "k1", actor=ACTOR)
    attempt_dir = writer.begin()
    assert isinstance(attempt_dir, Path) and attempt_dir.is_dir()
    assert attempt_dir.parent == tmp_path / "staging" / "p" / "k1"
    (attempt_dir / "a.parquet").write_bytes(_parquet(["a"]))
    writer.add_files(["a.parquet"], rows={"a.parquet": 1})
    _manifest, digest = writer.seal()
    record = sqlite_store.require("p", "k1")
    assert record.staging_root is None  # as a writer given the layout: nothing recorded
    assert (
        record.manifest_uri == (attempt_dir / "_manifest.json").as_uri() and record.manifest_digest == digest
    )
    assert evaluate_durability(sqlite_store, store.layout, "p", "k1", actor=ACTOR).durable


@pytest.mark.parametrize("root", ["local", "s3"])
def test_a_second_seal_of_the_attempt_with_other_bytes_is_refused_and_the_first_stands(
    root, sqlite_store, tmp_path, request
):
    """A zombie or speculative driver sealing the same attempt again (other committables) is refused
    on every staging root (the local one overwrote the manifest before); the sealed manifest and
    its recorded digest are unchanged, and the checkpoint stays committable."""
    from airflow_provider_walsink.core.staging.object_store import AlreadySealedError

    staging = (
        StagingStore.open(tmp_path / "staging") if root == "local" else request.getfixturevalue("s3_store")
    )
    sqlite_store.register("p", "k1", mode="append", actor=ACTOR)
    writer = CheckpointWriter(sqlite_store, staging, "p", "k1", actor=ACTOR)
    writer.begin()
    location = staging.attempt("p", "k1", writer.attempt, writer.record.attempt_id)
    for name, rows in (("a.parquet", ["a"]), ("b.parquet", ["b", "c"])):
        with staging.filesystem.open_output_stream(staging.committable(location, name)) as out:
            out.write(_parquet(rows))
    writer.add_files(["a.parquet"], rows={"a.parquet": 1})
    first, digest = writer.seal()

    zombie = CheckpointWriter(sqlite_store, staging, "p", "k1", actor=ACTOR)
    zombie.record, zombie.committables = writer.record, []
    zombie.add_files(["b.parquet"], rows={"b.parquet": 2})
    with pytest.raises(AlreadySealedError):
        zombie.seal()
    assert digest_of(staging.read_manifest_bytes(location)) == digest
    assert staging.read_manifest(location, expected_digest=digest).attempt_id == first.attempt_id
    record = sqlite_store.require("p", "k1")
    assert record.manifest_digest == digest and record.state is S.SEALED
