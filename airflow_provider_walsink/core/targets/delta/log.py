"""What walsink records in a Delta table's log, and how it reads it back.

The markers are application transactions (``transaction_version(app_id)``, answered from the
table state deltalake loads anyway): per checkpoint, per attempt, per attempt's file count and
per ``overwrite`` partition (:mod:`.delta` says what each version means). A commit's
``commitInfo`` names what it published (:func:`commit_holders`: one checkpoint, or each member
of a group commit). Add actions carry ``stats`` as Delta's own writers choose them
(:func:`delta_stats_columns`, :func:`delta_stats`). The publisher (:mod:`.delta`) imports this
module; nothing here knows the publisher.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator, Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any

from deltalake import CommitProperties, DeltaTable, Transaction
from deltalake.transaction import AddAction, RemoveAction

from airflow_provider_walsink.core.protocol.errors import TargetStateError
from airflow_provider_walsink.core.protocol.file_stats import bound_kind
from airflow_provider_walsink.core.protocol.manifest import FileStats, Manifest
from airflow_provider_walsink.core.targets._tables import CheckpointRef, Storage, offsets_value

#: The application-transaction version of an attempt an abort tombstoned: never a fencing token
#: (tokens are positive), so such an attempt never holds the checkpoint's version.
ABORTED_TXN = -1
#: How far back ``published_attempt`` looks for the id of another attempt (a rare, reconciling path).
HISTORY_SCAN_LIMIT = 10_000
#: The table property by which Delta readers expire application transactions. With it set, Spark's
#: Delta drops every one without a ``lastUpdated`` at the table's next log checkpoint, and every
#: engine (Spark, delta-rs) drops one older than the duration (Delta's ``InMemoryLogReplay``).
TXN_RETENTION = "delta.setTransactionRetentionDuration"
#: Check + commit attempts before giving up on a table that keeps changing.
MAX_COMMIT_ATTEMPTS = 20
#: Check + commit attempts of one group before giving up on a table that keeps changing.
GROUP_COMMIT_ATTEMPTS = 40


#: walsink's value of ``delta.setTransactionRetentionDuration`` on a table it bounds: long enough
#: that no live transaction ever expires, finite so that :data:`EXPIRED` is before its start.
RETENTION = "interval 365000 days"
#: The ``lastUpdated`` of an archived transaction: before any retention's start (-2^62 ms).
EXPIRED = -(2**62)
#: Set (version 1) by :func:`bound_table` before the retention: the table was bounded by walsink.
BOUND_APP = "walsink-bounded"


class MarkerRetentionError(TargetStateError):
    """The Delta table expires application transactions (:data:`TXN_RETENTION` is set), so the
    markers walsink relies on can vanish on their own: nothing is published, tombstoned or cleaned
    up in it until the property is removed."""


def check_markers_kept(dt: DeltaTable, table_uri: str) -> None:
    """Refuse a table that can drop walsink's markers on its own (:class:`MarkerRetentionError`).

    A marker gone from the table reads as "never published": a re-run whose committer rows were
    trimmed (``walsink gc``) or lost would publish the checkpoint twice, and the clean-up, which
    keeps a staged attempt only while its application transaction names it, would delete files the
    table still references. Refused whatever the duration, but for the one walsink sets itself on
    a table it bounds (:func:`is_bound`, :mod:`.markers`: no live marker expires, and those it
    expires are kept in the committer database): markers written before walsink stamped them with
    their commit time have none, and Spark drops those at its next log checkpoint.
    """
    value = retention_of(dt)
    if value is not None and not is_bound(dt):
        raise MarkerRetentionError(
            f"Delta table {table_uri} sets {TXN_RETENTION} = {value!r}: Delta then expires the "
            "application transactions that are walsink's markers (Spark drops those without a "
            "time at its next log checkpoint, every engine drops those older than the "
            "duration), and a re-run of a checkpoint whose committer rows were trimmed or lost "
            "could publish it twice. Remove the property (ALTER TABLE ... UNSET TBLPROPERTIES "
            f"('{TXN_RETENTION}')) to commit into this table (docs/targets.md, \"Delta tables that "
            'expire application transactions are refused"); walsink sets its own value only when it '
            "bounds the table's markers itself (target option table_markers); nothing was published or deleted"
        )


def retention_of(dt: DeltaTable) -> str | None:
    for key, value in dt.metadata().configuration.items():
        if key.lower() == TXN_RETENTION.lower() and value is not None and str(value).strip():
            return str(value)
    return None


def is_bound(dt: DeltaTable) -> bool:
    """Whether walsink bounded the table: its retention, set after its own transactions were stamped."""
    value = retention_of(dt)
    return (
        value is not None
        and " ".join(value.lower().split()) == RETENTION
        and DeltaTable.transaction_version(dt, BOUND_APP) == 1
    )


def now_ms() -> int:
    """The ``lastUpdated`` walsink's application transactions carry: their commit time, so a
    table that expires them (:data:`TXN_RETENTION`) does so by age in every engine, never at the
    next log checkpoint (as Spark does with one that has no time)."""
    return int(time.time() * 1000)


def app_id(manifest: Manifest | CheckpointRef, attempt_id: str | None = None) -> str:
    base = f"walsink/{manifest.pipeline}/{manifest.checkpoint_key}"
    return f"{base}/{attempt_id}" if attempt_id else base


def files_app_id(manifest: Manifest | CheckpointRef, attempt_id: str) -> str:
    """App id whose version is the number of data files the attempt's commit added."""
    return f"walsink-files/{manifest.pipeline}/{manifest.checkpoint_key}/{attempt_id}"


