"""Committables and the manifest that lists them (Flink's CommittableWithLineage
and CommittableSummary, written down as one schema-versioned JSON document).

A manifest is *sealed* when it has been written atomically (temp file, fsync,
rename, fsync of the directory) and its digest recorded in the committer table.
Readers validate strictly: a manifest that is not exactly what this module
writes is rejected with a message that names the problem.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import errno
import functools
import hashlib
import json
import math
import os
import re
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import PurePosixPath
from typing import Any

from airflow_provider_walsink.core.protocol.errors import InvalidIdentifierError, ManifestError
from airflow_provider_walsink.core.protocol.identifiers import validate_identifier, validate_partition

SCHEMA_VERSION = 4
#: Versions this walsink reads. Version 1 had no ``attempt_id`` and no
#: ``partition_columns``; its attempts are identified as ``v1-a<attempt>``.
#: Version 2 had no ``file_schema``. Version 3 had no committable ``stats``.
READABLE_VERSIONS = (1, 2, 3, 4)
MANIFEST_NAME = "_manifest.json"
#: A manifest larger than this is refused before it is parsed.
MAX_MANIFEST_BYTES = 64 * 1024 * 1024
MAX_COMMITTABLES = 1_000_000
CHECKSUM_ALGORITHMS = ("sha256", "crc32")
#: A recorded file schema (base64 of an Arrow IPC schema message) larger than this is refused.
MAX_FILE_SCHEMA_CHARS = 1024 * 1024
FILE_FORMATS = ("parquet", "orc", "json", "csv", "text", "avro")
#: Column statistics of one committable: at most this many columns, bound strings of at most
#: this many characters (the writer truncates to 32, :mod:`.file_stats`).
MAX_STATS_COLUMNS = 4096
MAX_STATS_STRING_CHARS = 256

JsonObject = dict[str, Any]
#: A bound as the manifest records it: an integer, a boolean or a string (strings, dates
#: ``YYYY-MM-DD`` and UTC timestamps ``YYYY-MM-DDTHH:MM:SS.ffffffZ``; :mod:`.file_stats`).
StatValue = int | bool | str


@dataclass(frozen=True)
class FileStats:
    """One staged file's column statistics, as its writer read them from the file's footer.

    Per top-level column: ``nulls`` (its null count), ``lower`` and ``upper``
    (bounds every value of the column in the file lies within; absent where
    bounds are not kept for the type, :mod:`.file_stats`). Pairs sorted by
    column name (hashable, and one order for the manifest's bytes). The row
    count is the committable's ``rows``. Iceberg's ``DataFile`` metrics and
    Delta's add-action ``stats`` are built from these, so readers skip files on
    non-partition columns.
    """

    nulls: tuple[tuple[str, int], ...] = ()
    lower: tuple[tuple[str, StatValue], ...] = ()
    upper: tuple[tuple[str, StatValue], ...] = ()

    @classmethod
    def of(
        cls,
        *,
        nulls: Mapping[str, int] | None = None,
        lower: Mapping[str, StatValue] | None = None,
        upper: Mapping[str, StatValue] | None = None,
    ) -> FileStats:
        return cls(
            tuple(sorted((nulls or {}).items())),
            tuple(sorted((lower or {}).items())),
            tuple(sorted((upper or {}).items())),
        )

    def to_json(self) -> JsonObject:
        return {"nulls": dict(self.nulls), "min": dict(self.lower), "max": dict(self.upper)}


@dataclass(frozen=True)
class Committable:
    """One staged file of a checkpoint, with the lineage of the writer that made it.

    ``path`` is relative to the attempt's staging directory, POSIX style, and
    its directories are the Hive-style partition (``dt=2026-01-01/part-0.parquet``).
    ``checksum`` is ``"<algorithm>:<hex>"`` or ``None`` when the writer did not
    compute one (then only sizes can be verified).
    """

    path: str
    size: int
    rows: int | None
    checksum: str | None = None
    writer: str | None = None
    #: Column statistics from the writer (manifest version 4; ``None``: not recorded).
    stats: FileStats | None = None

    # Cached: validation, planning and publishing each ask for it, for every committable.
    @functools.cached_property
    def partition(self) -> tuple[tuple[str, str], ...]:
        """The ``(column, value)`` pairs named by the path's directories."""
        return partition_of(self.path)

    @functools.cached_property
    def partition_path(self) -> str:
        return "/".join(f"{c}={v}" for c, v in self.partition)

    def to_json(self) -> JsonObject:
        doc: JsonObject = {
            "path": self.path,
            "size": self.size,
            "rows": self.rows,
            "checksum": self.checksum,
            "writer": self.writer,
        }
        if self.stats is not None:  # optional (version 4): absent, not null, keeps manifests small
            doc["stats"] = self.stats.to_json()
        return doc


@dataclass(frozen=True)
class FileSchema:
    """The one schema every staged Parquet file of the attempt has, as the write job read it.

    The job reads every file's footer anyway (row counts); when all of them
    hold the same Arrow schema it records it here, once, so a publisher can
    check the schema against its table without re-reading every footer.
    ``arrow`` is the base64 of the Arrow IPC schema message (schema and field
    metadata stripped; decoded by :mod:`.file_schema`), ``int96`` the columns
    stored as Parquet INT96 timestamps. Absent when the files differ, the
    format is not Parquet, or an older writer sealed the manifest.
    """

    arrow: str
    int96: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "int96", tuple(self.int96))

    def to_json(self) -> JsonObject:
        return {"arrow": self.arrow, "int96": list(self.int96)}


