"""A Delta table's walsink markers kept bounded: the oldest are expired from the table and kept in
the committer database, behind a hash chain the table carries (as Iceberg's are: :mod:`..archive`).

Delta keeps the newest application transaction of every app id for good: a commit can change one,
never remove it. What does remove one is ``delta.setTransactionRetentionDuration``: every engine
(Spark, delta-rs, delta-kernel) leaves out, at load and at the next log checkpoint, a transaction
whose ``lastUpdated`` is older than the duration. So a pipeline whose target sets
``table_markers`` has walsink *bound* the table once (:func:`bound_table`):

1. it re-stamps any walsink transaction written before walsink stamped them (Spark drops a
   transaction without a time at its next checkpoint once the duration is set) and records
   :data:`BOUND_APP`, then
2. sets the duration to :data:`RETENTION` (a thousand years): no live transaction expires.

An archiving commit then re-emits each transaction it archives at its own version stamped
:data:`EXPIRED`, far before any retention's start: from that table version on, readers no longer
see it and the next log checkpoint leaves it out. The same commit records the pipeline's chain in
application transactions of its own (:func:`state_apps`: how many entries were ever archived, the
table version of the archiving commit, the chain's SHA-256 digest in four 64-bit words) and, in
its ``commitInfo``, the batch it archived with the digest before it. The entries reach the
committer database only by copying that batch from the log (:func:`..archive.sync_chain`), as
Iceberg's reach it from the table's property. If log clean-up removed the batch's commit before
anything copied it (the commit's process died, and nothing of the pipeline ran for the log's
retention, 30 days by default), the database is behind the table and every question about an
archived marker is refused (:class:`..archive.ArchiveMismatchError`), never answered "no".

:class:`MarkedDeltaTable` is the table as walsink loads it: its ``transaction_version`` answers an
expired walsink transaction from the committer database, so every check of the publisher (marker,
attempt, tombstone, file count, partition holder, clean-up) reads archived and live alike.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
from deltalake import CommitProperties, DeltaTable, Transaction

from airflow_provider_walsink.core.targets import archive as _archive
from airflow_provider_walsink.core.targets.archive import (
    ArchivedEntry,
    ArchiveMismatchError,
    ArchiveState,
    PropertyArchive,
    genesis,
    sync_chain,
)
from airflow_provider_walsink.core.targets.delta.log import (
    BOUND_APP,
    EXPIRED,
    RETENTION,
    TXN_RETENTION,
    MarkerRetentionError,
    append_commit,
    commit_info,
    is_bound,
    now_ms,
)

log = logging.getLogger("airflow_provider_walsink.core.targets.delta")

#: The app id families of a pipeline's markers (``<family><pipeline>/...``), each archived alike.
FAMILIES = ("walsink/", "walsink-files/", "walsink-partition/")
ARCHIVE_APP = "walsink-archive/"
#: The ``commitInfo`` key of an archiving commit's batch (``<key><pipeline>``).
ARCHIVE_INFO = "walsink.archive."
#: The archive kind of every Delta entry (its item is the app id).
KIND = "txn"


def pipeline_of(app: str) -> str | None:
    """The pipeline of a walsink marker's app id, ``None`` for any other (a pipeline id has no ``/``)."""
    for family in FAMILIES:
        if app.startswith(family):
            return app[len(family) :].split("/", 1)[0] or None
    return None


def checkpoint_of(app: str) -> str:
    """The checkpoint key an app id names (``""``: a partition's latest holder, which names none)."""
    family = next(f for f in FAMILIES if app.startswith(f))
    rest = app[len(family) :].split("/", 1)[1] if "/" in app[len(family) :] else ""
    if family == "walsink-partition/":
        return rest.rsplit("#", 1)[1] if "#" in rest else ""
    return rest.split("/", 1)[0]


