"""The widened data domain (tests/data_domain.py) through every target and both modes.

Partition values Spark writes but the other tests never stage: NULL and ``''``
(``__HIVE_DEFAULT_PARTITION__``), every character Spark escapes in a path, spaces
(leading, inner, trailing), non-ASCII letters, a value that looks escaped (``%41``),
the word ``NULL``, dates and timestamps (``2026-01-01 00%3A00%3A00``), over two
partition columns. Each checkpoint is staged as the write job stages it (Hive
directories named by the reference escape, partition columns not in the files, a
sha256 per committable through :class:`CheckpointWriter`), passes the real durability
gate, is committed by the real :class:`CheckpointCommitter` with ``verify_checksums``,
and the target is read back with its own library (pyiceberg, deltalake, SQL; the file
target with pyarrow's Hive partitioning, as Spark reads it):

* every row once, its partition values as written (NULL and ``''`` as NULL, see
  data_domain.py);
* ``overwrite``: a checkpoint replaces exactly its partitions (the NULL one, an escaped
  one, ``a`` beside ``a `` and `` a``) and nothing else; ``append`` adds;
* a re-commit is a no-op, and the target names the attempt it holds;
* bytes rewritten with the same size after durability: refused, nothing published,
  FAILED with the error (where tests/test_checksums_every_target.py does not already:
  ``append``, and the file target).

Real parts: Iceberg (SQL catalog on SQLite) and Delta on local disk and on moto's S3
server (staged there too), the SQL target on PostgreSQL and MariaDB, the file target on
local disk; the committer table on SQLite.
"""

from __future__ import annotations

import datetime as dt
import io
import os
import uuid
import zlib
from collections import Counter
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq
import pytest
import sqlalchemy as sa

from airflow_provider_walsink.core.commit import CheckpointCommitter, CheckpointWriter
from airflow_provider_walsink.core.protocol import CheckpointState as S
from airflow_provider_walsink.core.protocol.errors import ChecksumMismatchError
from airflow_provider_walsink.core.protocol.partitions import (
    partition_dir,
    partition_text,
    partition_value,
    partition_values,
)
from airflow_provider_walsink.core.staging.layout import StagingLayout
from airflow_provider_walsink.triggers.durable import evaluate_durability
from tests import data_domain as D
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

PIPELINE = "domain"
CASES = [
    ("iceberg", "local"),
    ("iceberg", "s3"),
    ("delta", "local"),
    ("delta", "s3"),
    ("sql-postgresql", "local"),
    ("sql-mysql", "local"),
    ("files", "local"),
]
#: (kind, mode) pairs whose corrupted-bytes refusal tests/test_checksums_every_target.py already checks.
CHECKSUMS_COVERED = {(k, "overwrite") for k, _ in CASES if k != "files"}


# --------------------------------------------------------------------------- the one escape


def test_the_package_escapes_and_parses_every_domain_value_as_spark_does():
    """``partition_text`` (the executors' writer) names each value's directory as Spark does, and
    ``partition_value`` (every target's reader) gives back what the target must hold."""
    for value in [*D.STRINGS.values(), *D.TEMPORAL.values(), True, 7]:
        text = partition_text(value)
        assert text == D.spark_text(value), value
        assert partition_value(text) == D.expected(value), value
    assert partition_text("2026-01-01 00:00:00") == "2026-01-01 00%3A00%3A00"
    assert partition_value("%2541") == "%41" and partition_value("%41") == "A"
    assert partition_value("100%") == "100%"  # Spark's unescape keeps a "%" not followed by hex
    values = (None, "a/b", D.TEMPORAL["fraction"])
    directory = partition_dir(D.COLUMNS + ("x",), values)
    assert directory == "k=__HIVE_DEFAULT_PARTITION__/t=a%2Fb/x=2026-01-02 12%3A30%3A45.5"
    assert partition_values(p.split("=", 1) for p in directory.split("/")) == {
        "k": None, "t": "a/b", "x": "2026-01-02 12:30:45.5"
    }  # fmt: skip


