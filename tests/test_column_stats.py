"""Column statistics: from the writer's footers, sealed per committable, published by the table targets.

The claim (issue 24, "tables as fast to read as the library's own"): a query
filtering on a non-partition column reads no more files of a walsink-committed
table than of a table the table library wrote itself from the same files.
Files scanned are counted with each library's own pruning:

* Delta: deltalake's ``DeltaTable.to_pyarrow_dataset()`` gives every file a
  guarantee built from its add action's stats; ``get_fragments(filter=...)``
  returns the files a filtered read opens.
* Iceberg: pyiceberg's ``table.scan(row_filter=...).plan_files()`` (manifest
  and per-file metrics evaluation).

The data: one partition, four files (a real Spark job's tasks, range
partitioned on ``n``), so every file holds a distinct range of ``n``, of a
UTC timestamp, of a date and of long strings (longer than the 32 characters
kept, so truncation is exercised), plus a double and a timestamp without zone
(which keep no bounds, by design) and nulls.
"""

from __future__ import annotations

import datetime as dt
import json
import uuid

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from airflow_provider_walsink.core.protocol.errors import ManifestError
from airflow_provider_walsink.core.protocol.file_stats import (
    STRING_PREFIX_CHARS,
    file_stats_of,
    truncate_lower,
    truncate_upper,
)
from airflow_provider_walsink.core.protocol.manifest import (
    Committable,
    FileStats,
    build_manifest,
    digest_of,
    parse_manifest,
    read_manifest,
)
from airflow_provider_walsink.core.spark import CheckpointJob, ProtocolArgs
from airflow_provider_walsink.core.targets.base import PublishOutcome
from airflow_provider_walsink.core.targets.delta import DeltaPublisher, delta_stats, delta_stats_columns
from airflow_provider_walsink.core.targets.iceberg import IcebergPublisher
from tests.table_fixtures import ctx

FILES = 4
ROWS_PER_FILE = 50
START = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)


def _name(n: int) -> str:
    # Longer than STRING_PREFIX_CHARS: bounds are truncated, yet still separate the files.
    return f"customer-{n:06d}-" + "x" * 40


def _source_rows() -> list[tuple]:
    rows = []
    for n in range(FILES * ROWS_PER_FILE):
        rows.append(
            (
                "2026-01-01",
                n,
                None if n % 7 == 0 else _name(n),
                START + dt.timedelta(minutes=n, microseconds=n % 1000 + 1),
                (START + dt.timedelta(days=n)).date(),
                float(n) / 3,
            )
        )
    return rows


#: Predicates on non-partition columns, each matching rows of one file only.
def _predicates() -> dict[str, pc.Expression]:
    target = 2 * ROWS_PER_FILE + 6  # in the third file (and not a null name: 6 % 7)
    return {
        "n ==": pc.field("n") == target,
        "n between": (pc.field("n") >= target) & (pc.field("n") <= target + 3),
        "name ==": pc.field("name") == _name(target),
        "ts >=": pc.field("ts")
        >= pa.scalar(START + dt.timedelta(minutes=3 * ROWS_PER_FILE + 1), pa.timestamp("us", "UTC")),
        "day <": pc.field("day")
        < pa.scalar((START + dt.timedelta(days=ROWS_PER_FILE - 1)).date(), pa.date32()),
    }


def _stage_with_spark(spark, staging_root: str, writer: str):
    """A real Spark write phase: four tasks, one file each, into the table's staging root."""
    rows = _source_rows()
    df = spark.createDataFrame(
        rows, "dt string, n long, name string, ts timestamp, day date, ratio double"
    ).repartitionByRange(FILES, "n")
    protocol = ProtocolArgs(
        pipeline="stats",
        checkpoint_key="20260101T000000Z",
        sequence=1,
        attempt=1,
        attempt_id=uuid.uuid4().hex,
        staging_root=staging_root,
        partition_by=("dt",),
    )
    # The executors' writer stamps timestamps with Spark's session time zone (here the JVM's,
    # "Etc/UTC"), which deltalake refuses in a schema (found here, not fixed by this change):
    # name it "UTC" for this job.
    zone = spark.conf.get("spark.sql.session.timeZone")
    spark.conf.set("spark.sql.session.timeZone", "UTC")
    try:
        with CheckpointJob(spark, protocol, writer=writer) as job:
            job.stage(df)
    finally:
        spark.conf.set("spark.sql.session.timeZone", zone)
    manifest = job.store.read_manifest(job.location, expected_digest=job.sealed_digest)
    return manifest, job.location.uri if job.store.layout is None else str(job.attempt_dir)


