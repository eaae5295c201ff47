"""The job side of the write phase: stage DataFrames into an attempt and seal its manifest.

Used inside a PySpark application started by :class:`~airflow_provider_walsink.operators.write.WalWriteOperator`::

    spark = SparkSession.builder.getOrCreate()
    with CheckpointJob.from_argv(spark) as job:         # parses --walsink-protocol
        df = spark.read.json(...).where(...)
        job.stage(df, partition_by=["dt"])              # any Spark file format
        job.end_offsets = {"files": "events-0042.jsonl"}
    # leaving the block without an exception seals the manifest

The job never talks to the committer database: the operator started the
attempt before submitting the job and records the seal after it returns. The
manifest written here once (:meth:`StagingStore.seal`: temp + fsync + rename on
a local root, a conditional put on S3) *is* the seal in staging; an attempt
that dies before it has none and never counts.

Two writers stage the files (``writer=``, :data:`WRITERS`):

* ``spark``, the default for a local or mounted root: Spark's own file writer
  (any format), described as below.
* ``executors``, the default (and the only one) for an object-store root
  (``s3://``; Spark has no S3 connector here): each task writes its Parquet
  files with pyarrow through ``mapInArrow`` straight into the store and
  returns one row per file (size, rows, checksum over the bytes written,
  footer schema); the manifest is built from exactly those rows, so a failed
  or speculative task attempt's files are never in it
  (:mod:`.executor_write`). On a local root it took 1.3-2.2x the time of
  ``spark`` for benchmark 1 (``bench/bench_stage_writer.py``), so it is not
  the local default.

How committables are described by the ``spark`` writer, without re-reading the data:

* **files**: the attempt directory is listed before and after each Spark
  write; the new visible files are the committables. Spark's bookkeeping
  (``_SUCCESS``, ``_temporary/``, ``.crc`` side files: anything whose name
  starts with ``_`` or ``.``) is not.
* **sizes**: one ``stat`` per file.
* **file schema**: for Parquet, each file's footer (read anyway for its row
  count, below) gives its Arrow schema; when every file of the checkpoint has
  the same one it is sealed once in the manifest (``file_schema``), so a table
  target checks the schema against its table without re-reading every footer
  at commit time (docs/targets.md, "What it costs"). Files with different
  schemas: no ``file_schema``, the commit reads every footer.
* **column statistics**: for Parquet, the same footer gives each file's null
  counts and column bounds (:mod:`~airflow_provider_walsink.core.protocol.file_stats`),
  sealed per committable so table targets publish them without reading the
  footers again.
* **row counts**: the total comes from Spark's own write, an
  :class:`~pyspark.sql.Observation` (``count(1)``) attached to the DataFrame
  and filled in by the same job that writes it, with no extra pass. Per-file
  counts come from the Parquet or ORC footers (a few KiB read per file, never
  the data), and must add up to the observed total or the job fails naming
  both numbers. Formats without a footer (CSV, JSON, text, Avro) get the
  observed total when the write produced one file, else ``rows = null`` per
  file (the observed total is still logged and returned by :meth:`stage`).
* **checksums**: computed in the driver right after the write, while the
  files are still in the page cache, in a thread pool (``zlib.crc32`` and
  ``hashlib`` release the GIL). Measured with ``bench/checksum_cost.py`` on
  the development machine (2 shared, busy cores; 2M rows, 16 Parquet files,
  135 MiB): the plain ``df.write.parquet`` took 11.6 s, CRC32 over the
  written files 0.20 s (1.7 %) and SHA-256 0.23 s (2.0 %; the CPU has SHA
  extensions); ``stage`` + ``seal`` with either checksum stayed within the
  run-to-run noise of the write. Computing them in the executors instead
  would need the executors to report per-file results back and saves little
  on this scale, so the driver does it. Default ``crc32``; ``sha256`` or
  ``None`` (sizes only) via the operator's ``checksum`` argument.
"""

from __future__ import annotations

