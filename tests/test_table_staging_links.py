"""Invariant 6 for the table targets: a staged file or directory swapped for a symlink after the
durability check is refused before the table changes (the table references staged files in place,
so following the link would publish whatever it points to, outside the staging root).

The model checker found the file case (``tests/test_model_checker.py``); this test also covers a
partition directory swapped for a link, for Iceberg and Delta.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from airflow_provider_walsink.core.protocol.errors import CommittableError
from tests.table_fixtures import Place, ctx, local_table_spec, stage_attempt

ROWS = [("2026-01-01", i, f"r{i}") for i in range(4)] + [("2026-01-02", i, f"s{i}") for i in range(4, 8)]


def _publisher(kind: str, spec: dict):
    if kind == "iceberg":
        from airflow_provider_walsink.core.targets.iceberg import IcebergPublisher

        return IcebergPublisher(
            spec["identifier"], "append", catalog_properties=spec["props"], create_table=True
        )
    from airflow_provider_walsink.core.targets.delta import DeltaPublisher

    return DeltaPublisher(spec["uri"], "append", create_table=True)


def _swap_for_link(victim: Path, outside: Path) -> None:
    """Move ``victim`` (file or directory) outside staging and leave a symlink to it in its place."""
    outside.parent.mkdir(parents=True, exist_ok=True)
    shutil.move(str(victim), str(outside))
    victim.symlink_to(outside, target_is_directory=outside.is_dir())


@pytest.mark.parametrize("kind", ["iceberg", "delta"])
@pytest.mark.parametrize("what", ["file", "partition directory"])
def test_a_staged_file_or_directory_swapped_for_a_symlink_is_refused_and_the_table_unchanged(
    kind, what, tmp_path
):
    pytest.importorskip("pyiceberg" if kind == "iceberg" else "deltalake")
    spec = local_table_spec(kind, tmp_path)
    publisher = _publisher(kind, spec)
    staging = spec["uri"] + "/_walsink_staging" if kind == "delta" else str(tmp_path / "staging")
    manifest, attempt_dir = stage_attempt(Place("local", str(tmp_path)), staging, "events", "k1", ROWS)
    partition = Path(attempt_dir) / "dt=2026-01-02"
    victim = next(partition.glob("*.parquet")) if what == "file" else partition
    _swap_for_link(victim, tmp_path / "outside" / victim.name)

    with pytest.raises(CommittableError, match="is a symlink"):
        publisher.publish(manifest, attempt_dir, ctx(manifest))
    assert publisher.published_attempt(manifest) is None  # nothing of the attempt in the table