@dataclass(frozen=True)
class Manifest:
    """Everything a committer needs to publish one attempt of one checkpoint."""

    pipeline: str
    checkpoint_key: str
    sequence: int
    attempt: int
    file_format: str
    committables: tuple[Committable, ...]
    #: Globally unique id of this write attempt (32 hex digits, given by the
    #: committer table when the attempt starts). Staged names, target file
    #: names, publish markers and journals carry it, so "already published"
    #: is decided by identity, never by ``(pipeline, key, attempt number)``,
    #: which repeat once retention has trimmed the committer table.
    attempt_id: str = ""
    #: The partition columns the pipeline declares, in order (``()``: not
    #: declared). Every committable's partition directories must name exactly
    #: these columns, so a job writing ``dt=1/hour=5`` for a pipeline that
    #: declares ``dt`` fails before the target changes.
    partition_columns: tuple[str, ...] = ()
    #: Partitions this checkpoint replaces in ``overwrite`` mode, even if it
    #: wrote no file to them (an interval with no rows still replaces its
    #: partition). Each is a ``col=value/...`` path.
    partitions: tuple[str, ...] = ()
    start_offsets: JsonObject | None = None
    end_offsets: JsonObject | None = None
    created_at: str = field(default_factory=lambda: datetime.now(UTC).isoformat())
    job: str | None = None
    #: The staged files' common schema, recorded by the write job (version 3;
    #: ``None``: unknown, a publisher reads the footers).
    file_schema: FileSchema | None = None
    schema_version: int = SCHEMA_VERSION

    def __post_init__(self) -> None:
        object.__setattr__(self, "committables", tuple(self.committables))
        object.__setattr__(self, "partitions", tuple(self.partitions))
        object.__setattr__(self, "partition_columns", tuple(self.partition_columns))
        if not self.attempt_id:
            object.__setattr__(self, "attempt_id", legacy_attempt_id(self.attempt))
        _validate(self)

    @property
    def total_rows(self) -> int:
        return sum(c.rows or 0 for c in self.committables)

    @property
    def total_bytes(self) -> int:
        return sum(c.size for c in self.committables)

    @property
    def expected_count(self) -> int:
        return len(self.committables)

    def replaced_partitions(self) -> list[str]:
        """Partitions an ``overwrite`` publish replaces: declared plus written ones."""
        return list(self._replaced_partitions)

    @functools.cached_property
    def _replaced_partitions(self) -> tuple[str, ...]:
        # Asked several times per publish; one pass over 10,000 committables each time adds up.
        seen = dict.fromkeys(self.partitions)
        for c in self.committables:
            seen.setdefault(c.partition_path, None)
        return tuple(seen)

    def to_json(self) -> JsonObject:
        v2 = (
            {"attempt_id": self.attempt_id, "partition_columns": list(self.partition_columns)}
            if self.schema_version >= 2
            else {}
        )
        if self.schema_version >= 3:
            v2["file_schema"] = self.file_schema.to_json() if self.file_schema is not None else None
        return {
            **v2,
            "schema_version": self.schema_version,
            "pipeline": self.pipeline,
            "checkpoint": {"key": self.checkpoint_key, "sequence": self.sequence},
            "attempt": self.attempt,
            "format": self.file_format,
            "created_at": self.created_at,
            "job": self.job,
            "partitions": list(self.partitions),
            "source_offsets": {"start": self.start_offsets, "end": self.end_offsets},
            "committables": [c.to_json() for c in self.committables],
            "expected_count": self.expected_count,
            "totals": {
                "count": self.expected_count,
                "rows": self.total_rows,
                "bytes": self.total_bytes,
            },
        }

    def to_bytes(self) -> bytes:
        return canonical_json(self.to_json())

    @classmethod
    def from_bytes(cls, data: bytes, *, source: str = "manifest") -> Manifest:
        return parse_manifest(data, source=source)