def _fragments(table_uri: str, predicate: pc.Expression) -> int:
    from deltalake import DeltaTable

    return len(list(DeltaTable(table_uri).to_pyarrow_dataset().get_fragments(filter=predicate)))


@pytest.mark.spark
@pytest.mark.parametrize("writer", ["spark", "executors"])
def test_a_delta_commit_prunes_files_on_non_partition_columns_as_deltalakes_own_table(
    spark, tmp_path, writer
):
    from deltalake import DeltaTable, write_deltalake

    ours = str(tmp_path / "ours")
    publisher = DeltaPublisher(ours, "append", partition_by=["dt"], create_table=True)
    manifest, attempt_dir = _stage_with_spark(spark, publisher.staging_root(), writer)
    assert len(manifest.committables) == FILES
    assert all(c.stats is not None for c in manifest.committables)  # sealed in the manifest
    result = publisher.publish(manifest, attempt_dir, ctx(manifest))
    assert result.outcome is PublishOutcome.PUBLISHED

    # The library's own table: deltalake writes each of the same staged files as one file.
    theirs = str(tmp_path / "theirs")
    for c in manifest.committables:
        part = pq.read_table(f"{attempt_dir}/{c.path}")
        part = part.append_column("dt", pa.array(["2026-01-01"] * part.num_rows))
        write_deltalake(theirs, part, mode="append", partition_by=["dt"])
    assert len(DeltaTable(theirs).file_uris()) == FILES

    everything = DeltaTable(ours).to_pyarrow_table()
    assert everything.num_rows == FILES * ROWS_PER_FILE
    for label, predicate in _predicates().items():
        ours_scanned, theirs_scanned = _fragments(ours, predicate), _fragments(theirs, predicate)
        assert theirs_scanned < FILES, f"{label}: the library's own table prunes"
        assert ours_scanned <= theirs_scanned, (
            f"{label}: walsink's table scans {ours_scanned} files, the library's {theirs_scanned}"
        )
        # Skipping never loses a row: the pruned read returns what a full scan filtered returns.
        pruned = DeltaTable(ours).to_pyarrow_dataset().to_table(filter=predicate)
        assert pruned.num_rows == everything.filter(predicate).num_rows > 0, label

    actions = pa.table(DeltaTable(ours).get_add_actions(flatten=True)).to_pylist()
    for action in actions:
        assert action["num_records"] == ROWS_PER_FILE
        assert action["null_count.n"] == 0 and action["null_count.ratio"] == 0
        assert action["min.n"] < action["max.n"]
        # Strings longer than the prefix: truncated bounds that still bound the file.
        assert len(action["min.name"]) == STRING_PREFIX_CHARS
        # Doubles keep a null count but no bounds (NaN and -0.0 make them ill-defined).
        assert "min.ratio" not in action or action["min.ratio"] is None


def test_an_iceberg_commit_prunes_files_on_non_partition_columns_as_pyicebergs_own_table(tmp_path):
    """Iceberg's ``DataFile`` metrics are computed by pyiceberg's own function from the staged
    footers (as its ``add_files`` does), so walsink's table plans no more files than pyiceberg's."""
    from pyiceberg.expressions import EqualTo, GreaterThanOrEqual

    from tests.table_fixtures import Place, stage_attempt

    props = {"type": "sql", "uri": f"sqlite:///{tmp_path}/catalog.db", "warehouse": f"file://{tmp_path}/wh"}
    publisher = IcebergPublisher(
        "ns.ours", "append", catalog_properties=props, partition_by=["dt"], create_table=True
    )
    publisher.catalog.create_namespace_if_not_exists("ns")
    source = pa.table(
        {
            "dt": ["2026-01-01"] * (FILES * ROWS_PER_FILE),
            "n": pa.array(range(FILES * ROWS_PER_FILE), pa.int64()),
            "name": [_name(n) for n in range(FILES * ROWS_PER_FILE)],
        }
    )
    place = Place("local", str(tmp_path))
    manifest, attempt_dir = stage_attempt(
        place, publisher.staging_root(), "stats", "k1", [], table=source, files_per_partition=FILES
    )
    assert publisher.publish(manifest, attempt_dir, ctx(manifest)).outcome is PublishOutcome.PUBLISHED
    ours = publisher.load_table()
    theirs = publisher.catalog.create_table("ns.theirs", schema=ours.schema())
    for i in range(FILES):
        theirs.append(
            source.slice(i * ROWS_PER_FILE, ROWS_PER_FILE)
            .select(["n", "name", "dt"])
            .cast(ours.schema().as_arrow())
        )
    target = 2 * ROWS_PER_FILE + 6
    for row_filter in (
        EqualTo("n", target),
        EqualTo("name", _name(target)),
        GreaterThanOrEqual("n", 3 * ROWS_PER_FILE),
    ):
        planned_ours = len(list(ours.scan(row_filter=row_filter).plan_files()))
        planned_theirs = len(list(theirs.scan(row_filter=row_filter).plan_files()))
        assert planned_theirs < FILES
        assert planned_ours <= planned_theirs, row_filter