def state_apps(pipeline: str) -> dict[str, str]:
    """The app ids of a pipeline's archive state: ``count``, ``at`` and ``digest0`` to ``digest3``."""
    base = f"{ARCHIVE_APP}{pipeline}/"
    return {name: base + name for name in ("count", "at", "digest0", "digest1", "digest2", "digest3")}


def _words(digest: str) -> list[int]:
    raw = bytes.fromhex(digest)
    return [int.from_bytes(raw[i : i + 8], "big", signed=True) for i in range(0, 32, 8)]


def _digest(words: Sequence[int]) -> str:
    return b"".join(int(w).to_bytes(8, "big", signed=True) for w in words).hex()


def _read(fs: Any, path: str) -> bytes | None:
    try:
        with fs.open_input_stream(path) as f:
            return f.read()
    except (OSError, FileNotFoundError):
        return None


def live_transactions(
    storage: Any, table_uri: str, dt: DeltaTable
) -> dict[str, tuple[int, int | None]] | None:
    """Every application transaction of the table as loaded (``app id -> (version, lastUpdated)``),
    replayed from its log: the last checkpoint's ``txn`` column, then each commit since. ``None``
    when the log cannot be replayed here (a checkpoint newer than the load, a v2 checkpoint, a
    missing file): the caller then does without (nothing is archived). Expired ones are included;
    a caller checks a transaction against ``transaction_version`` before it relies on it."""
    latest = dt.version()
    fs, root = storage.fs_and_path(f"{table_uri}/_delta_log")
    found: dict[str, tuple[int, int | None]] = {}
    start = 0
    pointer = _read(fs, f"{root}/_last_checkpoint")
    if pointer is not None:
        info = json.loads(pointer)
        version = int(info["version"])
        if version > latest or "v2Checkpoint" in info:
            return None
        parts = info.get("parts")
        names = (
            [
                f"{version:020d}.checkpoint.{i:010d}.{int(parts):010d}.parquet"
                for i in range(1, int(parts) + 1)
            ]
            if parts
            else [f"{version:020d}.checkpoint.parquet"]
        )
        for name in names:
            data = _read(fs, f"{root}/{name}")
            if data is None:
                return None
            checkpoint = pq.ParquetFile(pa.BufferReader(data))
            if "txn" in checkpoint.schema_arrow.names:  # only that column: a checkpoint is mostly add actions
                for txn in checkpoint.read(columns=["txn"]).column("txn").to_pylist():
                    if txn:
                        found[txn["appId"]] = (int(txn["version"]), txn.get("lastUpdated"))
        start = version + 1
    for version in range(start, latest + 1):
        data = _read(fs, f"{root}/{version:020d}.json")
        if data is None:
            return None
        for line in data.decode().splitlines():
            if '"txn"' in line:
                txn = json.loads(line).get("txn")
                if txn:
                    found[txn["appId"]] = (int(txn["version"]), txn.get("lastUpdated"))
    return found


