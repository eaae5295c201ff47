"""The cached path confinement used per publish and per durability check.

``Confiner`` and ``StagingLayout.committable_resolver`` exist for speed (see
bench/README.md, benchmark 2); these tests hold them to exactly what
``confine`` and ``committable_path`` answer, escapes included.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from airflow_provider_walsink.core.protocol.errors import PathEscapeError
from airflow_provider_walsink.core.staging.layout import Confiner, StagingLayout, confine


@pytest.fixture
def tree(tmp_path):
    """A root with plain dirs, an inner dir symlink, inner and outer file symlinks, an outer dir symlink."""
    root = tmp_path / "root"
    outside = tmp_path / "outside"
    (root / "dt=1").mkdir(parents=True)
    (root / "dt=2").mkdir()
    outside.mkdir()
    (root / "dt=1" / "a.parquet").write_bytes(b"aa")
    (root / "dt=1" / "b.parquet").write_bytes(b"b")
    (outside / "secret").write_bytes(b"s")
    os.symlink(root / "dt=2", root / "alias")  # inside -> inside
    os.symlink(root / "dt=1" / "a.parquet", root / "dt=1" / "link-in.parquet")
    os.symlink(outside / "secret", root / "dt=1" / "link-out.parquet")
    os.symlink(outside, root / "escape")
    return root


SAME = [
    "dt=1/a.parquet",
    "dt=1/b.parquet",
    "dt=1/missing.parquet",
    "dt=1/link-in.parquet",
    "alias/x.parquet",
    "dt=3/new/deeper.parquet",
    "top.parquet",
    "dt=1/./a.parquet",
    "dt=1/",
]
ESCAPES = [
    "dt=1/link-out.parquet",
    "escape/secret",
    "escape/x/y",
    "../outside/secret",
    "/etc/passwd",
    "a\x00b",
]


def _outcome(fn, relative):
    try:
        return fn(relative)
    except PathEscapeError as e:
        return ("escape", str(e))


@pytest.mark.parametrize("list_dirs", [False, True], ids=["lstat", "listdir"])
@pytest.mark.parametrize("relative", SAME + ESCAPES)
def test_confiner_answers_exactly_what_confine_answers(tree, relative, list_dirs):
    confiner = Confiner(tree, what="target path", list_dirs=list_dirs)
    # Twice: the second answer comes from the cached parent directory.
    for _ in range(2):
        assert _outcome(confiner, relative) == _outcome(
            lambda r: confine(tree, r, what="target path"), relative
        )


def test_a_cached_directory_still_catches_an_escaping_file_next_to_good_ones(tree):
    confiner = Confiner(tree)
    assert confiner("dt=1/a.parquet") == tree / "dt=1" / "a.parquet"
    with pytest.raises(PathEscapeError, match="outside"):
        confiner("dt=1/link-out.parquet")
    assert confiner("dt=1/b.parquet") == tree / "dt=1" / "b.parquet"


@pytest.mark.parametrize("list_dirs", [False, True], ids=["lstat", "listdir"])
def test_resolve_returns_the_lstat_of_the_resolved_path(tree, list_dirs):
    confiner = Confiner(tree, list_dirs=list_dirs)
    path, st = confiner.resolve("dt=1/a.parquet")
    assert st is not None and st.st_size == 2
    path, st = confiner.resolve("dt=1/link-in.parquet")  # followed, like confine(): the target's stat
    assert path == str(tree / "dt=1" / "a.parquet") and st.st_size == 2
    assert confiner.resolve("dt=1/missing.parquet")[1] is None
    assert confiner.resolve("dt=1/a.parquet/under-a-file")[1] is None
    assert confiner.resolve("dt=3/new/deeper.parquet")[1] is None  # a directory that does not exist


def test_committable_resolver_matches_committable_path(tmp_path):
    layout = StagingLayout(tmp_path / "staging")
    attempt = layout.attempt_dir("pipe", "ckpt", 1)
    (attempt / "dt=1").mkdir(parents=True)
    (attempt / "dt=1" / "f.parquet").write_bytes(b"xyz")
    (tmp_path / "outside").mkdir()
    os.symlink(tmp_path / "outside", attempt / "dt=9")
    # Inside the staging root but outside the attempt: refused by both.
    os.symlink(layout.attempt_dir("pipe", "ckpt", 2), attempt / "other-attempt")
    resolve = layout.committable_resolver(attempt)
    for rel in ["dt=1/f.parquet", "dt=1/none.parquet", "dt=9/x.parquet", "other-attempt/x.parquet"]:
        expected = _outcome(lambda r: layout.committable_path(attempt, r), rel)
        got = _outcome(lambda r: Path(resolve(r)[0]), rel)
        assert got == expected, rel
    assert resolve("dt=1/f.parquet")[1].st_size == 3


@pytest.mark.parametrize(
    "path",
    [
        "a.parquet",
        "dt=1/part-0.snappy.parquet",
        "x",
        ".hidden",
        ".hidden.gz",
        "a.",
        "a.b.",
        "dt=1/a..b",
        "dt=1.5/f",
        "dt=1/.x.y.z",
        "..a.b",
        "part-00000-c000.csv.gz",
    ],
)
def test_target_suffixes_are_pathlibs(path):
    """The publisher's string-based suffixes (target names) equal ``PurePosixPath.suffixes``."""
    from pathlib import PurePosixPath

    from airflow_provider_walsink.core.targets.files import _suffixes

    assert _suffixes(path) == PurePosixPath(path).suffixes