# --------------------------------------------------------------------------- the statistics themselves


def _footer(table: pa.Table, **kwargs) -> pq.FileMetaData:
    sink = pa.BufferOutputStream()
    pq.write_table(table, sink, **kwargs)
    return pq.read_metadata(pa.BufferReader(sink.getvalue()))


def test_file_stats_bound_what_is_well_defined_and_count_nulls_for_every_column():
    ts = pa.array([START, START + dt.timedelta(seconds=1, microseconds=7), None], pa.timestamp("us", "UTC"))
    table = pa.table(
        {
            "n": pa.array([3, -2, None], pa.int32()),
            "flag": [True, False, None],
            "day": pa.array([dt.date(2026, 1, 2), dt.date(2025, 12, 31), None]),
            "name": ["b" * 40, "a", None],
            "ts": ts,
            "ratio": [float("nan"), 1.5, None],
            "local": pa.array([dt.datetime(2026, 1, 1), None, None], pa.timestamp("us")),
            "amount": pa.array([None, None, None], pa.decimal128(10, 2)),
            "blob": [b"x", b"y", None],
            "tags": [["a"], [], None],
        }
    )
    stats = file_stats_of(_footer(table, row_group_size=2))  # two row groups: aggregated
    assert dict(stats.nulls) == {
        "n": 1, "flag": 1, "day": 1, "name": 1, "ts": 1, "ratio": 1, "local": 2, "amount": 3, "blob": 1
    }  # fmt: skip
    assert dict(stats.lower) == {
        "n": -2, "flag": False, "day": "2025-12-31", "name": "a", "ts": "2026-01-01T00:00:00.000000Z"
    }  # fmt: skip
    assert dict(stats.upper) == {
        "n": 3, "flag": True, "day": "2026-01-02", "name": "b" * 31 + "c", "ts": "2026-01-01T00:00:01.000007Z"
    }  # fmt: skip


def test_strings_are_truncated_as_iceberg_truncates_them():
    assert truncate_lower("abc", 2) == "ab"
    assert truncate_upper("abc", 2) == "ac"
    assert truncate_upper("ab", 2) == "ab"
    assert (
        truncate_upper("a\U0010ffffz", 2) == "b"
    )  # the greatest code point cannot grow: the one before does
    assert truncate_upper("\U0010ffff\U0010ffffz", 2) is None  # no upper bound at all
    assert truncate_upper("a\ud7ffz", 2) == "a\ue000"  # surrogates are skipped
    # Every value with the prefix sorts between the bounds, in UTF-8 byte order too.
    for value in ("é" * 40, "zz\U0001f600" * 20):
        low, high = truncate_lower(value, 8), truncate_upper(value, 8)
        assert low.encode() <= value.encode() < high.encode()


