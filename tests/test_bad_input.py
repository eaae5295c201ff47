"""Bad input: each a clear error; the checkpoint stays uncommitted with the error
recorded, and the target is unchanged."""

from __future__ import annotations

import json
import os

import pytest
from sqlalchemy import update

from airflow_provider_walsink.core.commit import CheckpointCommitter
from airflow_provider_walsink.core.protocol import CheckpointState as S
from airflow_provider_walsink.core.protocol import WalsinkError, digest_of
from airflow_provider_walsink.core.protocol.errors import ChecksumMismatchError
from airflow_provider_walsink.core.store.models import checkpoint_table as t
from airflow_provider_walsink.core.targets import FilePublisher
from tests.helpers import ACTOR, stage_checkpoint, target_files

FILES = {f"dt=2026-01-01/part-{i}.csv": f"row {i}\n".encode() * 3 for i in range(3)}


def reseal(store, layout, record, data: bytes) -> None:
    """Replace the sealed manifest with ``data`` and record its digest, as a buggy writer would."""
    path = layout.manifest_path("p", "k1", record.attempt)
    path.write_bytes(data)
    with store.engine.begin() as conn:
        conn.execute(update(t).where(t.c.id == record.id).values(manifest_digest=digest_of(data)))


def edit_manifest(store, layout, record, mutate) -> None:
    path = layout.manifest_path("p", "k1", record.attempt)
    doc = json.loads(path.read_bytes())
    mutate(doc)
    reseal(store, layout, record, json.dumps(doc).encode())


def break_with_outside_path(store, layout, record, tmp_path):
    secret = tmp_path / "secret.csv"
    secret.write_bytes(b"secret\n")
    edit_manifest(
        store,
        layout,
        record,
        lambda d: d["committables"][0].update(
            path="dt=2026-01-01/"
            + os.path.relpath(secret, layout.attempt_dir("p", "k1", record.attempt) / "dt=2026-01-01")
        ),
    )
    return secret


def break_with_symlink(store, layout, record, tmp_path):
    secret = tmp_path / "secret.csv"
    secret.write_bytes(b"row 0\nrow 0\nrow 0\n")  # same size as the committable it replaces
    staged = layout.attempt_dir("p", "k1", record.attempt) / "dt=2026-01-01" / "part-0.csv"
    staged.unlink()
    staged.symlink_to(secret)
    return secret


CASES = {
    "malformed JSON": (
        lambda s, lay, r, t: reseal(s, lay, r, b'{"schema_version": 1, "pipeline": '),
        "not valid JSON",
    ),
    "unknown schema version": (
        lambda s, lay, r, t: edit_manifest(s, lay, r, lambda d: d.update(schema_version=5)),
        "unknown schema_version 5",
    ),
    "committable outside the staging root": (break_with_outside_path, "'..'"),
    "symlink escaping the staging root": (break_with_symlink, "symlink"),
    "size mismatch": (
        lambda s, lay, r, t: (lay.attempt_dir("p", "k1", r.attempt) / "dt=2026-01-01/part-1.csv").write_bytes(
            b"x"
        ),
        "part-1.csv: staged file does not match the manifest",
    ),
    "missing file": (
        lambda s, lay, r, t: (lay.attempt_dir("p", "k1", r.attempt) / "dt=2026-01-01/part-2.csv").unlink(),
        "part-2.csv: missing from staging and not in the target",
    ),
}


@pytest.mark.parametrize("mode", ["append", "overwrite"])
@pytest.mark.parametrize("case", list(CASES))
def test_bad_input_is_refused_and_recorded(store, layout, tmp_path, case, mode):
    breaker, message = CASES[case]
    record, _, _ = stage_checkpoint(store, layout, "p", "k1", FILES, mode=mode)
    outside = breaker(store, layout, record, tmp_path)
    target = tmp_path / "target"
    target.mkdir()
    (target / "existing.csv").write_bytes(b"already here\n")
    committer = CheckpointCommitter(store, layout, FilePublisher(target, mode, layout=layout), mode=mode)

    with pytest.raises(WalsinkError, match=message) as raised:
        committer.commit("p", "k1", actor=ACTOR)

    after = store.require("p", "k1")
    assert after.state is S.FAILED and not after.is_committed
    assert after.error == str(raised.value)
    assert store.history("p", "k1")[-1].detail == str(raised.value)
    assert target_files(target) == {"existing.csv": b"already here\n"}
    if isinstance(outside, os.PathLike):
        assert outside.exists()  # nothing outside the staging root was moved
    assert layout.attempt_dir("p", "k1", record.attempt).exists()  # and the staged data is kept


def test_checksum_mismatch_is_caught_when_verifying(sqlite_store, layout, tmp_path):
    record, _, attempt_dir = stage_checkpoint(sqlite_store, layout, "p", "k1", FILES)
    (attempt_dir / "dt=2026-01-01/part-1.csv").write_bytes(b"row X\n" * 3)  # same size, other bytes
    target = tmp_path / "target"
    committer = CheckpointCommitter(
        sqlite_store,
        layout,
        FilePublisher(target, "overwrite", layout=layout, verify_checksums=True),
        mode="overwrite",
        verify_checksums=True,
    )
    with pytest.raises(
        ChecksumMismatchError, match=r"1 checksum mismatch: dt=2026-01-01/part-1.csv \(sha256:"
    ):
        committer.commit("p", "k1", actor=ACTOR)
    assert sqlite_store.require("p", "k1").state is S.FAILED
    assert target_files(target) == {}


def test_a_failed_checkpoint_commits_once_the_cause_is_fixed(sqlite_store, layout, tmp_path):
    record, _, attempt_dir = stage_checkpoint(sqlite_store, layout, "p", "k1", FILES)
    part = attempt_dir / "dt=2026-01-01/part-2.csv"
    saved = part.read_bytes()
    part.unlink()
    target = tmp_path / "target"
    committer = CheckpointCommitter(
        sqlite_store, layout, FilePublisher(target, "append", layout=layout), mode="append"
    )
    with pytest.raises(WalsinkError):
        committer.commit("p", "k1", actor=ACTOR)
    part.write_bytes(saved)
    assert committer.commit("p", "k1", actor=ACTOR).published == 3
    assert len(target_files(target)) == 3