def partition_app_id(pipeline: str, partition: str, checkpoint_key: str | None = None) -> str:
    """App id of an ``overwrite`` partition: its version is the table version of the commit that last
    replaced it; with ``checkpoint_key``, the same version when that commit was this checkpoint's.
    (Hive escapes ``#`` in partition values, and a key has no ``#``.)"""
    base = f"walsink-partition/{pipeline}/{partition}"
    return f"{base}#{checkpoint_key}" if checkpoint_key else base


def commit_properties(
    manifest: Manifest,
    token: int,
    transactions: Sequence[Transaction],
    *,
    exact_version: bool,
    metadata: Mapping[str, str] | None = None,
) -> CommitProperties:
    """The commit's metadata (naming the checkpoint, plus ``metadata``) and ``transactions``
    (:func:`marker_transactions`, and what archiving adds). With ``exact_version`` (a commit whose
    transactions name its own table version: partition holders, an archive state) the library
    does not retry it at another version."""
    info = {
        "walsink.pipeline": manifest.pipeline,
        "walsink.checkpoint": manifest.checkpoint_key,
        "walsink.sequence": str(manifest.sequence),
        "walsink.attempt-id": manifest.attempt_id,
        "walsink.epoch": str(token),
        **(metadata or {}),
    }
    offsets = offsets_value(manifest)
    if offsets is not None:
        info["walsink.offsets"] = json.dumps(offsets, sort_keys=True)
    return CommitProperties(
        custom_metadata=info,
        app_transactions=list(transactions),
        max_commit_retries=0 if exact_version else None,
        # The library's retries only rebase onto commits its conflict check
        # accepts; a commit carrying our app id is refused, and then walsink
        # reloads and checks the marker itself.
    )


def marker_transactions(
    manifest: Manifest, token: int, files: int, replaced: Sequence[str], version: int
) -> list[Transaction]:
    """The application transactions one checkpoint's commit carries, alone or in a group: the
    checkpoint and the attempt at ``token`` (the fencing token), the attempt's file count, and for
    each replaced partition its holder at ``version`` (the table version the commit must get)."""
    at = now_ms()
    return [
        Transaction(app_id(manifest), token, at),
        Transaction(app_id(manifest, manifest.attempt_id), token, at),
        Transaction(files_app_id(manifest, manifest.attempt_id), files, at),
        *(
            Transaction(app, version, at)
            for partition in replaced
            for app in (
                partition_app_id(manifest.pipeline, partition),
                partition_app_id(manifest.pipeline, partition, manifest.checkpoint_key),
            )
        ),
    ]


def append_commit(dt: DeltaTable, actions: list[AddAction | RemoveAction], commit: CommitProperties) -> None:
    """One put-if-absent log version on ``dt`` as loaded: ``actions`` (data, or none for a
    tombstone) and ``commit``'s application transactions; ``CommitFailedError`` if the log moved
    in a conflicting way since the load."""
    dt.create_write_transaction(
        actions, "append", dt.schema(), partition_by=dt.metadata().partition_columns, commit_properties=commit
    )


def history(storage: Storage, table_uri: str, dt: DeltaTable) -> Iterator[dict[str, Any]]:
    """The ``commitInfo`` of the newest :data:`HISTORY_SCAN_LIMIT` versions, newest first, read
    one log entry at a time (and only until the caller finds what it looks for).

    Not ``DeltaTable.history()``: that reads every entry up front, and stalls against an S3 API
    without a listing it expects (moto's server), so a reconcile of a table on S3 hung there.
    Versions the log no longer keeps (log retention) are skipped, as ``history()`` skips them.
    """
    latest = dt.version()
    for version in range(latest, max(-1, latest - HISTORY_SCAN_LIMIT), -1):
        info = commit_info(storage, table_uri, version)
        if info is not None:
            yield info


def commit_info(storage: Storage, table_uri: str, version: int) -> dict[str, Any] | None:
    """The ``commitInfo`` of one table version, read from its log entry (``None``: gone or unreadable)."""
    fs, path = storage.fs_and_path(f"{table_uri}/_delta_log/{version:020d}.json")
    try:
        with fs.open_input_stream(path) as f:
            text = f.read().decode()
    except (OSError, FileNotFoundError):
        return None
    for line in text.splitlines():
        if line.strip().startswith('{"commitInfo"'):
            return json.loads(line)["commitInfo"]
    for line in text.splitlines():
        if line.strip():
            found = json.loads(line).get("commitInfo")
            if found is not None:
                return found
    return None


