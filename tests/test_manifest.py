"""The manifest: schema-versioned JSON, atomic seal, strict validation."""

from __future__ import annotations

import json
import os

import pytest

from airflow_provider_walsink.protocol import (
    Committable,
    ManifestError,
    build_manifest,
    digest_of,
    parse_manifest,
    read_manifest,
    write_manifest,
)
from airflow_provider_walsink.protocol.manifest import MAX_MANIFEST_BYTES


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
    assert doc["schema_version"] == 2
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
