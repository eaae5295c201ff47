"""The manifest: schema-versioned JSON, atomic seal, strict validation."""

from __future__ import annotations

import json
import os

import pytest

from airflow_provider_walsink.core.protocol import (
    Committable,
    ManifestError,
    build_manifest,
    digest_of,
    parse_manifest,
    read_manifest,
    write_manifest,
)
from airflow_provider_walsink.core.protocol.manifest import MAX_MANIFEST_BYTES


def manifest(**overrides):
    values = dict(
        pipeline="events",
        checkpoint_key="20260101T000000Z",
        sequence=3,
        attempt=2,
        attempt_id="a" * 32,
        file_format="parquet",
        committables=[
            Committable("dt=2026-01-01/part-1.parquet", 20, 5, "sha256:" + "b" * 64, "task-1"),
            Committable("dt=2026-01-01/part-0.parquet", 10, 2, "crc32:0badf00d", "task-0"),
        ],
        start_offsets={"files": 3},
        end_offsets={"files": 7},
    )
    values.update(overrides)
    return build_manifest(**values)


def test_round_trip_keeps_every_field_and_orders_committables(tmp_path):
    m = manifest()
    path = tmp_path / "_manifest.json"
    digest = write_manifest(path, m)
    assert digest == digest_of(path.read_bytes())
    back = read_manifest(path, expected_digest=digest)
    assert back == m
    assert [c.path for c in back.committables] == sorted(c.path for c in m.committables)
    doc = json.loads(path.read_bytes())
    assert doc["schema_version"] == 4
    assert doc["file_schema"] is None
    assert doc["attempt_id"] == "a" * 32
    assert doc["checkpoint"] == {"key": "20260101T000000Z", "sequence": 3}
    assert doc["totals"] == {"count": 2, "rows": 7, "bytes": 30}
    assert doc["expected_count"] == 2
    assert doc["source_offsets"] == {"start": {"files": 3}, "end": {"files": 7}}
    assert doc["committables"][0]["writer"] == "task-0"


def test_atomic_write_leaves_no_temp_file_and_replaces_whole(tmp_path):
    path = tmp_path / "_manifest.json"
    write_manifest(path, manifest(attempt=1))
    write_manifest(path, manifest(attempt=2))
    assert os.listdir(tmp_path) == ["_manifest.json"]
    assert read_manifest(path).attempt == 2


def test_digest_mismatch_is_rejected(tmp_path):
    path = tmp_path / "_manifest.json"
    write_manifest(path, manifest())
    with pytest.raises(ManifestError, match="does not match the sealed digest"):
        read_manifest(path, expected_digest="sha256:" + "0" * 64)


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda d: d.update(schema_version=99), "unknown schema_version 99"),
        (lambda d: d.pop("pipeline"), "missing field 'pipeline'"),
        (lambda d: d.update(surprise=1), "unknown fields"),
        (lambda d: d.update(expected_count=5), "expected_count 5"),
        (lambda d: d["totals"].update(rows=1), "totals"),
        (lambda d: d["committables"][0].update(size=-1), "size must be a non-negative"),
        (lambda d: d["committables"][0].update(size=True), "wrong type"),
        (lambda d: d["committables"][0].update(path="/etc/passwd"), "absolute"),
        (lambda d: d["committables"][0].update(path="dt=1/../../x"), "'..'"),
        (lambda d: d["committables"][0].update(path="notapartition/x.parquet"), "column=value"),
        (lambda d: d["committables"][0].update(checksum="md5:abc"), "checksum"),
        (lambda d: d.update(pipeline="a/b"), "invalid pipeline id"),
        (lambda d: d.update(format="exe"), "format 'exe'"),
        (lambda d: d["committables"].append(dict(d["committables"][0])), "listed twice"),
    ],
)
def test_invalid_manifests_are_rejected_naming_the_problem(mutate, message):
    doc = manifest().to_json()
    mutate(doc)
    with pytest.raises(ManifestError, match=message):
        parse_manifest(json.dumps(doc).encode())


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"{not json", "not valid JSON"),
        (b"[]", "must be a JSON object"),
        (b"\xff\xfe", "not valid JSON"),
        (b'{"schema_version": NaN}', "not valid JSON"),
        (b"[" * 100_000, "not valid JSON"),
    ],
)
def test_unparseable_bytes_are_rejected(data, message):
    with pytest.raises(ManifestError, match=message):
        parse_manifest(data)


