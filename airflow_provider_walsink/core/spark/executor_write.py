"""Executors write committables: each task writes its partition's Parquet files with pyarrow.

:func:`executor_writer` returns the function :meth:`CheckpointJob.stage` hands
to ``DataFrame.mapInArrow``. It runs in the executors' Python workers (which
must run an interpreter with pyarrow and walsink: ``PYSPARK_PYTHON``), writes
each Hive partition's rows of the task to one file named for the task attempt
(``part-<partition>-<task attempt id>-<uuid>.parquet``) straight into the
staging store (a local directory or an object store, through ``pyarrow.fs``),
and yields one row per file it wrote (:data:`WRITTEN`): path, partition,
rows, bytes, checksum (computed over the bytes as they are written, so the
file is never read again), the footer's schema and its column statistics
(:mod:`~airflow_provider_walsink.core.protocol.file_stats`, from the footer pyarrow
hands back when the file closes: no read either).

The driver builds the committables from exactly the rows Spark returns, one
set per partition from the one task attempt Spark counted: files of a failed
or speculative attempt are never in the manifest (they stay in the attempt's
prefix and go with it).
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from airflow_provider_walsink.core.faults import crashpoint
from airflow_provider_walsink.core.protocol.checksum import Hasher
from airflow_provider_walsink.core.protocol.identifiers import validate_partition
from airflow_provider_walsink.core.protocol.manifest import FileStats
from airflow_provider_walsink.core.protocol.partitions import partition_text

#: The rows the writer yields, as a Spark DDL schema (one row per file written).
WRITTEN = (
    "path string, partition string, rows long, bytes long, checksum string, "
    "arrow_schema string, int96 array<string>, task int, task_attempt long, stats string"
)
#: Rows buffered per file before they are written as one row group: Spark hands
#: the function batches of 10,000 rows; one row group per batch would make
#: files larger and slower to read.
ROW_GROUP_ROWS = 1_000_000
ROW_GROUP_BYTES = 64 * 1024 * 1024
#: Writer options this path understands (Spark's other Parquet options are refused by the job).
OPTIONS = frozenset({"compression"})


class _CountingSink:
    """A file-like object that checksums and counts the bytes on their way to the store."""

    def __init__(self, stream: Any, algorithm: str | None) -> None:
        self._stream = stream
        self._hasher = Hasher(algorithm) if algorithm else None
        self.size = 0
        self.closed = False

    def write(self, data: Any) -> int:
        view = memoryview(data)
        if self._hasher is not None:
            self._hasher.update(view)
        self._stream.write(view)
        self.size += view.nbytes
        return view.nbytes

    def tell(self) -> int:
        return self.size

    def flush(self) -> None:
        pass

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self._stream.close()

    def checksum(self) -> str | None:
        return self._hasher.value() if self._hasher is not None else None


def executor_writer(
    filesystem: Any,
    attempt_path: str,
    *,
    prefix: str,
    partition_by: Sequence[str],
    checksum: str | None,
    compression: str = "snappy",
) -> Callable[[Iterator[Any]], Iterator[Any]]:
    """The ``mapInArrow`` function that writes one task's rows under ``attempt_path``.

    :param filesystem: a ``pyarrow.fs.FileSystem`` (pickled to the executors).
    :param attempt_path: the attempt's path in ``filesystem``.
    :param prefix: fixed ``column=value/`` directories (``partition_prefix``) or ``""``.
    :param partition_by: Hive partition columns; their values name directories and
        leave the files, as Spark's ``partitionBy`` does.
    :param checksum: ``crc32``, ``sha256`` or ``None``.
    """
    columns = list(partition_by)
    local = getattr(filesystem, "type_name", "") == "local"

    def write(batches: Iterator[Any]) -> Iterator[Any]:
        import pyarrow as pa
        import pyarrow.compute as pc  # noqa: F401  (registers the kernels filter/group_by need)
        import pyarrow.fs  # noqa: F401
        import pyarrow.parquet as pq
        from pyspark import TaskContext

        from airflow_provider_walsink.core.protocol.file_schema import file_schema_of
        from airflow_provider_walsink.core.protocol.file_stats import file_stats_of

        ctx = TaskContext.get()
        task, task_attempt = ctx.partitionId(), ctx.taskAttemptId()
        first_try = ctx.attemptNumber() == 0
        files: dict[tuple[Any, ...], dict[str, Any]] = {}

        def new_file(directory: str) -> dict[str, Any]:
            name = f"part-{task:05d}-{task_attempt}-{uuid.uuid4().hex}.parquet"
            relative = f"{prefix}{directory}{name}"
            return {
                "relative": relative,
                "partition": directory.rstrip("/"),
                "sink": None,
                "writer": None,
                "collector": [],
                "pending": [],
                "pending_rows": 0,
                "pending_bytes": 0,
            }

        def flush(f: dict[str, Any]) -> None:
            if not f["pending"]:
                return
            rows = pa.concat_tables(f["pending"])
            if (
                f["writer"] is None
            ):  # opened at the first row group: it is the sample _dictionary_columns judges
                path = f"{attempt_path}/{f['relative']}"
                if local:  # object stores have no directories to make (and pyarrow would put markers)
                    filesystem.create_dir(path.rsplit("/", 1)[0], recursive=True)
                f["sink"] = _CountingSink(filesystem.open_output_stream(path), checksum)
                f["writer"] = pq.ParquetWriter(
                    pa.PythonFile(f["sink"], mode="w"),
                    rows.schema,
                    compression=compression,
                    use_dictionary=_dictionary_columns(rows),
                    metadata_collector=f["collector"],
                )
            f["writer"].write_table(rows)
            f["pending"], f["pending_rows"], f["pending_bytes"] = [], 0, 0

        try:
            for batch in batches:
                if batch.num_rows == 0:
                    continue
                table = _utc_timestamps(pa.Table.from_batches([batch]))
                for values, part in _split(table, columns):
                    f = files.get(values)
                    if f is None:
                        pairs = [
                            validate_partition(c, partition_text(v))
                            for c, v in zip(columns, values, strict=True)
                        ]
                        directory = "".join(f"{c}={v}/" for c, v in pairs)
                        f = files[values] = new_file(directory)
                    f["pending"].append(part)
                    f["pending_rows"] += part.num_rows
                    f["pending_bytes"] += part.nbytes
                    if f["pending_rows"] >= ROW_GROUP_ROWS or f["pending_bytes"] >= ROW_GROUP_BYTES:
                        flush(f)
            rows = []
            for f in files.values():
                flush(f)
                f["writer"].close()
                f["sink"].close()
                meta = f["collector"][0]
                schema = file_schema_of(meta)
                rows.append(
                    {
                        "path": f["relative"],
                        "partition": f["partition"],
                        "rows": int(meta.num_rows),
                        "bytes": f["sink"].size,
                        "checksum": f["sink"].checksum(),
                        "arrow_schema": schema.arrow,
                        "int96": list(schema.int96),
                        "task": task,
                        "task_attempt": task_attempt,
                        "stats": json.dumps(file_stats_of(meta).to_json()),
                    }
                )
                if first_try:
                    # A lost executor after its file is complete: the retry's files replace it in the
                    # manifest (tests kill the first attempt here; a no-op otherwise).
                    crashpoint("executor.after_file")
        except BaseException:
            for f in files.values():
                if f["sink"] is not None:
                    f["sink"].close()
            raise
        if rows:
            yield pa.RecordBatch.from_pylist(rows, schema=_written_schema())

    return write


def _utc_timestamps(table: Any) -> Any:
    """``table`` with every zoned timestamp column labelled ``UTC``.

    Spark hands ``mapInArrow`` its instants labelled with the session's time zone (for example
    ``Etc/UTC`` or ``Europe/Paris``); the values are UTC instants either way, so relabelling
    changes no value. Table formats take only ``UTC`` (delta-rs refuses a Parquet file whose
    Arrow schema says ``Etc/UTC``), and the staged files are published by reference, as written.
    """
    import pyarrow as pa

    fields = [
        f.with_type(pa.timestamp(f.type.unit, tz="UTC"))
        if pa.types.is_timestamp(f.type) and f.type.tz not in (None, "UTC")
        else f
        for f in table.schema
    ]
    if all(a.type == b.type for a, b in zip(fields, table.schema, strict=True)):
        return table
    return table.cast(pa.schema(fields, metadata=table.schema.metadata))


def _written_schema() -> Any:
    import pyarrow as pa

    return pa.schema(
        [
            ("path", pa.string()),
            ("partition", pa.string()),
            ("rows", pa.int64()),
            ("bytes", pa.int64()),
            ("checksum", pa.string()),
            ("arrow_schema", pa.string()),
            ("int96", pa.list_(pa.string())),
            ("task", pa.int32()),
            ("task_attempt", pa.int64()),
            ("stats", pa.string()),
        ]
    )


def stats_from_row(raw: str | None) -> FileStats | None:
    """The :class:`FileStats` an executor reported for one file (JSON in :data:`WRITTEN`), or ``None``."""
    if raw is None:
        return None
    doc = json.loads(raw)
    return FileStats.of(nulls=doc["nulls"], lower=doc["min"], upper=doc["max"])


def _dictionary_columns(sample: Any) -> list[str]:
    """The columns worth dictionary-encoding, judged on a file's first row group.

    Why: pyarrow keeps a dictionary page once it started one, even after falling
    back to plain pages when it fills (unique ids, amounts), which made files
    40 % larger than Spark's; Spark's writer (parquet-mr) drops the dictionary
    when it does not pay. Same rule, decided up front: dictionary when at most
    half the sampled values are distinct.
    """
    import pyarrow.compute as pc

    chosen = []
    rows = max(sample.num_rows, 1)
    for name in sample.column_names:
        try:
            distinct = pc.count_distinct(sample[name]).as_py()
        except (NotImplementedError, TypeError, ValueError):  # nested types: pyarrow's default
            chosen.append(name)
            continue
        if distinct * 2 <= rows:
            chosen.append(name)
    return chosen


def _split(table: Any, columns: Sequence[str]) -> Iterator[tuple[tuple[Any, ...], Any]]:
    """``(partition values, rows without the partition columns)`` for each partition in ``table``."""
    import pyarrow as pa
    import pyarrow.compute as pc

    if not columns:
        yield (), table
        return
    keys = table.select(list(columns)).group_by(list(columns), use_threads=False).aggregate([])
    if keys.num_rows == 1:  # the common case: a task's batch holds one partition
        row = keys.to_pylist()[0]
        yield tuple(row[c] for c in columns), table.drop_columns(list(columns))
        return
    for row in keys.to_pylist():
        mask = None
        for c in columns:
            value = row[c]
            if value is None:
                match = pc.is_null(table[c])
            else:
                match = pc.equal(table[c], pa.scalar(value, type=table[c].type))
            mask = match if mask is None else pc.and_(mask, match)
        yield tuple(row[c] for c in columns), table.filter(mask).drop_columns(list(columns))
