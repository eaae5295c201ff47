"""Issue 35: ``verify_checksums`` means the same for every target kind and staging store, enforced
by one shared step of the commit sequence before anything is published (core/commit/checksums.py).

A checkpoint is staged (Parquet, through :class:`CheckpointWriter`: sha256 per committable),
sealed and verified durable by the real durability gate; then one committable's bytes are
rewritten, same size, so only a checksum can tell. Real parts only: Iceberg (pyiceberg SQL
catalog) and Delta tables on local disk and on moto's S3 server (staged there too, published
by reference), the SQL target on PostgreSQL and MariaDB (local staging: it loads from a local
root only), the committer table on SQLite.
"""

from __future__ import annotations

import hashlib
import io
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import sqlalchemy as sa

from airflow_provider_walsink.core.commit import CheckpointCommitter, CheckpointWriter
from airflow_provider_walsink.core.protocol import CheckpointState as S
from airflow_provider_walsink.core.protocol.errors import ChecksumMismatchError
from airflow_provider_walsink.core.staging.layout import StagingLayout
from airflow_provider_walsink.triggers.durable import evaluate_durability
from tests.helpers import ACTOR
from tests.table_fixtures import (  # noqa: F401
    ACCESS_KEY,
    REGION,
    SECRET_KEY,
    local_table_spec,
    put_staged,
    s3_server,
    staging_of,
)

pytestmark = pytest.mark.slow

PIPELINE = "events"
ORIGINAL, CHANGED = b"name-original", b"name-CHANGED!"  # same length: same size, other bytes
CASES = [
    ("iceberg", "local"),
    ("iceberg", "s3"),
    ("delta", "local"),
    ("delta", "s3"),
    ("sql-postgresql", "local"),
    ("sql-mysql", "local"),
]


def parquet(ids: list[int], names: list[str]) -> bytes:
    """Plain (no dictionary, no compression) pages: a value's bytes appear as they are."""
    buf = io.BytesIO()
    table = pa.table({"id": pa.array(ids, pa.int64()), "name": pa.array(names, pa.string())})
    pq.write_table(table, buf, compression="NONE", use_dictionary=False)
    return buf.getvalue()


class Target:
    """One target of one kind, with its staging (a local layout, or an S3 staging store)."""

    def __init__(self, kind: str, staging: str, tmp_path: Path, request: pytest.FixtureRequest) -> None:
        self.kind = kind
        prefix = uuid.uuid4().hex[:12]
        self.server = request.getfixturevalue("s3_server") if staging == "s3" else None
        if kind.startswith("sql-"):
            from airflow_provider_walsink.core.targets.sql import SqlPublisher

            self.url = request.getfixturevalue("database_urls")(kind.removeprefix("sql-"))
            self.table = f"t_{prefix}"
            layout = StagingLayout(tmp_path / "staging")
            self.publisher: Any = SqlPublisher(
                self.url, self.table, mode="overwrite", layout=layout, partition_by=("dt",)
            )
            self.staging: Any = layout
            return
        if kind == "iceberg":
            from airflow_provider_walsink.core.targets.iceberg import IcebergPublisher

            spec = local_table_spec(kind, tmp_path)
            props = dict(spec["props"])
            if self.server is not None:
                props.update(warehouse=f"s3://{self.server.bucket}/{prefix}/warehouse")
                props.update(self.server.iceberg_properties())
            self.publisher = IcebergPublisher(
                spec["identifier"],
                "overwrite",
                catalog_properties=props,
                partition_by=["dt"],
                create_table=True,
            )
        else:
            from airflow_provider_walsink.core.targets.delta import DeltaPublisher

            if self.server is None:
                self.publisher = DeltaPublisher(
                    local_table_spec(kind, tmp_path)["uri"],
                    "overwrite",
                    partition_by=["dt"],
                    create_table=True,
                )
            else:
                self.publisher = DeltaPublisher(
                    f"s3://{self.server.bucket}/{prefix}/events",
                    "overwrite",
                    storage_options=self.server.delta_options(),
                    partition_by=["dt"],
                    create_table=True,
                )
        root = self.publisher.staging_root()
        self.staging = staging_of(root, self.server)

    def put(self, where: Any, relative: str, data: bytes) -> None:
        put_staged(self.staging, where, relative, data)

    def rows(self) -> Counter:
        """What the target holds, as ``(id, name)``."""
        if self.kind.startswith("sql-"):
            engine = sa.create_engine(self.url)
            try:
                if not sa.inspect(engine).has_table(self.table):
                    return Counter()
                with engine.connect() as conn:
                    return Counter(
                        (r.id, r.name) for r in conn.execute(sa.text(f"SELECT id, name FROM {self.table}"))
                    )
            finally:
                engine.dispose()
        table = self.publisher.load_table()
        if table is None:
            return Counter()
        arrow = table.scan().to_arrow() if self.kind == "iceberg" else table.to_pyarrow_table()
        return Counter((r["id"], r["name"]) for r in arrow.to_pylist())