import logging
import os
import re
import sys
from collections.abc import Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from airflow_provider_walsink.core.faults import crashpoint
from airflow_provider_walsink.core.protocol.checksum import file_checksum
from airflow_provider_walsink.core.protocol.errors import WalsinkError
from airflow_provider_walsink.core.protocol.file_schema import common_file_schema, file_schema_of
from airflow_provider_walsink.core.protocol.file_stats import file_stats_of
from airflow_provider_walsink.core.protocol.identifiers import validate_partition
from airflow_provider_walsink.core.protocol.manifest import (
    FILE_FORMATS,
    MANIFEST_NAME,
    Committable,
    FileSchema,
    FileStats,
    Manifest,
    build_manifest,
)
from airflow_provider_walsink.core.protocol.partitions import partition_text
from airflow_provider_walsink.core.spark.args import ProtocolArgs, storage_options_from_env
from airflow_provider_walsink.core.spark.executor_write import OPTIONS as EXECUTOR_OPTIONS
from airflow_provider_walsink.core.spark.executor_write import WRITTEN, executor_writer, stats_from_row
from airflow_provider_walsink.core.staging.object_store import StagingStore

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

log = logging.getLogger(__name__)

_TASK_OF_FILE = re.compile(r"^part-(\d+)")

#: Who writes the staged files: ``spark`` (Spark's own file writer into a local or
#: mounted root, then the driver lists the directory and reads the footers) or
#: ``executors`` (each task writes its Parquet files with pyarrow and reports
#: them, :mod:`.executor_write`; the only way onto an object store here).
WRITERS = ("spark", "executors")
#: The writer for a local root when none is asked for (bench/bench_stage_writer.py measures both).
LOCAL_WRITER = "spark"


class StagingError(WalsinkError):
    """The job could not stage or describe its output; the message says what."""


@dataclass(frozen=True)
class StagedWrite:
    """What one :meth:`CheckpointJob.stage` call added to the attempt."""

    committables: tuple[Committable, ...]
    observed_rows: int

    @property
    def files(self) -> int:
        return len(self.committables)

    @property
    def bytes(self) -> int:
        return sum(c.size for c in self.committables)


def _visible_files(root: Path) -> set[str]:
    """Relative POSIX paths of the data files under ``root`` (no ``_``/``.`` names at any level)."""
    found: set[str] = set()
    if not root.is_dir():
        return found
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames if not d.startswith(("_", "."))]
        rel_dir = Path(dirpath).relative_to(root)
        for name in filenames:
            if not name.startswith(("_", ".")):
                found.add((rel_dir / name).as_posix())
    return found


def application_id(spark: SparkSession) -> str:
    """The id of the Spark application ``spark`` runs in, classic or Spark Connect."""
    if type(spark).__module__.startswith("pyspark.sql.connect"):
        return str(spark.conf.get("spark.app.id"))
    return str(spark.sparkContext.applicationId)


def hadoop_uri(path: str | os.PathLike[str]) -> str:
    """``file://`` URI of a local path as Hadoop expects it.

    Not :meth:`Path.as_uri`: it percent-encodes ``=``, and Hadoop would then
    write a directory literally named ``dt%3D2026-01-01``.
    """
    return "file://" + os.path.abspath(path)


def read_footer(path: Path, file_format: str) -> tuple[int | None, FileSchema | None, FileStats | None]:
    """Row count and (Parquet) :class:`FileSchema` and :class:`FileStats` from one footer read."""
    if file_format == "parquet":
        import pyarrow.parquet as pq

        meta = pq.read_metadata(path)
        return int(meta.num_rows), file_schema_of(meta), file_stats_of(meta)
    if file_format == "orc":
        import pyarrow.orc as orc

        return int(orc.ORCFile(path).nrows), None, None
    return None, None, None


