"""Staging layout and path confinement (invariant 6)."""

from __future__ import annotations

import os

import pytest

from airflow_provider_walsink.core.protocol import InvalidIdentifierError, PathEscapeError
from airflow_provider_walsink.core.staging import StagingLayout, confine


def test_layout_places_attempts_under_pipeline_and_checkpoint(tmp_path):
    layout = StagingLayout(tmp_path)
    assert layout.attempt_dir("p", "k1", 3) == tmp_path / "p" / "k1" / "attempt-3"
    assert layout.manifest_path("p", "k1", 3).name == "_manifest.json"


@pytest.mark.parametrize(
    "bad", ["", "..", "a/b", "../x", "a b", "'; DROP TABLE x;--", "é", ".hidden", "a..b"]
)
def test_identifiers_that_could_escape_or_inject_are_rejected(tmp_path, bad):
    with pytest.raises(InvalidIdentifierError):
        StagingLayout(tmp_path).attempt_dir(bad, "k", 1)
    with pytest.raises(InvalidIdentifierError):
        StagingLayout(tmp_path).attempt_dir("p", bad, 1)


@pytest.mark.parametrize("bad", ["/etc/passwd", "../outside", "a/../../outside", "", "a\x00b"])
def test_confine_rejects_absolute_dotdot_and_nul(tmp_path, bad):
    with pytest.raises(PathEscapeError):
        confine(tmp_path, bad)


def test_confine_rejects_a_symlink_escaping_the_root(tmp_path):
    root = tmp_path / "root"
    (root / "dt=1").mkdir(parents=True)
    outside = tmp_path / "secret"
    outside.write_text("secret")
    (root / "dt=1" / "f.parquet").symlink_to(outside)
    (root / "linkdir").symlink_to(tmp_path)
    with pytest.raises(PathEscapeError, match="outside"):
        confine(root, "dt=1/f.parquet")
    with pytest.raises(PathEscapeError, match="outside"):
        confine(root, "linkdir/secret")


def test_confine_accepts_paths_and_symlinks_inside(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "f").write_text("x")
    (tmp_path / "b").symlink_to(tmp_path / "a")
    assert confine(tmp_path, "b/f") == (tmp_path / "a" / "f").resolve()
    assert confine(tmp_path, "new/file") == tmp_path.resolve() / "new" / "file"


def test_committable_path_stays_inside_its_attempt(tmp_path):
    layout = StagingLayout(tmp_path)
    attempt = layout.attempt_dir("p", "k", 1)
    other = layout.attempt_dir("p", "k", 2)
    other.mkdir(parents=True)
    attempt.mkdir(parents=True)
    (attempt / "x").symlink_to(other)
    with pytest.raises(PathEscapeError, match="symlink"):
        layout.committable_path(attempt, "x/f.parquet")


def test_remove_refuses_a_symlinked_checkpoint_dir(tmp_path):
    layout = StagingLayout(tmp_path / "staging")
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "keep").write_text("keep")
    (tmp_path / "staging" / "p").mkdir(parents=True)
    os.symlink(victim, tmp_path / "staging" / "p" / "k")
    with pytest.raises(PathEscapeError):
        layout.remove_checkpoint("p", "k")
    assert (victim / "keep").exists()


def test_staging_root_given_as_a_file_uri_is_that_path_and_other_schemes_are_refused(tmp_path):
    """A table target's staging root is a URI (``file:///warehouse/t/_walsink``): it must stage
    there, never in a ``file:`` directory under the working directory (nor an ``s3:`` one)."""
    assert StagingLayout(f"file://{tmp_path}/t/_walsink").root == tmp_path / "t" / "_walsink"
    assert StagingLayout(f"file://localhost{tmp_path}/a b").root == tmp_path / "a b"
    assert StagingLayout(f"file://{tmp_path}/t").attempt_dir("p", "k", 1).is_relative_to(tmp_path)
    with pytest.raises(ValueError, match="not a local or mounted path"):
        StagingLayout("s3://bucket/warehouse/t/_walsink")