class MarkedDeltaTable(DeltaTable):
    """A table as walsink loads it: ``transaction_version`` of an expired walsink marker is
    answered from the committer database (module docstring), or refused
    (:class:`..archive.ArchiveMismatchError`) when the database cannot vouch for it."""

    archive: PropertyArchive | None = None
    storage: Any = None

    def attach(self, storage: Any, archive: PropertyArchive | None, uri: str) -> MarkedDeltaTable:
        """What walsink reads the log with, where archived markers are, and the table's URI as the
        target names it (in errors)."""
        self.storage = storage
        self.archive = archive
        self.uri = uri
        self._states: dict[str, ArchiveState] = {}
        self._synced: dict[str, int] = {}
        return self

    @property
    def where(self) -> str:
        return f"Delta table {self.uri}"

    @property
    def table_uuid(self) -> str:
        return str(self.metadata().id)

    def transaction_version(self, app_id: str) -> int | None:
        found = super().transaction_version(app_id)
        if found is not None:
            return found
        pipeline = pipeline_of(app_id)
        if pipeline is None or self.archive_state(pipeline).count == 0:
            return None
        upto = self.synced(pipeline)
        assert self.archive is not None  # synced() refuses without one
        raw = self.archive.archive_value(self.table_uuid, pipeline, KIND, app_id, upto)
        return int(raw) if raw is not None else None

    def update_incremental(self) -> None:
        super().update_incremental()
        self._states.clear()
        self._synced.clear()

    def archive_state(self, pipeline: str) -> ArchiveState:
        """What this table state says of the pipeline's archive: its chain from the state's
        transactions, the batch from the archiving commit's ``commitInfo`` (none if log clean-up
        removed it)."""
        if pipeline in self._states:
            return self._states[pipeline]
        apps = state_apps(pipeline)
        state = ArchiveState()
        # The count first: a table that never archived (most) costs one lookup, not six.
        if DeltaTable.transaction_version(self, apps["count"]):
            raw = {name: DeltaTable.transaction_version(self, app) for name, app in apps.items()}
            if None in raw.values():
                missing = sorted(name for name, v in raw.items() if v is None)
                raise ArchiveMismatchError(
                    f"{self.where}, pipeline {pipeline!r}: its archive state lacks {missing}; nothing is decided"
                )
            count, at = int(raw["count"]), int(raw["at"])  # type: ignore[arg-type]
            digest = _digest([raw[f"digest{i}"] for i in range(4)])  # type: ignore[misc]
            info = commit_info(self.storage, self.uri, at)
            carried = info.get(ARCHIVE_INFO + pipeline) if info else None
            if carried is None:  # log clean-up removed the batch: only a database in step will do
                state = ArchiveState(count, digest, digest, ())
            else:
                state = ArchiveState.parse(carried, self.where)
                if (state.count, state.digest) != (count, digest):
                    raise ArchiveMismatchError(
                        f"{self.where}, pipeline {pipeline!r}: table version {at} does not record the archive "
                        f"its transactions name ({count} entries, chain {digest[:12]}); nothing is decided"
                    )
        self._states[pipeline] = state
        return state

    def synced(self, pipeline: str) -> int:
        """Copy the batch into the database and check both chains end alike (:func:`..archive.sync_chain`)."""
        if pipeline not in self._synced:
            state = self.archive_state(pipeline)
            if state.count:
                sync_chain(self.archive, self.table_uuid, pipeline, state, where=self.where)
            self._synced[pipeline] = state.count
        return self._synced[pipeline]

    def archiving(
        self, pipelines: Sequence[str], setting: Sequence[Transaction], *, version: int, keep: int, batch: int
    ) -> tuple[list[Transaction], dict[str, str]]:
        """What a commit at ``version`` that sets ``setting`` also carries to keep each pipeline
        within ``keep`` markers: ``(transactions, commitInfo metadata)``, or nothing.

        Only on a table walsink bounded, with a committer database, and once in ``batch`` table
        versions (the log is replayed to find the oldest). The oldest by commit time beyond the
        bound, plus ``batch`` more, are archived; none that this commit sets. The commit must land
        at ``version`` exactly (no library retries): the state names it.
        """
        if self.archive is None or version % batch or not is_bound(self):
            return [], {}
        listed = live_transactions(self.storage, self.uri, self)
        if listed is None:
            log.info(
                "%s: its log cannot be replayed here, so nothing is archived in version %d",
                self.where,
                version,
            )
            return [], {}
        setting_ids = {t.app_id for t in setting}
        transactions: list[Transaction] = []
        metadata: dict[str, str] = {}
        at = now_ms()
        for pipeline in sorted(set(pipelines)):
            mine = {
                app: found
                for app, found in listed.items()
                if pipeline_of(app) == pipeline and found[1] != EXPIRED and app not in setting_ids
            }
            total = len(mine) + sum(1 for app in setting_ids if pipeline_of(app) == pipeline)
            if total <= keep:
                continue
            oldest = sorted(mine, key=lambda app: (mine[app][1] or 0, app))[
                : min(total - keep + batch, _archive.MAX_PER_COMMIT)
            ]
            # Only what this table state holds as listed (the replay is a cross-check, not the truth).
            chosen = [app for app in oldest if DeltaTable.transaction_version(self, app) == mine[app][0]]
            if not chosen:
                continue
            state = self.archive_state(pipeline)
            self.synced(pipeline)  # the previous batch is in the database before the state names another
            entries = tuple(ArchivedEntry(KIND, app, checkpoint_of(app), str(mine[app][0])) for app in chosen)
            base = state.digest or genesis(self.table_uuid, pipeline)
            new = ArchiveState(state.count + len(entries), "", base, entries)
            new = ArchiveState(new.count, new.digests()[-1], base, entries)
            transactions += [Transaction(app, mine[app][0], EXPIRED) for app in chosen]
            apps = state_apps(pipeline)
            transactions += [Transaction(apps["count"], new.count, at), Transaction(apps["at"], version, at)]
            transactions += [Transaction(apps[f"digest{i}"], w, at) for i, w in enumerate(_words(new.digest))]
            metadata[ARCHIVE_INFO + pipeline] = new.dump()
            log.info(
                "%s: archiving %d of pipeline %s's %d markers into the committer database (chain %d entries)",
                self.where, len(entries), pipeline, total, new.count,
            )  # fmt: skip
        return transactions, metadata

    def copy_archived(self, pipelines: Sequence[str]) -> None:
        """After an archiving commit (this state includes it): copy its batches into the database
        now, so it is behind the table only if this process dies first. Best effort: the next
        read copies what this could not."""
        for pipeline in pipelines:
            try:
                self.synced(pipeline)
            except Exception as exc:  # noqa: BLE001 - the next reader copies it, or refuses
                log.warning("%s: the archived batch of %s was not copied yet (%s)", self.where, pipeline, exc)