def test_the_executors_writer_names_every_domain_partition_as_spark_does(tmp_path, monkeypatch):
    """The writer the job's executors run (``executor_writer``, here without Spark: a stand-in
    task context) puts each row under the directory Spark's ``partitionBy`` would, ``''`` and NULL
    in one, the partition columns left out of the files."""
    import pyarrow.fs as pafs
    import pyspark

    from airflow_provider_walsink.core.spark.executor_write import executor_writer

    class Task:
        partitionId = staticmethod(lambda: 0)  # noqa: N815 (Spark's names)
        taskAttemptId = staticmethod(lambda: 7)  # noqa: N815
        attemptNumber = staticmethod(lambda: 1)  # noqa: N815

    monkeypatch.setattr(pyspark.TaskContext, "get", staticmethod(lambda: Task))

    def stamp(v: Any) -> Any:  # the temporal column as a Spark TIMESTAMP column: dates at midnight
        return dt.datetime.combine(v, dt.time()) if type(v) is dt.date else v

    rows = [(r[0], r[1], stamp(r[2])) for r in D.Domain(1).first("k").rows] + [
        (999, "", dt.datetime(2026, 1, 1))
    ]
    table = pa.table(
        {
            "id": [r[0] for r in rows],
            "k": pa.array([r[1] for r in rows], pa.string()),
            "t": pa.array([r[2] for r in rows], pa.timestamp("us")),
        }
    )
    write = executor_writer(
        pafs.LocalFileSystem(), str(tmp_path), prefix="", partition_by=D.COLUMNS, checksum="sha256"
    )
    written = pa.Table.from_batches(list(write(iter(table.to_batches(max_chunksize=7))))).to_pylist()
    by_dir = Counter()
    for f in written:
        assert f["path"].startswith(f["partition"] + "/") and (tmp_path / f["path"]).is_file()
        assert pq.read_schema(tmp_path / f["path"]).names == ["id"]
        by_dir[f["partition"]] += f["rows"]
    want = Counter(D.partition_dir(r[1:]) for r in rows)
    assert by_dir == want
    assert "k=__HIVE_DEFAULT_PARTITION__/t=2026-01-01 00%3A00%3A00" in by_dir  # '' is NULL's directory


# --------------------------------------------------------------------------- one target


class Target:
    """One target of one kind and mode, with its staging (a local layout, or an S3 staging store)."""

    def __init__(self, kind: str, staging: str, mode: str, tmp_path: Path, request: Any) -> None:
        self.kind, self.mode = kind, mode
        prefix = uuid.uuid4().hex[:12]
        self.server = request.getfixturevalue("s3_server") if staging == "s3" else None
        columns = list(D.COLUMNS)
        if kind.startswith("sql-"):
            from airflow_provider_walsink.core.targets.sql import SqlPublisher

            self.url = request.getfixturevalue("database_urls")(kind.removeprefix("sql-"))
            self.table = f"d_{prefix}"
            self.staging: Any = StagingLayout(tmp_path / "staging")
            self.publisher: Any = SqlPublisher(
                self.url, self.table, mode=mode, layout=self.staging, partition_by=columns
            )
            return
        if kind == "files":
            from airflow_provider_walsink.core.targets.files import FilePublisher

            self.staging = StagingLayout(tmp_path / "staging")
            self.root = tmp_path / "files"
            self.publisher = FilePublisher(self.root, mode, layout=self.staging, partition_by=columns)
            return
        if kind == "iceberg":
            from airflow_provider_walsink.core.targets.iceberg import IcebergPublisher

            spec = local_table_spec(kind, tmp_path)
            props = dict(spec["props"])
            if self.server is not None:
                props.update(warehouse=f"s3://{self.server.bucket}/{prefix}/warehouse")
                props.update(self.server.iceberg_properties())
            self.publisher = IcebergPublisher(
                spec["identifier"], mode, catalog_properties=props, partition_by=columns, create_table=True
            )
        else:
            from airflow_provider_walsink.core.targets.delta import DeltaPublisher

            uri, options = local_table_spec(kind, tmp_path)["uri"], {}
            if self.server is not None:
                uri, options = f"s3://{self.server.bucket}/{prefix}/events", self.server.delta_options()
            self.publisher = DeltaPublisher(
                uri, mode, storage_options=options, partition_by=columns, create_table=True
            )
        root = self.publisher.staging_root()
        self.staging = staging_of(root, self.server)

    def put(self, where: Any, relative: str, data: bytes) -> None:
        put_staged(self.staging, where, relative, data)

    def rows(self) -> Counter:
        """What the target holds, as ``(id, k, t)``."""
        if self.kind.startswith("sql-"):
            engine = sa.create_engine(self.url)
            try:
                if not sa.inspect(engine).has_table(self.table):
                    return Counter()
                with engine.connect() as conn:
                    return Counter(
                        tuple(r) for r in conn.execute(sa.text(f"SELECT id, k, t FROM {self.table}"))
                    )
            finally:
                engine.dispose()
        if self.kind == "files":
            if not self.root.exists():
                return Counter()
            partitioning = ds.HivePartitioning(
                pa.schema([("k", pa.string()), ("t", pa.string())]), null_fallback=D.SPARK_NULL
            )  # pyarrow decodes %XX (segment_encoding="uri") and maps the null name, as Spark reads it
            table = ds.dataset(self.root, format="parquet", partitioning=partitioning).to_table()
        else:
            loaded = self.publisher.load_table()
            if loaded is None:
                return Counter()
            table = loaded.scan().to_arrow() if self.kind == "iceberg" else loaded.to_pyarrow_table()
        return Counter((r["id"], r["k"], r["t"]) for r in table.select(["id", "k", "t"]).to_pylist())