def test_delta_stats_round_timestamps_outwards_to_milliseconds_and_skip_unbounded_kinds():
    stats = FileStats.of(
        nulls={"ts": 0, "ratio": 2, "n": 1},
        lower={"ts": "2026-01-01T00:00:00.000999Z", "n": 1},
        upper={"ts": "2026-01-01T00:00:01.000001Z", "n": 9},
    )
    columns = delta_stats_columns(
        {"n": pa.int64(), "ts": pa.timestamp("us", "UTC"), "ratio": pa.float64(), "dt": pa.string()},
        ["dt"],
        {},
    )
    assert columns == {"n": "int", "ts": "timestamp", "ratio": ""}
    doc = json.loads(delta_stats(10, stats, columns))
    assert doc == {
        "numRecords": 10,
        "minValues": {"n": 1, "ts": "2026-01-01T00:00:00.000Z"},
        "maxValues": {"n": 9, "ts": "2026-01-01T00:00:01.001Z"},
        "nullCount": {"n": 1, "ratio": 2, "ts": 0},
    }
    # The table's settings choose the columns, as Delta's own writers do.
    assert list(
        delta_stats_columns({"a": pa.int64(), "b": pa.int64()}, [], {"delta.dataSkippingNumIndexedCols": "1"})
    ) == ["a"]
    assert list(
        delta_stats_columns({"a": pa.int64(), "b": pa.int64()}, [], {"delta.dataSkippingStatsColumns": "b"})
    ) == ["b"]
    assert delta_stats_columns({"a": pa.int64()}, [], {"delta.columnMapping.mode": "name"}) == {}


# --------------------------------------------------------------------------- the manifest


def _manifest(stats: FileStats | None):
    return build_manifest(
        pipeline="p",
        checkpoint_key="k1",
        sequence=1,
        attempt=1,
        attempt_id="a" * 32,
        file_format="parquet",
        partition_columns=("dt",),
        committables=[
            Committable("dt=1/part-0.parquet", 10, 5, None, "t0", stats),
            Committable("dt=1/part-1.parquet", 10, 5, None, "t1"),
        ],
    )


def test_stats_are_sealed_in_the_manifest_and_old_manifests_still_read(tmp_path):
    stats = FileStats.of(nulls={"n": 1, "name": 0}, lower={"n": 1, "name": "a"}, upper={"n": 9, "name": "b"})
    m = _manifest(stats)
    data = m.to_bytes()
    path = tmp_path / "_manifest.json"
    path.write_bytes(data)
    back = read_manifest(path, expected_digest=digest_of(data))
    assert back == m and back.committables[0].stats == stats and back.committables[1].stats is None
    assert back.to_bytes() == data  # re-serialised bytes keep the sealed digest
    doc = json.loads(data)
    assert doc["schema_version"] == 4
    assert doc["committables"][0]["stats"] == {
        "nulls": {"n": 1, "name": 0},
        "min": {"n": 1, "name": "a"},
        "max": {"n": 9, "name": "b"},
    }
    assert "stats" not in doc["committables"][1]  # absent, not null: old-size manifests without stats
    # A changed statistic is a changed manifest: the sealed digest no longer matches.
    doc["committables"][0]["stats"]["max"]["n"] = 99
    path.write_bytes(json.dumps(doc).encode())
    with pytest.raises(ManifestError, match="does not match the sealed digest"):
        read_manifest(path, expected_digest=digest_of(data))
    # A version-3 manifest (no stats) still reads, and commits without them.
    old = _manifest(None).to_json()
    old["schema_version"] = 3
    assert all(c.stats is None for c in parse_manifest(json.dumps(old).encode()).committables)


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda d: d.update(schema_version=3), r"unknown fields \['stats'\]"),
        (lambda d: d.update(format="csv"), "only recorded for parquet"),
        (lambda d: d["committables"][0]["stats"].update(extra={}), "unknown fields"),
        (lambda d: d["committables"][0]["stats"].pop("min"), "missing field 'min'"),
        (lambda d: d["committables"][0]["stats"]["nulls"].update(n=6), "from 0 to the rows"),
        (
            lambda d: d["committables"][0]["stats"]["min"].update(n=1.5),
            "must be an integer, a boolean or a string",
        ),
        (lambda d: d["committables"][0]["stats"]["min"].update(n=10), "is not at most max"),
        (lambda d: d["committables"][0]["stats"]["max"].update(n="9"), "is not at most max"),
        (lambda d: d["committables"][0]["stats"]["min"].update(name="x" * 300), "at most 256"),
        (lambda d: d["committables"][0].update(stats=[]), "must be an object"),
    ],
)
def test_invalid_stats_are_rejected(mutate, message):
    doc = _manifest(FileStats.of(nulls={"n": 1}, lower={"n": 1}, upper={"n": 9})).to_json()
    mutate(doc)
    with pytest.raises(ManifestError, match=message):
        parse_manifest(json.dumps(doc).encode())
