"""A checkpoint staged through the core API, for tests whose claim is about the tasks after the
write (the sensor, the commit task): no Spark job, one small CSV committable."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from airflow_provider_walsink.core.commit.writer import CheckpointWriter
from airflow_provider_walsink.core.staging.layout import StagingLayout


def stage_csv_checkpoint(
    store: Any,
    layout: StagingLayout,
    pipeline: str,
    key: str,
    relative: str,
    *,
    actor: Any,
    partition_column: str,
    durable: bool = True,
) -> Path:
    """Register ``pipeline/key``, stage one two-row CSV file at ``relative``, seal it and (unless
    ``durable=False``) record it DURABLE; return the staged file's path."""
    store.register(pipeline, key, mode="overwrite", actor=actor)
    writer = CheckpointWriter(store, layout, pipeline, key, actor=actor, partition_columns=[partition_column])
    path = writer.begin() / relative
    path.parent.mkdir(parents=True)
    path.write_bytes(b"a\nb\n")
    writer.add_files([relative], rows={relative: 2}, writer="stage")
    writer.seal(file_format="csv")
    if durable:
        store.mark_durable(pipeline, key, attempt=writer.attempt, actor=actor)
    return path