def parquet(rows: list[tuple[Any, ...]]) -> bytes:
    """A partition's rows as the job writes them: the partition columns left out (they are the path)."""
    buf = io.BytesIO()
    table = pa.table({"id": pa.array([r[0] for r in rows], pa.int64()), "note": [f"n{r[0]}" for r in rows]})
    pq.write_table(table, buf, compression="NONE", use_dictionary=False)
    return buf.getvalue()


def stage_durable(
    store: Any, target: Target, checkpoint: D.Checkpoint, *, verify: bool = False
) -> tuple[Any, dict[str, bytes], Any]:
    """Register, stage one file per partition (sha256 each), seal, and pass the durability gate
    (``verify``: with ``verify_checksums``; the commits verify them in any case)."""
    store.register(PIPELINE, checkpoint.key, mode=target.mode, actor=ACTOR, target="domain")
    writer = CheckpointWriter(store, target.staging, PIPELINE, checkpoint.key, actor=ACTOR,
                              partition_columns=D.COLUMNS)  # fmt: skip
    where = writer.begin()
    files = {
        f"{directory}/part-{zlib.crc32(directory.encode()):08x}.parquet": parquet(rows)
        for directory, rows in checkpoint.partitions().items()
    }
    for rel, data in files.items():
        target.put(where, rel, data)
    writer.add_files(list(files), rows={rel: pq.read_metadata(pa.BufferReader(files[rel])).num_rows
                                        for rel in files}, writer="t")  # fmt: skip
    manifest, _digest = writer.seal(file_format="parquet")
    status = evaluate_durability(
        store, target.staging, PIPELINE, checkpoint.key, actor=ACTOR, verify_checksums=verify
    )
    assert status.durable, status.message
    return where, files, manifest


def audited(target: Target, manifest: Any, where: Any) -> Counter:
    """``(id, k, t)`` as the audit gate's checks see the staged attempt (DuckDB over the files)."""
    from airflow_provider_walsink.core.commit.audit import StagedData

    if isinstance(where, Path):
        data = StagedData(target.staging, manifest, where)
    else:
        data = StagedData.on_store(target.staging, manifest, where)
    with data:
        return Counter(tuple(r) for r in data.relation().select("id, k, t").fetchall())


# --------------------------------------------------------------------------- the property