def held_version(version: int | None) -> bool:
    """An attempt's application transaction says a table version held it (not: none, or a tombstone)."""
    return version is not None and version != ABORTED_TXN


def commit_holders(info: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The checkpoints one walsink commit published, from its ``commitInfo``: one for a single
    commit (``pipeline``, ``checkpoint``, ``attempt_id``, ``epoch``; ``partitions`` unknown: ``None``),
    each member of a group commit (with the partitions it replaced)."""
    raw = info.get("walsink.group")
    if raw:
        try:
            return list(json.loads(raw))
        except (TypeError, ValueError):
            return []
    if info.get("walsink.checkpoint") is None:
        return []
    return [
        {
            "pipeline": info.get("walsink.pipeline"),
            "checkpoint": info.get("walsink.checkpoint"),
            "attempt_id": info.get("walsink.attempt-id"),
            "epoch": info.get("walsink.epoch"),
            "partitions": None,
        }
    ]


#: Delta's default number of leading data columns that get statistics (``delta.dataSkippingNumIndexedCols``).
DEFAULT_INDEXED_COLUMNS = 32


def delta_stats_columns(
    columns: Mapping[str, Any], partition_by: Sequence[str], configuration: Mapping[str, Any]
) -> dict[str, str]:
    """The table's columns that get statistics, each with how its bounds are written (:func:`delta_stats`).

    As Delta's own writers choose them: the columns named by ``delta.dataSkippingStatsColumns``,
    else the first ``delta.dataSkippingNumIndexedCols`` (default 32, ``-1``: all) data columns
    (partition columns excluded) in schema order. None under column mapping (the log would need
    the physical names). The kind is ``""`` for a column that gets a null count but no bounds
    (types whose bounds are ill-defined: :mod:`~airflow_provider_walsink.core.protocol.file_stats`).
    """
    if str(configuration.get("delta.columnMapping.mode") or "none").lower() != "none":
        return {}
    data = [c for c in columns if c not in set(partition_by)]
    named = configuration.get("delta.dataSkippingStatsColumns")
    if named:
        wanted = {c.strip().strip("`") for c in str(named).split(",")}
        data = [c for c in data if c in wanted]
    else:
        try:
            limit = int(configuration.get("delta.dataSkippingNumIndexedCols", DEFAULT_INDEXED_COLUMNS))
        except ValueError:
            limit = DEFAULT_INDEXED_COLUMNS
        data = data if limit < 0 else data[:limit]
    return {c: _delta_bound_kind(columns[c]) for c in data}


def _delta_bound_kind(arrow_type: Any) -> str:
    """The writer's bound kind (:func:`~airflow_provider_walsink.core.protocol.file_stats.bound_kind`), else
    ``"nested"`` (no statistics at all: Delta nests them per field; walsink keeps none) or ``""``."""
    import pyarrow as pa

    kind = bound_kind(arrow_type)
    if kind is not None:
        return kind
    return "nested" if pa.types.is_nested(arrow_type) else ""


def _delta_bound(kind: str, value: Any, *, upper: bool) -> Any:
    """A manifest bound as Delta's stats JSON writes it for a column of ``kind``, or ``None``.

    Timestamps: Delta's stats hold milliseconds, so a lower bound rounds down and an upper
    bound up (``.999999`` is ``+1 ms``): both still bound the file, whatever the reader adds.
    """
    if kind == "int":
        return value if isinstance(value, int) and not isinstance(value, bool) else None
    if kind == "bool":
        return value if isinstance(value, bool) else None
    if kind in ("date", "string"):
        return value if isinstance(value, str) else None
    if kind == "timestamp" and isinstance(value, str) and value.endswith("Z"):
        try:
            moment = datetime.fromisoformat(value)
        except ValueError:
            return None
        extra = moment.microsecond % 1000
        if extra:
            moment -= timedelta(microseconds=extra)
            if upper:
                try:
                    moment += timedelta(milliseconds=1)
                except OverflowError:
                    return None
        return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")
    return None


def delta_stats(rows: int, stats: FileStats, columns: Mapping[str, str]) -> str:
    """An add action's ``stats`` JSON: ``numRecords`` and, for ``columns`` (name -> kind, from
    :func:`delta_stats_columns`), the file's ``nullCount``, ``minValues`` and ``maxValues``."""
    doc: dict[str, Any] = {"numRecords": rows}
    nulls = {c: n for c, n in stats.nulls if columns.get(c, "nested") != "nested"}
    lower = {}
    upper = {}
    for found, side, is_upper in ((lower, stats.lower, False), (upper, stats.upper, True)):
        for column, value in side:
            kind = columns.get(column)
            bound = _delta_bound(kind, value, upper=is_upper) if kind else None
            if bound is not None:
                found[column] = bound
    if lower:
        doc["minValues"] = lower
    if upper:
        doc["maxValues"] = upper
    if nulls:
        doc["nullCount"] = nulls
    return json.dumps(doc, separators=(",", ":"))