def test_oversized_manifest_is_refused_before_parsing():
    with pytest.raises(ManifestError, match="exceed the manifest limit"):
        parse_manifest(b" " * (MAX_MANIFEST_BYTES + 1))


def test_manifest_behind_a_symlink_is_not_followed(tmp_path):
    real = tmp_path / "real.json"
    write_manifest(real, manifest())
    link = tmp_path / "_manifest.json"
    link.symlink_to(real)
    with pytest.raises(ManifestError, match="cannot be opened"):
        read_manifest(link)


def test_missing_manifest_says_it_was_not_sealed(tmp_path):
    with pytest.raises(ManifestError, match="has not sealed it"):
        read_manifest(tmp_path / "_manifest.json")


# --------------------------------------------------------------------------- file_schema (version 3)


def _file_schema(table):
    import io

    import pyarrow.parquet as pq

    from airflow_provider_walsink.core.protocol.file_schema import file_schema_of

    buf = io.BytesIO()
    pq.write_table(table, buf)
    return file_schema_of(pq.read_metadata(io.BytesIO(buf.getvalue())))


def test_file_schema_round_trips_and_decodes_to_the_files_arrow_schema(tmp_path):
    import pyarrow as pa

    from airflow_provider_walsink.core.protocol.file_schema import arrow_schema

    table = pa.table({"id": pa.array([1], pa.int64()), "ts": pa.array([1], pa.timestamp("us"))})
    recorded = _file_schema(table)
    m = manifest(file_schema=recorded)
    path = tmp_path / "_manifest.json"
    write_manifest(path, m)
    back = read_manifest(path)
    assert back == m and back.file_schema == recorded
    assert json.loads(path.read_bytes())["file_schema"] == {"arrow": recorded.arrow, "int96": []}
    assert arrow_schema(back.file_schema).equals(table.schema)


def test_int96_columns_are_recorded():
    import io

    import pyarrow as pa
    import pyarrow.parquet as pq

    from airflow_provider_walsink.core.protocol.file_schema import file_schema_of

    buf = io.BytesIO()
    pq.write_table(
        pa.table({"ts": pa.array([1], pa.timestamp("us"))}), buf, use_deprecated_int96_timestamps=True
    )
    assert file_schema_of(pq.read_metadata(io.BytesIO(buf.getvalue()))).int96 == ("ts",)


def test_common_file_schema_is_none_unless_every_file_has_the_same_one():
    import pyarrow as pa

    from airflow_provider_walsink.core.protocol.file_schema import common_file_schema

    a = _file_schema(pa.table({"id": pa.array([1], pa.int64())}))
    b = _file_schema(pa.table({"id": pa.array(["x"])}))
    assert common_file_schema([a, a, a]) == a
    assert common_file_schema([a, b]) is None
    assert common_file_schema([a, None]) is None
    assert common_file_schema([]) is None


def test_version_2_manifests_stay_readable_without_file_schema():
    doc = manifest().to_json()
    doc["schema_version"] = 2
    del doc["file_schema"]
    back = parse_manifest(json.dumps(doc).encode())
    assert back.schema_version == 2 and back.file_schema is None
    assert "file_schema" not in back.to_json()


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda d: d.update(schema_version=2), r"unknown fields \['file_schema'\]"),
        (lambda d: d.update(format="csv"), "only recorded for parquet"),
        (lambda d: d["file_schema"].update(arrow="not base64!"), "not base64"),
        (lambda d: d["file_schema"].update(arrow=""), "non-empty string"),
        (lambda d: d["file_schema"].update(int96=[1]), "must list column names"),
        (lambda d: d["file_schema"].update(extra=1), "unknown fields"),
        (lambda d: d.update(file_schema="x"), "object or null"),
    ],
)
def test_invalid_file_schemas_are_rejected(mutate, message):
    import pyarrow as pa

    doc = manifest(file_schema=_file_schema(pa.table({"id": [1]}))).to_json()
    mutate(doc)
    with pytest.raises(ManifestError, match=message):
        parse_manifest(json.dumps(doc).encode())


def test_a_file_schema_that_is_not_an_arrow_schema_is_refused_when_decoded():
    import base64

    from airflow_provider_walsink.core.protocol.file_schema import arrow_schema
    from airflow_provider_walsink.core.protocol.manifest import FileSchema

    with pytest.raises(ManifestError, match="not an Arrow schema"):
        arrow_schema(FileSchema(base64.b64encode(b"garbage").decode()))