@pytest.mark.parametrize("mode", ["overwrite", "append"])
@pytest.mark.parametrize(("kind", "staging"), CASES)
def test_every_domain_value_lands_once_as_written_on_every_target(
    kind, staging, mode, tmp_path, sqlite_store, request
):
    # One seed per case; WALSINK_DOMAIN_SEED=<n> draws other checkpoints (a failure names its seed).
    seed = zlib.crc32(f"{kind}-{staging}-{mode}-{os.environ.get('WALSINK_DOMAIN_SEED', '')}".encode())
    domain, store = D.Domain(seed), sqlite_store
    target = Target(kind, staging, mode, tmp_path, request)
    committer = CheckpointCommitter(store, target.staging, target.publisher, mode=mode, verify_checksums=True)
    note = f"seed {seed}"

    first = domain.first("20260101T000000Z")
    where, _files, manifest1 = stage_durable(store, target, first)
    if mode == "append" and kind == "delta":  # the audit gate reads the staged values (local and S3)
        assert audited(target, manifest1, where) == first.expected(), note
    assert committer.commit(PIPELINE, first.key, actor=ACTOR).state == "COMMITTED", note
    want = first.expected()
    assert target.rows() == want, note

    second = domain.replacing("20260102T000000Z", first)
    _where, _files, manifest2 = stage_durable(store, target, second)
    assert committer.commit(PIPELINE, second.key, actor=ACTOR).state == "COMMITTED", note
    want = D.overwrite(want, second) if mode == "overwrite" else want + second.expected()
    assert target.rows() == want, note

    # A re-commit is a no-op that says so; the target names the attempts it holds.
    again = committer.commit(PIPELINE, second.key, actor=ACTOR)
    assert again.already_committed, note
    assert target.rows() == want, note
    if kind != "files":
        assert target.publisher.published_attempt(manifest2) == manifest2.attempt_id
        assert target.publisher.published_attempt(manifest1) == manifest1.attempt_id
    elif mode == "overwrite":  # the file target remembers by partition markers (append: its journal)
        assert target.publisher.published_attempt(manifest2) == manifest2.attempt_id

    if (kind, mode) in CHECKSUMS_COVERED:
        return
    # Bytes rewritten with the same size after durability: refused, nothing published, FAILED.
    third = domain.small("20260103T000000Z")
    where, files, manifest3 = stage_durable(store, target, third, verify=True)
    rel = next(r for r in files if D.SPARK_NULL in r)
    changed = files[rel].replace(b"n", b"m")
    assert changed != files[rel] and len(changed) == len(files[rel])
    target.put(where, rel, changed)
    with pytest.raises(ChecksumMismatchError, match="nothing was published") as refused:
        committer.commit(PIPELINE, third.key, actor=ACTOR)
    assert target.rows() == want, note
    assert target.publisher.published_attempt(manifest3) != manifest3.attempt_id
    row = store.require(PIPELINE, third.key)
    assert row.state is S.FAILED and row.error == str(refused.value)


@pytest.mark.parametrize("backend", ["postgresql", "mysql"])
def test_an_sql_table_whose_partition_column_is_not_null_refuses_the_null_partition(
    backend, tmp_path, sqlite_store, request
):
    """A table made by an earlier walsink (partition columns ``NOT NULL``) cannot hold the NULL
    partition: the commit is refused naming the column and the fix, FAILED, nothing loaded; a
    checkpoint without NULL partitions still loads."""
    target = Target(f"sql-{backend}", "local", "overwrite", tmp_path, request)
    engine = sa.create_engine(target.url)
    try:
        sa.Table(
            target.table,
            sa.MetaData(),
            sa.Column("id", sa.BigInteger),
            sa.Column("note", sa.Text),
            sa.Column("k", sa.String(255), nullable=False),
            sa.Column("t", sa.String(255), nullable=False),
        ).create(engine)
    finally:
        engine.dispose()
    store = sqlite_store
    committer = CheckpointCommitter(
        store, target.staging, target.publisher, mode="overwrite", verify_checksums=True
    )
    with_null = D.Checkpoint("20260101T000000Z", [(1, "a:b", None), (2, "x", D.TEMPORAL["midnight"])])
    stage_durable(store, target, with_null)
    with pytest.raises(Exception, match="partition column 't' is NOT NULL in the table") as refused:
        committer.commit(PIPELINE, with_null.key, actor=ACTOR)
    assert "nothing written" in str(refused.value)
    assert target.rows() == Counter()
    row = store.require(PIPELINE, with_null.key)
    assert row.state is S.FAILED and row.error == str(refused.value)

    without = D.Checkpoint("20260102T000000Z", [(3, "a:b", D.TEMPORAL["fraction"])])
    stage_durable(store, target, without)
    assert committer.commit(PIPELINE, without.key, actor=ACTOR).state == "COMMITTED"
    assert target.rows() == without.expected()


