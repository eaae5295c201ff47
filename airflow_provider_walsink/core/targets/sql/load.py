"""Bulk loading for the SQL target: the staged rows into a table, never row by row in Python.

PostgreSQL reads them through ``COPY ... FROM STDIN`` (psycopg2 or psycopg 3),
MySQL/MariaDB through ``LOAD DATA LOCAL INFILE`` (PyMySQL), both as CSV that
pyarrow writes from the Parquet record batches. It runs inside the
publisher's transaction and commits nothing: on any error the caller rolls
back.

Threads, so that converting Parquet to CSV overlaps the load instead of
adding to it (:func:`csv_chunks`): converter threads write CSV while the
driver sends. PyMySQL sends a LOCAL file only by opening it by name, so for
MySQL a feeder thread writes that CSV into a private named pipe (no copy on
disk).
"""

from __future__ import annotations

import io
import os
import queue
import shutil
import tempfile
import threading
from collections.abc import Iterator, Mapping
from typing import Any

import pyarrow as pa
import pyarrow.csv as pa_csv
import pyarrow.parquet as pq
import sqlalchemy as sa
from sqlalchemy.engine import Connection

from airflow_provider_walsink.core.targets.sql.plan import LoadPlan
from airflow_provider_walsink.core.targets.sql.schema import SqlTargetError

#: Rows per Parquet record batch read, and so per CSV chunk sent.
_BATCH_ROWS = 64 * 1024
#: Threads converting Parquet to CSV while the load runs.
_CONVERT_THREADS = 2


def bulk_load(conn: Connection, target: sa.Table | None, plan: LoadPlan, *, dialect_name: str) -> int:
    """Load every staged row through the driver's bulk path; return the rows the database loaded."""
    if not plan.files or target is None:
        return 0
    preparer = conn.dialect.identifier_preparer
    table_sql = preparer.format_table(target)
    columns_sql = ", ".join(preparer.quote(c) for c in plan.columns)
    dbapi = conn.connection.dbapi_connection
    chunks = csv_chunks(plan, mysql=dialect_name == "mysql")
    try:
        if dialect_name == "postgresql":
            sql = f"COPY {table_sql} ({columns_sql}) FROM STDIN WITH (FORMAT csv)"
            return _pg_copy(dbapi, sql, chunks)
        return _mysql_load(dbapi, table_sql, columns_sql, chunks)
    finally:
        chunks.close()  # a failed load stops the converter threads now, not at garbage collection


def _load_type(t: pa.DataType, *, mysql: bool) -> pa.DataType:
    """The Arrow type a column is written to CSV as, so the database parses it as the same value."""
    if pa.types.is_dictionary(t):
        t = t.value_type
    if pa.types.is_timestamp(t):
        # Microseconds: what both databases store. MySQL has no time zones: UTC wall time.
        return pa.timestamp("us", None if mysql else t.tz)
    if mysql and pa.types.is_boolean(t):
        return pa.int8()  # LOAD DATA reads 1/0, not true/false
    if pa.types.is_date64(t):
        return pa.date32()
    return t


def _file_csv_chunks(
    path: str,
    partition: Mapping[str, str | None],
    plan: LoadPlan,
    load_schema: pa.Schema,
    options: pa_csv.WriteOptions,
) -> Iterator[bytes]:
    """One staged file's rows as CSV, one chunk per Parquet record batch (pyarrow does the work, in C++)."""
    parquet = pq.ParquetFile(path)
    for batch in parquet.iter_batches(batch_size=_BATCH_ROWS, use_threads=False):
        table = pa.Table.from_batches([batch])
        if table.schema != load_schema:
            table = table.cast(load_schema, safe=False)
        for name in plan.partition_columns:
            table = table.append_column(
                name, pa.repeat(pa.scalar(partition[name], pa.string()), table.num_rows)
            )
        sink = io.BytesIO()
        pa_csv.write_csv(table, sink, options)
        yield sink.getvalue()


_DONE = object()