def bound_table(dt: DeltaTable, storage: Any, table_uri: str) -> None:
    """Bound the table's markers (module docstring): re-stamp walsink's transactions that carry no
    time, record :data:`BOUND_APP`, then set :data:`RETENTION`. Two commits; safe to repeat.

    Refused (a ``TargetStateError``, nothing changed) when another writer's transaction carries no
    time: Spark would drop it at its next checkpoint once the retention is set.
    """
    listed = live_transactions(storage, table_uri, dt)
    if listed is None:
        raise MarkerRetentionError(
            f"Delta table {table_uri}: its log cannot be replayed here (a v2 or missing checkpoint), so walsink "
            "cannot bound its markers (table_markers); remove table_markers from the target, nothing was published"
        )
    untimed = sorted(app for app, (_, t) in listed.items() if t is None and pipeline_of(app) is None)
    if untimed:
        raise MarkerRetentionError(
            f"Delta table {table_uri}: other writers' application transactions carry no time ({untimed[:5]}), "
            f"and setting {TXN_RETENTION} (which table_markers needs) would let Spark drop them at its next "
            "checkpoint; remove table_markers from the target, nothing was published"
        )
    if DeltaTable.transaction_version(dt, BOUND_APP) != 1:
        at = now_ms()
        stamped = [
            Transaction(app, version, at)
            for app, (version, t) in sorted(listed.items())
            if t is None and pipeline_of(app) is not None
        ]
        append_commit(
            dt,
            [],
            CommitProperties(
                custom_metadata={"walsink.bound": RETENTION},
                app_transactions=[*stamped, Transaction(BOUND_APP, 1, at)],
            ),
        )
        dt.update_incremental()
    log.info(
        "Delta table %s: setting %s = %r so walsink can archive its oldest markers",
        table_uri,
        TXN_RETENTION,
        RETENTION,
    )
    dt.alter.set_table_properties({TXN_RETENTION: RETENTION}, raise_if_not_exists=False)