@pytest.mark.parametrize(
    "path",
    [
        "f.parquet",
        "dt=1/f",
        "dt=1/h=2/f",
        "/dt=1/f",
        "dt=1//f",
        "./dt=1/f",
        "dt=1/./f",
        "dt=1/",
        "dt=1/../f",
        "nocolumn/f",
        "dt=1/x/f",
        "//dt=1/f",
    ],
)
def test_partition_of_splits_like_pathlib(path):
    """``partition_of`` splits strings (fast path) and answers what the ``PurePosixPath`` version did."""
    from pathlib import PurePosixPath

    from airflow_provider_walsink.core.protocol.errors import InvalidIdentifierError
    from airflow_provider_walsink.core.protocol.identifiers import validate_partition
    from airflow_provider_walsink.core.protocol.manifest import partition_of

    def reference(p):
        pairs = []
        for part in PurePosixPath(p).parts[:-1]:
            column, sep, value = part.partition("=")
            if not sep:
                raise InvalidIdentifierError(part)
            pairs.append(validate_partition(column, value))
        return tuple(pairs)

    def outcome(fn):
        try:
            return fn(path)
        except InvalidIdentifierError:
            return "invalid"

    assert outcome(partition_of) == outcome(reference)


@pytest.mark.parametrize(
    "path",
    ["a", "a/b", "a//b", "a/", "./a", "a/.", "a/..", "../a", ".a", "a/.b", "a/b.", "a..b", "a/./b", "..", ".",
     "dt=1/.x/y", "dt=1/x./y", "a/b/", "x.y/z"],
)  # fmt: skip
def test_manifest_path_check_answers_what_the_segment_rules_answer(path):
    """The manifest's substring fast path accepts exactly the paths the per-segment rules accept."""
    from airflow_provider_walsink.core.protocol.errors import ManifestError
    from airflow_provider_walsink.core.protocol.manifest import _check_relative_path

    parts = path.split("/")
    if any(p in ("..", ".", "") for p in parts):
        expected = "has '.', '..' or an empty segment"
    elif any(p.startswith(".") for p in parts):
        expected = "names a hidden file"
    else:
        expected = None
    try:
        _check_relative_path(path, "m", "path")
        got = None
    except ManifestError as e:
        got = next(m for m in ("has '.', '..' or an empty segment", "names a hidden file") if m in str(e))
    assert got == expected