def csv_chunks(plan: LoadPlan, *, mysql: bool, workers: int = _CONVERT_THREADS) -> Iterator[bytes]:
    """Every staged row as CSV chunks, converted by ``workers`` threads while the caller sends.

    Why threads: converting Parquet to CSV costs about half as much as the
    database's own load; done ahead (pyarrow releases the GIL) it overlaps the
    send instead of adding to it. Rows of a table have no order, so chunks of
    different files arrive interleaved. A worker's error is raised here.
    """
    load_schema = pa.schema([pa.field(f.name, _load_type(f.type, mysql=mysql)) for f in plan.schema])
    options = pa_csv.WriteOptions(include_header=False, null_string="NULL" if mysql else "")
    files = iter(plan.files)
    lock = threading.Lock()
    chunks: queue.Queue[Any] = queue.Queue(maxsize=2 * workers + 2)
    stop = threading.Event()

    def put(item: Any) -> bool:
        while not stop.is_set():
            try:
                chunks.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def work() -> None:
        try:
            while not stop.is_set():
                with lock:
                    item = next(files, None)
                if item is None:
                    break
                for chunk in _file_csv_chunks(item[0], item[1], plan, load_schema, options):
                    if not put(chunk):
                        return
        except BaseException as exc:  # noqa: BLE001 - handed to the consumer, which raises it
            put(exc)
        finally:
            put(_DONE)

    threads = [
        threading.Thread(target=work, name=f"walsink-sql-csv-{i}", daemon=True)
        for i in range(max(1, min(workers, len(plan.files))))
    ]
    for t in threads:
        t.start()
    try:
        running = len(threads)
        while running:
            item = chunks.get()
            if item is _DONE:
                running -= 1
            elif isinstance(item, BaseException):
                raise item
            else:
                yield item
    finally:
        stop.set()
        for t in threads:
            t.join()


class _ChunkReader(io.RawIOBase):
    """A file-like view of an iterator of byte chunks (what a driver's COPY reads from)."""

    def __init__(self, chunks: Iterator[bytes]) -> None:
        self._chunks = chunks
        self._buffer = memoryview(b"")

    def readable(self) -> bool:
        return True

    def readinto(self, b: Any) -> int:
        while not self._buffer:
            chunk = next(self._chunks, None)
            if chunk is None:
                return 0
            self._buffer = memoryview(chunk)
        n = min(len(b), len(self._buffer))
        b[:n] = self._buffer[:n]
        self._buffer = self._buffer[n:]
        return n


def _pg_copy(dbapi: Any, sql: str, chunks: Iterator[bytes]) -> int:
    cursor = dbapi.cursor()
    try:
        if hasattr(cursor, "copy_expert"):  # psycopg2
            cursor.copy_expert(sql, _ChunkReader(chunks), size=1 << 20)
            return cursor.rowcount
        with cursor.copy(sql) as copy:  # psycopg 3
            for chunk in chunks:
                copy.write(chunk)
        return cursor.rowcount
    finally:
        cursor.close()


def _mysql_load(dbapi: Any, table_sql: str, columns_sql: str, chunks: Iterator[bytes]) -> int:
    """``LOAD DATA LOCAL INFILE`` of the chunks, through a private named pipe.

    PyMySQL sends a LOCAL file by opening it by name; a FIFO lets a feeder
    thread write the CSV while the server loads it (no temporary copy on
    disk, conversion overlapping the load, as the PostgreSQL COPY does).
    """
    tmp = tempfile.mkdtemp(prefix="walsink-sql-")
    fifo = os.path.join(tmp, "rows.csv")
    os.mkfifo(fifo, 0o600)
    failed: list[BaseException] = []

    def feed() -> None:
        try:
            with open(fifo, "wb") as f:  # returns once PyMySQL opens the other end
                for chunk in chunks:
                    f.write(chunk)
        except BrokenPipeError:
            pass  # the reader went away: the load has failed and says why
        except BaseException as exc:  # noqa: BLE001 - raised by the caller below
            failed.append(exc)

    feeder = threading.Thread(target=feed, name="walsink-sql-feed", daemon=True)
    feeder.start()
    try:
        cursor = dbapi.cursor()
        try:
            # %s: PyMySQL quotes the file name as a string literal; identifiers come quoted by the preparer.
            cursor.execute(
                f"LOAD DATA LOCAL INFILE %s INTO TABLE {table_sql} CHARACTER SET utf8mb4 "
                "FIELDS TERMINATED BY ',' OPTIONALLY ENCLOSED BY '\"' ESCAPED BY '' "
                f"LINES TERMINATED BY '\\n' ({columns_sql})",
                (fifo,),
            )
            loaded = cursor.rowcount
            # LOCAL implies IGNORE: bad values and duplicate keys become warnings. Refuse them.
            cursor.execute("SHOW WARNINGS LIMIT 5")
            warnings = [w for w in cursor.fetchall() if str(w[0]).lower() in ("warning", "error")]
        finally:
            cursor.close()
    finally:
        _release_feeder(fifo, feeder)
        shutil.rmtree(tmp, ignore_errors=True)
    if failed:
        raise failed[0]  # the rows sent were incomplete; the caller's transaction rolls back
    if warnings:
        raise SqlTargetError(
            "LOAD DATA reported problems, rolled back: " + "; ".join(f"{w[1]}: {w[2]}" for w in warnings)
        )
    return loaded


def _release_feeder(fifo: str, feeder: threading.Thread) -> None:
    """Wait for the feeder; if the load never read the pipe, open and close it so the feeder ends."""
    while feeder.is_alive():
        try:
            fd = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)
        except OSError:
            feeder.join(0.05)
            continue
        try:
            feeder.join(0.05)
        finally:
            os.close(fd)