@pytest.mark.parametrize("kind", ["delta", "iceberg"])
def test_a_typed_partition_column_refuses_a_value_it_cannot_hold(kind, tmp_path, sqlite_store, request):
    """A table made by hand with a ``date`` partition column takes ``2026-01-01`` (and NULL) from a
    path; a timestamp in that column is refused before the table changes (FAILED, the error
    recorded) and the table still reads. Delta committed such a value as text and every later
    read of the table failed ("Failed to parse value ... as 'date'")."""
    target = Target(kind, "local", "append", tmp_path, request)
    schema = pa.schema([("id", pa.int64()), ("note", pa.string()), ("k", pa.string()), ("t", pa.date32())])
    publisher = target.publisher
    if kind == "delta":
        from deltalake import DeltaTable

        DeltaTable.create(publisher.table_uri, schema, partition_by=list(D.COLUMNS))
    else:
        from pyiceberg.catalog import Catalog
        from pyiceberg.partitioning import PartitionField, PartitionSpec
        from pyiceberg.schema import assign_fresh_schema_ids
        from pyiceberg.transforms import IdentityTransform

        iceberg = assign_fresh_schema_ids(Catalog._convert_schema_if_needed(schema))
        spec = PartitionSpec(
            *(
                PartitionField(iceberg.find_field(c).field_id, 1000 + i, IdentityTransform(), c)
                for i, c in enumerate(D.COLUMNS)
            )
        )
        publisher.catalog.create_namespace_if_not_exists(publisher.namespace)
        publisher.catalog.create_table(publisher.identifier, schema=iceberg, partition_spec=spec)
    store = sqlite_store
    committer = CheckpointCommitter(store, target.staging, publisher, mode="append", verify_checksums=True)
    dates = D.Checkpoint("20260101T000000Z", [(1, "a:b", D.TEMPORAL["date"]), (2, "", None)])
    stage_durable(store, target, dates)
    assert committer.commit(PIPELINE, dates.key, actor=ACTOR).state == "COMMITTED"
    want = Counter({(1, "a:b", D.TEMPORAL["date"]): 1, (2, None, None): 1})
    assert target.rows() == want

    stamps = D.Checkpoint("20260102T000000Z", [(3, "a", D.TEMPORAL["midnight"])])
    stage_durable(store, target, stamps)
    with pytest.raises(Exception, match="'2026-01-01 00:00:00' is not a valid date") as refused:
        committer.commit(PIPELINE, stamps.key, actor=ACTOR)
    assert "table unchanged" in str(refused.value)
    assert target.rows() == want
    row = store.require(PIPELINE, stamps.key)
    assert row.state is S.FAILED and row.error == str(refused.value)


def test_an_overwrite_replaces_a_timestamp_partition_of_a_delta_table(tmp_path, sqlite_store, request):
    """A Delta table made with a ``timestamp`` (UTC) partition column, as Spark makes one: an
    overwrite of ``t=2026-01-02 12%3A30%3A45.5`` replaces it. The table's values were compared as
    ``str()`` (``...45.500000+00:00``) with the directory's (``...45.5``): never equal, so the old
    rows stayed beside the new ones."""
    target = Target("delta", "local", "overwrite", tmp_path, request)
    from deltalake import DeltaTable

    schema = pa.schema(
        [("id", pa.int64()), ("note", pa.string()), ("k", pa.string()), ("t", pa.timestamp("us", "UTC"))]
    )
    DeltaTable.create(target.publisher.table_uri, schema, partition_by=list(D.COLUMNS))
    store = sqlite_store
    committer = CheckpointCommitter(
        store, target.staging, target.publisher, mode="overwrite", verify_checksums=True
    )
    fraction, midnight = D.TEMPORAL["fraction"], D.TEMPORAL["midnight"]
    utc = dt.UTC
    for i, key in enumerate(["20260101T000000Z", "20260102T000000Z"]):
        checkpoint = D.Checkpoint(key, [(1 + i, "a b", fraction), (10 + i, "%41", midnight)])
        stage_durable(store, target, checkpoint)
        assert committer.commit(PIPELINE, key, actor=ACTOR).state == "COMMITTED"
        assert target.rows() == Counter(
            {
                (1 + i, "a b", fraction.replace(tzinfo=utc)): 1,
                (10 + i, "%41", midnight.replace(tzinfo=utc)): 1,
            }
        )
