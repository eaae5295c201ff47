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


def stage_parquet_checkpoint(
    store: Any,
    layout: StagingLayout,
    pipeline: str,
    key: str,
    dt: str,
    ids: list[int],
    *,
    actor: Any,
    staging_root: str | None = None,
) -> None:
    """Register ``pipeline/key`` (overwrite, a table target), stage one Parquet file per id of
    ``ids`` (columns ``id``, ``name``) in partition ``dt=<dt>``, seal it and record it DURABLE."""
    import io

    import pyarrow as pa
    import pyarrow.parquet as pq

    store.register(pipeline, key, mode="overwrite", actor=actor, target="table", staging_root=staging_root)
    writer = CheckpointWriter(store, layout, pipeline, key, actor=actor, partition_columns=["dt"])
    attempt_dir = writer.begin()
    (attempt_dir / f"dt={dt}").mkdir(parents=True)
    relatives = []
    for n, i in enumerate(ids):
        buf = io.BytesIO()
        pq.write_table(pa.table({"id": pa.array([i], pa.int64()), "name": [f"n{i}"]}), buf)
        relatives.append(f"dt={dt}/part-{n}.parquet")
        (attempt_dir / relatives[-1]).write_bytes(buf.getvalue())
    writer.add_files(relatives, rows=dict.fromkeys(relatives, 1), writer="stage")
    writer.seal()
    store.mark_durable(pipeline, key, attempt=writer.attempt, actor=actor)