class CheckpointJob:
    """One write attempt of one checkpoint, as seen from inside the Spark application.

    :param spark: the application's session.
    :param protocol: the arguments the operator passed (see :class:`ProtocolArgs`).
    :param args: the user's own application arguments (what follows the protocol ones).
    :param storage_options: how to reach an object-store staging root (:meth:`StagingStore.open`).
        ``None`` (the default): for an ``s3://`` root, what the write task put in the job's
        environment (:func:`~airflow_provider_walsink.core.spark.args.storage_options_from_env`:
        ``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``, ``AWS_SESSION_TOKEN``, ``AWS_REGION``,
        ``AWS_ENDPOINT_URL``), else the store's default credential chain. Never put them on
        the command line.
    :param writer: ``spark`` or ``executors`` (:data:`WRITERS`); default :data:`LOCAL_WRITER`
        for a local root and ``executors`` for an object store (Spark cannot write there).
    """

    def __init__(
        self,
        spark: SparkSession,
        protocol: ProtocolArgs,
        args: Sequence[str] = (),
        *,
        storage_options: Mapping[str, Any] | None = None,
        writer: str | None = None,
    ) -> None:
        self.spark = spark
        self.protocol = protocol
        self.args = list(args)
        if storage_options is None:
            storage_options = storage_options_from_env(protocol.staging_root)
        self.store = StagingStore.open(protocol.staging_root, storage_options)
        self.layout = self.store.layout  # None on an object store
        self.location = self.store.attempt(
            protocol.pipeline, protocol.checkpoint_key, protocol.attempt, protocol.attempt_id or None
        )
        if writer is None:
            writer = LOCAL_WRITER if self.layout is not None else "executors"
        if writer not in WRITERS:
            raise StagingError(f"writer must be one of {', '.join(WRITERS)}, got {writer!r}")
        if writer == "spark" and self.layout is None:
            raise StagingError(
                f"staging root {self.store.root_uri!r} is an object store: Spark's own writer cannot stage "
                "there (no Hadoop connector is assumed); use writer='executors'"
            )
        self.writer = writer
        #: The attempt's directory (a ``Path``) on a local root, its URI on an object store.
        self.attempt_dir: Path | str = self.location.uri if self.layout is None else Path(self.location.path)
        self.end_offsets: dict[str, Any] | None = None
        # Parquet timestamps as INT64 micros, not INT96: Iceberg readers (pyiceberg) refuse INT96.
        spark.conf.set("spark.sql.parquet.outputTimestampType", "TIMESTAMP_MICROS")
        self._committables: list[Committable] = []
        #: The schema of each committable's file (Parquet), in the order of ``_committables``.
        self._schemas: list[FileSchema | None] = []
        self._partitions: list[str] = []
        target = self.protocol.target_partition
        if target and self.protocol.mode == "overwrite" and len(self.protocol.partition_by) == 1:
            # A partitioned run's checkpoint replaces its partition even if the job writes no row to it.
            self._partitions.append(target)
        self._formats: set[str] = set()
        self._stages = 0
        self._application_id: str | None = None
        self.sealed_digest: str | None = None
        if isinstance(self.attempt_dir, Path):
            self.attempt_dir.mkdir(parents=True, exist_ok=True)
            leftovers = _visible_files(self.attempt_dir)
        else:
            leftovers = set(self.store.list_attempt(self.location, visible_only=True))
        if leftovers:
            # The operator hands every attempt an empty directory; files here mean
            # two jobs share an attempt, and their committables would mix.
            raise StagingError(
                f"attempt directory {self.attempt_dir} already holds {len(leftovers)} file(s) "
                f"(e.g. {sorted(leftovers)[0]}); each attempt must start empty"
            )

    @classmethod
    def from_argv(cls, spark: SparkSession, argv: Sequence[str] | None = None) -> CheckpointJob:
        """Build the job from the command line (``sys.argv[1:]`` by default)."""
        protocol, rest = ProtocolArgs.from_argv(sys.argv[1:] if argv is None else argv)
        return cls(spark, protocol, rest)

    # ------------------------------------------------------------------ properties

    @property
    def pipeline(self) -> str:
        return self.protocol.pipeline

    @property
    def checkpoint_key(self) -> str:
        return self.protocol.checkpoint_key

    @property
    def attempt(self) -> int:
        return self.protocol.attempt

    @property
    def start_offsets(self) -> dict[str, Any] | None:
        """Where the source must be read from: the last committed end offsets (or ``None``)."""
        return self.protocol.start_offsets

    @property
    def until_offsets(self) -> dict[str, Any] | None:
        """Reprocess of an ``append`` checkpoint: read up to exactly here and end here (else ``None``)."""
        return self.protocol.until_offsets

    @property
    def application_id(self) -> str:
        """The Spark application's id (it names the committables' writers and the manifest's job).

        A Spark Connect client has no ``SparkContext``: it asks the server's configuration.
        """
        if self._application_id is None:
            self._application_id = application_id(self.spark)
        return self._application_id

    @property
    def committables(self) -> tuple[Committable, ...]:
        return tuple(self._committables)

    # ------------------------------------------------------------------ staging

    def stage(
        self,
        df: DataFrame,
        *,
        partition_by: Sequence[str] | None = None,
        file_format: str | None = None,
        options: Mapping[str, Any] | None = None,
        partition_prefix: Mapping[str, str] | None = None,
        replace_partitions: Iterable[str] = (),
    ) -> StagedWrite:
        """Write ``df`` into the attempt and describe the new files as committables.

        :param partition_by: Hive-style partition columns (default: the operator's).
        :param file_format: Spark format (default: the operator's); every stage of
            one checkpoint must use the same format.
        :param options: writer options (``compression`` etc.).
        :param partition_prefix: fixed ``column=value`` directories to write under,
            so several DataFrames can share one attempt (e.g. ``{"source": "web"}``).
        :param replace_partitions: partitions (``dt=2026-01-01``) an ``overwrite``
            commit must replace even if ``df`` has no rows for them.
        """
        if self.sealed_digest is not None:
            raise StagingError("the checkpoint is already sealed; nothing more can be staged")
        from pyspark.sql import Observation
        from pyspark.sql import functions as F

        fmt = file_format or self.protocol.file_format
        if fmt not in FILE_FORMATS:
            raise StagingError(f"file format {fmt!r} is not one of {', '.join(FILE_FORMATS)}")
        if self._formats and fmt not in self._formats:
            raise StagingError(
                f"checkpoint already staged {sorted(self._formats)[0]} files; one manifest has one format"
            )
        columns = list(self.protocol.partition_by if partition_by is None else partition_by)
        prefix = ""
        for column, value in (partition_prefix or {}).items():
            column, text = validate_partition(column, partition_text(value))  # as Spark names it
            prefix += f"{column}={text}/"
        if prefix:
            self.store.committable(self.location, prefix + "x")  # confined (and no symlink on the way)

        self._stages += 1
        observation = Observation(f"walsink_stage_{self._stages}")
        observed = df.observe(observation, F.count(F.lit(1)).alias("rows"))
        if self.writer == "executors":
            committables, schemas, observed_rows = self._stage_by_executors(
                observed, observation, fmt, columns, prefix, options or {}
            )
        else:
            assert isinstance(self.attempt_dir, Path) and self.layout is not None
            out_dir = self.layout.committable_path(self.attempt_dir, prefix + "x").parent if prefix else None
            before = _visible_files(self.attempt_dir)
            writer = observed.write.mode("append").format(fmt)
            if columns:
                writer = writer.partitionBy(*columns)
            for key, value in (options or {}).items():
                writer = writer.option(key, value)
            writer.save(hadoop_uri(out_dir or self.attempt_dir))
            observed_rows = int(observation.get.get("rows", 0))
            new_files = sorted(_visible_files(self.attempt_dir) - before)
            committables, schemas = self._describe(new_files, fmt, observed_rows)
        self._committables.extend(committables)
        self._schemas.extend(schemas)
        self._formats.add(fmt)
        for partition in replace_partitions:
            self.declare_partition(partition)
        staged = StagedWrite(tuple(committables), observed_rows)
        log.info(
            "walsink: staged %d file(s), %d bytes, %d rows into %s",
            staged.files,
            staged.bytes,
            observed_rows,
            self.attempt_dir,
        )
        return staged

    def _describe(
        self, new_files: list[str], fmt: str, observed_rows: int
    ) -> tuple[list[Committable], list[FileSchema | None]]:
        app_id = self.application_id
        paths = [self.layout.committable_path(self.attempt_dir, rel) for rel in new_files]
        algorithm = self.protocol.checksum

        def one(item: tuple[str, Path]) -> tuple[Committable, FileSchema | None]:
            rel, path = item
            match = _TASK_OF_FILE.match(path.name)
            rows, schema, stats = read_footer(path, fmt)
            return Committable(
                path=rel,
                size=os.stat(path).st_size,
                rows=rows,
                checksum=file_checksum(path, algorithm) if algorithm else None,
                writer=f"{app_id}/task-{match.group(1)}" if match else app_id,
                stats=stats,
            ), schema

        with ThreadPoolExecutor(max_workers=min(8, (os.cpu_count() or 2) * 2)) as pool:
            pairs = list(pool.map(one, zip(new_files, paths, strict=True)))
        described = [c for c, _ in pairs]
        schemas = [s for _, s in pairs]
        if fmt in ("parquet", "orc"):
            footer_total = sum(c.rows or 0 for c in described)
            if footer_total != observed_rows:
                raise StagingError(
                    f"{fmt} footers of the {len(described)} new file(s) count {footer_total} rows but "
                    f"Spark wrote {observed_rows}; another writer shares the attempt directory?"
                )
        elif len(described) == 1:
            c = described[0]
            described = [Committable(c.path, c.size, observed_rows, c.checksum, c.writer)]
        return described, schemas

    def _stage_by_executors(
        self,
        observed: DataFrame,
        observation: Any,
        fmt: str,
        columns: Sequence[str],
        prefix: str,
        options: Mapping[str, Any],
    ) -> tuple[list[Committable], list[FileSchema | None], int]:
        """Let each task write its Parquet files into the store and describe them from the rows it returns."""
        if fmt != "parquet":
            raise StagingError(
                f"the executors' writer stages parquet only, not {fmt!r}"
                + (
                    ""
                    if self.layout is not None
                    else f" (staging root {self.store.root_uri!r} is an object store)"
                )
            )
        unknown = sorted(set(options) - EXECUTOR_OPTIONS)
        if unknown:
            raise StagingError(
                f"writer options {unknown} are not understood by the executors' writer "
                f"(it takes {sorted(EXECUTOR_OPTIONS)}); use writer='spark' on a local root for them"
            )
        missing = [c for c in columns if c not in observed.columns]
        if missing:
            raise StagingError(
                f"partition columns {missing} are not columns of the DataFrame ({observed.columns})"
            )
        compression = str(options.get("compression", "snappy")).lower()
        compression = "none" if compression == "uncompressed" else compression
        write = executor_writer(
            self.store.filesystem,
            self.location.path,
            prefix=prefix,
            partition_by=columns,
            checksum=self.protocol.checksum,
            compression=compression,
        )
        # collect() returns each partition's rows from the one task attempt Spark counted:
        # files a failed or speculative attempt left behind are not described, so never sealed.
        written = observed.mapInArrow(write, WRITTEN).collect()
        observed_rows = int(observation.get.get("rows", 0))
        app_id = self.application_id
        committables: list[Committable] = []
        schemas: list[FileSchema | None] = []
        confined = self.store.resolver(self.location)
        for row in sorted(written, key=lambda r: r["path"]):
            confined(row["path"])  # an executor's path is confined too (and no symlink on a local root)
            committables.append(
                Committable(
                    path=row["path"],
                    size=int(row["bytes"]),
                    rows=int(row["rows"]),
                    checksum=row["checksum"],
                    writer=f"{app_id}/task-{row['task']}",
                    stats=stats_from_row(row["stats"]),
                )
            )
            schemas.append(FileSchema(row["arrow_schema"], tuple(row["int96"] or ())))
        file_total = sum(c.rows or 0 for c in committables)
        if file_total != observed_rows:
            raise StagingError(
                f"the {len(committables)} file(s) the executors wrote count {file_total} rows but Spark "
                f"observed {observed_rows}"
            )
        return committables, schemas, observed_rows

    def declare_partition(self, partition: str) -> None:
        """Name a partition (``dt=2026-01-01``) an overwrite commit replaces even if it stays empty."""
        if partition not in self._partitions:
            self._partitions.append(partition)

    # ------------------------------------------------------------------ sealing

    def manifest(self) -> Manifest:
        """The manifest as it would be sealed now (validated)."""
        return build_manifest(
            pipeline=self.protocol.pipeline,
            checkpoint_key=self.protocol.checkpoint_key,
            sequence=self.protocol.sequence,
            attempt=self.protocol.attempt,
            attempt_id=self.protocol.attempt_id,
            partition_columns=self.protocol.partition_by,
            file_format=next(iter(self._formats), self.protocol.file_format),
            committables=self._committables,
            partitions=self._partitions,
            start_offsets=self.protocol.start_offsets,
            end_offsets=self.end_offsets,
            job=f"spark:{self.application_id}",
            file_schema=self.file_schema(),
        )

    def file_schema(self) -> FileSchema | None:
        """The schema every staged Parquet file has (from the footers read at staging), or ``None``."""
        if self._formats != {"parquet"}:
            return None
        return common_file_schema(self._schemas)

    def seal(self) -> str:
        """Write the manifest once into the attempt (:meth:`StagingStore.seal`); return its digest.

        Idempotent within one job. The operator records the seal in the
        committer table after the job exits successfully.
        """
        if self.sealed_digest is not None:
            return self.sealed_digest
        crashpoint("write.after_staging")
        manifest = self.manifest()
        path = f"{self.location.uri}/{MANIFEST_NAME}"
        self.sealed_digest = self.store.seal(self.location, manifest)
        crashpoint("seal.after_manifest")
        print(
            f"walsink: sealed {path} ({manifest.expected_count} committables, {manifest.total_rows} rows, "
            f"{manifest.total_bytes} bytes) digest {self.sealed_digest}",
            flush=True,
        )
        return self.sealed_digest

    def __enter__(self) -> CheckpointJob:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, *_: object) -> None:
        # An exception means the attempt is incomplete: no manifest, so it never counts.
        if exc_type is None:
            self.seal()