def legacy_attempt_id(attempt: int) -> str:
    """The identity of an attempt sealed by a version-1 manifest (which had no attempt id)."""
    return f"v1-a{attempt}"


def canonical_json(obj: Any) -> bytes:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode(
        "utf-8"
    )


def digest_of(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def partition_of(path: str) -> tuple[tuple[str, str], ...]:
    parts = path.split("/")
    if "" in parts or "." in parts:  # only then do pathlib's parts differ from a plain split
        parts = list(PurePosixPath(path).parts)
    try:
        return _partition_pairs(tuple(parts[:-1]))
    except _NotAPartitionError as e:
        raise InvalidIdentifierError(
            f"committable path {path!r}: directory {e.args[0]!r} is not a column=value partition"
        ) from None


class _NotAPartitionError(Exception):
    pass


@functools.lru_cache(maxsize=4096)
def _partition_pairs(directories: tuple[str, ...]) -> tuple[tuple[str, str], ...]:
    # Cached: the committables of a checkpoint share a few partition directories.
    pairs = []
    for part in directories:
        column, sep, value = part.partition("=")
        if not sep:
            raise _NotAPartitionError(part)
        pairs.append(validate_partition(column, value))
    return tuple(pairs)


# --------------------------------------------------------------------------- validation


def _fail(source: str, problem: str) -> ManifestError:
    return ManifestError(f"{source}: {problem}")


def _check_relative_path(path: object, source: str, what: str) -> str:
    if not isinstance(path, str) or not path:
        raise _fail(source, f"{what} must be a non-empty string")
    if "\x00" in path or "\\" in path:
        raise _fail(source, f"{what} {path!r} contains a NUL or backslash")
    if path.startswith("/"):
        raise _fail(source, f"{what} {path!r} is absolute; it must be relative to the attempt")
    # String tests, not PurePosixPath (this runs once per committable). The
    # common case, no empty segment and none starting with ".", is two
    # substring searches; otherwise the segments say which rule is broken.
    if "//" not in path and not path.endswith("/") and "/." not in "/" + path:
        return path
    parts = path.split("/")
    if any(p in ("..", ".", "") for p in parts):
        raise _fail(source, f"{what} {path!r} has '.', '..' or an empty segment")
    if any(p.startswith(".") for p in parts):
        raise _fail(source, f"{what} {path!r} names a hidden file")
    return path


def _validate(m: Manifest) -> None:
    src = "manifest"
    if m.schema_version not in READABLE_VERSIONS:
        raise _fail(
            src, f"unknown schema_version {m.schema_version!r}; this walsink reads {READABLE_VERSIONS}"
        )
    if not isinstance(m.attempt_id, str) or not _ATTEMPT_ID.fullmatch(m.attempt_id):
        raise _fail(src, f"attempt_id {m.attempt_id!r} is not 32 hex digits")
    columns = m.partition_columns
    if len(set(columns)) != len(columns):
        raise _fail(src, f"partition_columns {list(columns)} name a column twice")
    try:
        for column in columns:
            validate_partition(column, "x")
    except InvalidIdentifierError as e:
        raise _fail(src, str(e)) from None
    try:
        validate_identifier(m.pipeline, "pipeline id")
        validate_identifier(m.checkpoint_key, "checkpoint key")
    except InvalidIdentifierError as e:
        raise _fail(src, str(e)) from None
    for name, value in (("sequence", m.sequence), ("attempt", m.attempt)):
        if not _is_int(value) or value < 0:
            raise _fail(src, f"{name} must be a non-negative integer, got {value!r}")
    if m.file_format not in FILE_FORMATS:
        raise _fail(src, f"format {m.file_format!r} is not one of {', '.join(FILE_FORMATS)}")
    if len(m.committables) > MAX_COMMITTABLES:
        raise _fail(src, f"{len(m.committables)} committables exceed the limit of {MAX_COMMITTABLES}")
    seen: set[str] = set()
    for i, c in enumerate(m.committables):
        what = f"committable {i}"
        _check_relative_path(c.path, src, f"{what} path")
        if c.path in seen:
            raise _fail(src, f"{what} path {c.path!r} is listed twice")
        seen.add(c.path)
        try:
            partition = c.partition  # validates the partition directories
        except InvalidIdentifierError as e:
            raise _fail(src, str(e)) from None
        if columns and tuple(col for col, _ in partition) != columns:
            raise _fail(src, _layout_problem(c.path, partition, columns))
        if not _is_int(c.size) or c.size < 0:
            raise _fail(src, f"{what} size must be a non-negative integer, got {c.size!r}")
        if c.rows is not None and (not _is_int(c.rows) or c.rows < 0):
            raise _fail(src, f"{what} rows must be a non-negative integer or null, got {c.rows!r}")
        if c.checksum is not None:
            algo, sep, hexdigest = str(c.checksum).partition(":")
            if not sep or algo not in CHECKSUM_ALGORITHMS or not _is_hex(hexdigest):
                raise _fail(src, f"{what} checksum {c.checksum!r} is not '<sha256|crc32>:<hex>'")
        if c.writer is not None and (not isinstance(c.writer, str) or len(c.writer) > 256):
            raise _fail(src, f"{what} writer must be a string of at most 256 characters")
        if c.stats is not None:
            _validate_stats(c, m, src, what)
    for p in m.partitions:
        try:
            _check_relative_path(p + "/x", src, "partition")
            pairs = partition_of(p + "/x")
        except InvalidIdentifierError as e:
            raise _fail(src, str(e)) from None
        if columns and tuple(col for col, _ in pairs) != columns:
            raise _fail(src, _layout_problem(p, pairs, columns))
    for name, offsets in (("start", m.start_offsets), ("end", m.end_offsets)):
        if offsets is not None and not isinstance(offsets, Mapping):
            raise _fail(src, f"source_offsets.{name} must be an object or null")
    if m.file_schema is not None:
        _validate_file_schema(m, src)


def _validate_file_schema(m: Manifest, src: str) -> None:
    fs = m.file_schema
    assert fs is not None
    if m.schema_version < 3:
        raise _fail(src, f"file_schema needs schema_version 3, the manifest has {m.schema_version}")
    if m.file_format != "parquet":
        raise _fail(src, f"file_schema is only recorded for parquet files, the format is {m.file_format!r}")
    if not isinstance(fs.arrow, str) or not fs.arrow or len(fs.arrow) > MAX_FILE_SCHEMA_CHARS:
        raise _fail(
            src, f"file_schema.arrow must be a non-empty string of at most {MAX_FILE_SCHEMA_CHARS} characters"
        )
    try:
        base64.b64decode(fs.arrow, validate=True)
    except (binascii.Error, ValueError):
        raise _fail(src, "file_schema.arrow is not base64") from None
    if not all(isinstance(c, str) and c for c in fs.int96):
        raise _fail(src, "file_schema.int96 must list column names")


def _validate_stats(c: Committable, m: Manifest, src: str, what: str) -> None:
    stats = c.stats
    assert stats is not None
    if m.schema_version < 4:
        raise _fail(src, f"{what} stats need schema_version 4, the manifest has {m.schema_version}")
    if m.file_format != "parquet":
        raise _fail(src, f"{what} stats are only recorded for parquet files, the format is {m.file_format!r}")
    for part, pairs in (("nulls", stats.nulls), ("min", stats.lower), ("max", stats.upper)):
        if len(pairs) > MAX_STATS_COLUMNS:
            raise _fail(src, f"{what} stats.{part} names more than {MAX_STATS_COLUMNS} columns")
        for column, value in pairs:
            if not isinstance(column, str) or not column:
                raise _fail(src, f"{what} stats.{part} has a column name that is not a non-empty string")
            if part == "nulls":
                ok = _is_int(value) and value >= 0 and (c.rows is None or value <= c.rows)
                if not ok:
                    raise _fail(
                        src,
                        f"{what} stats.nulls[{column!r}] must be an integer from 0 to the rows, got {value!r}",
                    )
            elif not isinstance(value, (int, str)) or (
                isinstance(value, str) and len(value) > MAX_STATS_STRING_CHARS
            ):
                raise _fail(
                    src,
                    f"{what} stats.{part}[{column!r}] must be an integer, a boolean or a string of at most "
                    f"{MAX_STATS_STRING_CHARS} characters",
                )
    lower, upper = dict(stats.lower), dict(stats.upper)
    for column in lower.keys() & upper.keys():
        low, high = lower[column], upper[column]
        if type(low) is not type(high) or low > high:  # type: ignore[operator]
            raise _fail(src, f"{what} stats of {column!r}: min {low!r} is not at most max {high!r}")


_ATTEMPT_ID = re.compile(r"[0-9a-f]{32}|v1-a[0-9]{1,9}")


def _layout_problem(path: str, partition: tuple[tuple[str, str], ...], columns: tuple[str, ...]) -> str:
    found = [col for col, _ in partition]
    return (
        f"{path!r} is partitioned by {found or 'nothing'}, but the pipeline declares partition columns "
        f"{list(columns)}: the job must write exactly those (nested or missing partition directories "
        "would be published beside, not over, the live partitions)"
    )


def _is_int(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_hex(s: str) -> bool:
    return bool(s) and all(ch in "0123456789abcdef" for ch in s)


def _expect(obj: Mapping[str, Any], key: str, types: type | tuple[type, ...], source: str) -> Any:
    if key not in obj:
        raise _fail(source, f"missing field {key!r}")
    value = obj[key]
    if not isinstance(value, types) or (isinstance(value, bool) and bool not in _as_tuple(types)):
        raise _fail(source, f"field {key!r} has the wrong type {type(value).__name__}")
    return value


def _as_tuple(t: type | tuple[type, ...]) -> tuple[type, ...]:
    return t if isinstance(t, tuple) else (t,)


def _reject_constant(name: str) -> Any:
    raise ValueError(f"non-finite number {name}")


def parse_manifest(data: bytes, *, source: str = "manifest") -> Manifest:
    """Parse and validate manifest bytes; raise :class:`ManifestError` naming the problem."""
    if len(data) > MAX_MANIFEST_BYTES:
        raise _fail(source, f"{len(data)} bytes exceed the manifest limit of {MAX_MANIFEST_BYTES}")
    try:
        obj = json.loads(data.decode("utf-8"), parse_constant=_reject_constant)
    except (UnicodeDecodeError, ValueError, RecursionError) as e:
        raise _fail(source, f"not valid JSON ({e})") from None
    if not isinstance(obj, dict):
        raise _fail(source, "top level must be a JSON object")
    version = obj.get("schema_version")
    if version not in READABLE_VERSIONS:
        raise _fail(source, f"unknown schema_version {version!r}; this walsink reads {READABLE_VERSIONS}")
    known = {
        "schema_version", "pipeline", "checkpoint", "attempt", "format", "created_at", "job",
        "partitions", "source_offsets", "committables", "expected_count", "totals",
    }  # fmt: skip
    if version >= 2:
        known |= {"attempt_id", "partition_columns"}
    if version >= 3:
        known |= {"file_schema"}
    unknown = sorted(set(obj) - known)
    if unknown:
        raise _fail(source, f"unknown fields {unknown}")
    checkpoint = _expect(obj, "checkpoint", dict, source)
    offsets = _expect(obj, "source_offsets", dict, source)
    raw_committables = _expect(obj, "committables", list, source)
    totals = _expect(obj, "totals", dict, source)
    committables = []
    for i, rc in enumerate(raw_committables):
        if not isinstance(rc, dict):
            raise _fail(source, f"committable {i} is not an object")
        extra = sorted(set(rc) - _COMMITTABLE_FIELDS[version >= 4])
        if extra:
            raise _fail(source, f"committable {i} has unknown fields {extra}")
        committables.append(
            Committable(
                path=_expect(rc, "path", str, source),
                size=_expect(rc, "size", int, source),
                rows=_expect(rc, "rows", (int, type(None)), source),
                checksum=_expect(rc, "checksum", (str, type(None)), source),
                writer=_expect(rc, "writer", (str, type(None)), source),
                stats=_parse_stats(rc["stats"], source, i) if "stats" in rc else None,
            )
        )
    try:
        manifest = Manifest(
            pipeline=_expect(obj, "pipeline", str, source),
            checkpoint_key=_expect(checkpoint, "key", str, source),
            sequence=_expect(checkpoint, "sequence", int, source),
            attempt=_expect(obj, "attempt", int, source),
            attempt_id=_expect(obj, "attempt_id", str, source) if version >= 2 else "",
            partition_columns=tuple(_expect(obj, "partition_columns", list, source)) if version >= 2 else (),
            file_format=_expect(obj, "format", str, source),
            committables=tuple(committables),
            partitions=tuple(_expect(obj, "partitions", list, source)),
            start_offsets=_expect(offsets, "start", (dict, type(None)), source),
            end_offsets=_expect(offsets, "end", (dict, type(None)), source),
            created_at=_expect(obj, "created_at", str, source),
            job=_expect(obj, "job", (str, type(None)), source),
            file_schema=_parse_file_schema(obj.get("file_schema"), source),
            schema_version=version,
        )
    except ManifestError as e:
        raise _fail(source, str(e).removeprefix("manifest: ")) from None
    expected = _expect(obj, "expected_count", int, source)
    if expected != manifest.expected_count:
        raise _fail(
            source, f"expected_count {expected} but {manifest.expected_count} committables are listed"
        )
    want = {"count": manifest.expected_count, "rows": manifest.total_rows, "bytes": manifest.total_bytes}
    if totals != want:
        raise _fail(source, f"totals {totals} do not match the committables ({want})")
    return manifest


_COMMITTABLE_FIELDS = {
    False: frozenset({"path", "size", "rows", "checksum", "writer"}),
    True: frozenset({"path", "size", "rows", "checksum", "writer", "stats"}),  # version 4
}


def _parse_stats(raw: object, source: str, i: int) -> FileStats:
    """A committable's ``stats`` object (present only when the writer recorded them)."""
    if not isinstance(raw, dict):
        raise _fail(source, f"committable {i} stats must be an object")
    extra = sorted(set(raw) - {"nulls", "min", "max"})
    if extra:
        raise _fail(source, f"committable {i} stats have unknown fields {extra}")
    parts = {}
    for part in ("nulls", "min", "max"):
        value = _expect(raw, part, dict, source)
        parts[part] = value
    return FileStats.of(nulls=parts["nulls"], lower=parts["min"], upper=parts["max"])


def _parse_file_schema(raw: object, source: str) -> FileSchema | None:
    if raw is None:
        return None
    if not isinstance(raw, dict):
        raise _fail(source, "file_schema must be an object or null")
    extra = sorted(set(raw) - {"arrow", "int96"})
    if extra:
        raise _fail(source, f"file_schema has unknown fields {extra}")
    return FileSchema(_expect(raw, "arrow", str, source), tuple(_expect(raw, "int96", list, source)))


# --------------------------------------------------------------------------- files


def write_atomic(path: str | os.PathLike[str], data: bytes) -> None:
    """Write ``data`` to ``path`` so that readers see the old file or the new one, never a part.

    Temp file in the same directory, fsync, rename over the target, fsync the
    directory so the rename itself survives a crash.
    """
    path = os.fspath(path)
    tmp = _temp_beside(path, data)
    try:
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    fsync_dir(os.path.dirname(path) or ".")


def _temp_beside(path: str, data: bytes) -> str:
    """A new temp file in ``path``'s directory holding ``data``, fsynced; removed again if writing fails."""
    tmp = os.path.join(os.path.dirname(path) or ".", f".{os.path.basename(path)}.{uuid.uuid4().hex}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    return tmp


def write_once(path: str | os.PathLike[str], data: bytes) -> None:
    """Create ``path`` holding ``data`` only if no file has that name (a seal): readers see all of it
    or nothing, and of two writers racing, one creates it and the other gets ``FileExistsError``.

    Temp file, fsync, hard link to ``path`` (which refuses an existing name, unlike a rename), fsync
    the directory. A file system without hard links falls back to a check, then a rename: the race
    between two writers of one name is open there again.
    """
    path = os.fspath(path)
    directory = os.path.dirname(path) or "."
    tmp = _temp_beside(path, data)
    try:
        try:
            os.link(tmp, path)
        except FileExistsError:
            raise
        except OSError as e:
            if e.errno not in (errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EMLINK):
                raise
            if os.path.lexists(path):
                raise FileExistsError(errno.EEXIST, "already sealed", path) from None
            os.replace(tmp, path)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
    fsync_dir(directory)


def fsync_dir(directory: str) -> None:
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_manifest(path: str | os.PathLike[str], manifest: Manifest) -> str:
    """Seal ``manifest`` at ``path`` atomically and return its digest."""
    data = manifest.to_bytes()
    write_atomic(path, data)
    return digest_of(data)


def read_manifest(path: str | os.PathLike[str], *, expected_digest: str | None = None) -> Manifest:
    """Read, digest-check and validate a sealed manifest.

    The file is opened without following a final symlink and read with a size
    cap, so a hostile manifest can neither redirect the read nor exhaust memory.
    """
    source = f"manifest {os.fspath(path)}"
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except FileNotFoundError:
        raise _fail(source, "does not exist (the write phase has not sealed it)") from None
    except OSError as e:
        raise _fail(source, f"cannot be opened ({e.strerror})") from None
    with os.fdopen(fd, "rb") as f:
        data = f.read(MAX_MANIFEST_BYTES + 1)
    if expected_digest is not None and digest_of(data) != expected_digest:
        raise _fail(source, f"digest {digest_of(data)} does not match the sealed digest {expected_digest}")
    return parse_manifest(data, source=source)


def build_manifest(
    *,
    pipeline: str,
    checkpoint_key: str,
    sequence: int,
    attempt: int,
    file_format: str,
    committables: Iterable[Committable],
    attempt_id: str,
    partition_columns: Iterable[str] = (),
    partitions: Iterable[str] = (),
    start_offsets: Mapping[str, Any] | None = None,
    end_offsets: Mapping[str, Any] | None = None,
    job: str | None = None,
    file_schema: FileSchema | None = None,
) -> Manifest:
    """Build a validated manifest; committables are ordered by path so the bytes are stable."""
    ordered = sorted(committables, key=lambda c: c.path)
    for offsets in (start_offsets, end_offsets):
        if offsets is not None:
            _json_safe(offsets)
    return Manifest(
        pipeline=pipeline,
        checkpoint_key=checkpoint_key,
        sequence=sequence,
        attempt=attempt,
        attempt_id=attempt_id,
        partition_columns=tuple(partition_columns),
        file_format=file_format,
        committables=tuple(ordered),
        partitions=tuple(partitions),
        start_offsets=dict(start_offsets) if start_offsets is not None else None,
        end_offsets=dict(end_offsets) if end_offsets is not None else None,
        job=job,
        file_schema=file_schema,
    )


def _json_safe(obj: Any) -> None:
    try:
        canonical_json(obj)
    except (TypeError, ValueError) as e:
        raise ManifestError(f"manifest: source offsets are not JSON-serialisable ({e})") from None
    if isinstance(obj, float) and not math.isfinite(obj):
        raise ManifestError("manifest: source offsets contain a non-finite number")