def stage_durable(
    store: Any, target: Target, key: str, days: tuple[str, ...] = ("2026-01-01", "2026-01-02")
) -> tuple[Any, dict[str, bytes], Any]:
    """Register, stage one Parquet committable (sha256 each) per day, seal, and pass the real
    durability gate with ``verify_checksums``. The first day's file holds ``name-original``.
    Returns (attempt location, staged bytes by path, manifest)."""
    store.register(PIPELINE, key, mode="overwrite", actor=ACTOR, target="table")
    writer = CheckpointWriter(store, target.staging, PIPELINE, key, actor=ACTOR, partition_columns=("dt",))
    where = writer.begin()
    files = {f"dt={days[0]}/part-0.parquet": parquet([1, 2], ["name-original", "other-0001"])}
    files.update(
        {
            f"dt={day}/part-{i}.parquet": parquet([i + 2], [f"other-{i + 1:04d}"])
            for i, day in enumerate(days[1:], 1)
        }
    )
    for rel, data in files.items():
        target.put(where, rel, data)
    writer.add_files(list(files), rows={rel: 2 if "part-0" in rel else 1 for rel in files}, writer="t")
    manifest, _digest = writer.seal(file_format="parquet")
    status = evaluate_durability(store, target.staging, PIPELINE, key, actor=ACTOR, verify_checksums=True)
    assert status.durable, status.message
    return where, files, manifest


@pytest.mark.parametrize(("kind", "staging"), CASES)
def test_a_committable_changed_after_durability_is_refused_before_any_table_target_publishes(
    kind, staging, tmp_path, sqlite_store, request
):
    """With ``verify_checksums``: refused, naming the committable and both checksums; nothing in
    the target; the checkpoint uncommitted (FAILED) with the error recorded. Without it: the
    target checks sizes only, so the changed bytes are published as they are (documented)."""
    store, target, key = sqlite_store, Target(kind, staging, tmp_path, request), "20260101T000000Z"
    where, files, manifest = stage_durable(store, target, key)
    rel = "dt=2026-01-01/part-0.parquet"
    changed = files[rel].replace(ORIGINAL, CHANGED)
    assert changed != files[rel] and len(changed) == len(files[rel])
    target.put(where, rel, changed)
    recorded = next(c.checksum for c in manifest.committables if c.path == rel)
    actual = "sha256:" + hashlib.sha256(changed).hexdigest()

    verifying = CheckpointCommitter(
        store, target.staging, target.publisher, mode="overwrite", verify_checksums=True
    )
    with pytest.raises(ChecksumMismatchError) as refused:
        verifying.commit(PIPELINE, key, actor=ACTOR)
    message = str(refused.value)
    assert f"1 checksum mismatch: {rel} ({actual}, manifest says {recorded})" in message
    assert "nothing was published" in message
    assert target.rows() == Counter()  # nothing in the target
    assert target.publisher.published_attempt(manifest) is None
    row = store.require(PIPELINE, key)
    assert row.state is S.FAILED and not row.is_committed
    assert row.error == message
    assert store.history(PIPELINE, key)[-1].detail == message

    # A re-run refuses again (the bytes are still changed), and still publishes nothing.
    with pytest.raises(ChecksumMismatchError):
        verifying.commit(PIPELINE, key, actor=ACTOR)
    assert target.rows() == Counter()

    # verify_checksums off: sizes match, so the target publishes the changed bytes as they are.
    summary = CheckpointCommitter(store, target.staging, target.publisher, mode="overwrite").commit(
        PIPELINE, key, actor=ACTOR
    )
    assert summary.state == "COMMITTED"
    assert target.rows() == Counter({(1, CHANGED.decode()): 1, (2, "other-0001"): 1, (3, "other-0002"): 1})


@pytest.mark.parametrize("kind", ["iceberg", "delta"])
def test_a_group_commit_leaves_out_a_member_whose_bytes_changed(kind, tmp_path, sqlite_store, request):
    """The shared check runs for every member of a group before the one table commit: the changed
    member is recorded FAILED with its error and left out, the others are committed together."""
    store, target = sqlite_store, Target(kind, "local", tmp_path, request)
    days = {f"2026010{i}T000000Z": (f"2026-01-0{i}",) for i in (1, 2, 3)}  # disjoint: they may group
    staged = {key: stage_durable(store, target, key, day) for key, day in days.items()}
    leader_key, bad, other = days
    where, files, _manifest = staged[bad]
    rel = "dt=2026-01-02/part-0.parquet"
    target.put(where, rel, files[rel].replace(ORIGINAL, CHANGED))
    leader = CheckpointCommitter(
        store, target.staging, target.publisher, mode="overwrite", group_commit=8, verify_checksums=True
    )
    summary = leader.commit(PIPELINE, leader_key, actor=ACTOR)
    assert sorted(summary.group or []) == [leader_key, other]
    failed = store.require(PIPELINE, bad)
    assert failed.state is S.FAILED and f"1 checksum mismatch: {rel} (sha256:" in (failed.error or "")
    assert store.require(PIPELINE, other).state is S.COMMITTED
    assert target.rows() == Counter({(1, "name-original"): 2, (2, "other-0001"): 2})

    # The leader's own bytes changed: refused before the group publishes anything.
    key4 = "20260104T000000Z"
    where, files, _manifest = stage_durable(store, target, key4, ("2026-01-04",))
    rel = "dt=2026-01-04/part-0.parquet"
    target.put(where, rel, files[rel].replace(ORIGINAL, CHANGED))
    with pytest.raises(ChecksumMismatchError, match=f"1 checksum mismatch: {rel}"):
        leader.commit(PIPELINE, key4, actor=ACTOR)
    assert store.require(PIPELINE, key4).state is S.FAILED
    assert target.rows() == Counter({(1, "name-original"): 2, (2, "other-0001"): 2})
