"""A table's walsink properties kept bounded: the oldest are moved into the committer database,
and the table keeps a hash chain over everything moved.

A table target records, per pipeline, one property per committed checkpoint (its marker) and,
in ``overwrite``, one per partition (its holder). Kept in the table forever they grow without
bound, and every commit and every reader loads and rewrites them all. So once a pipeline has
more than ``keep`` of them, a commit also *archives* the oldest (by commit time): it removes
them from the table, and in the same table commit sets the pipeline's archive property
``walsink.archive.<pipeline>``:

``{"count": E, "digest": D_E, "base": D_{E-k}, "batch": [the k entries just archived]}``

``D_n = sha256(D_{n-1}, entry n)`` chains every entry ever archived, from a genesis digest bound
to the table's UUID and the pipeline, so a table dropped and recreated under the same name, or
another table's entries, never match. The entries themselves go into the committer database
(``walsink_table_archive``, :class:`PropertyArchive`), always *copied from a committed table
state* (:meth:`WalsinkProperties.synced`): before anything reads an archived entry, and before
the next batch is archived, the batch the table carries is copied in and the database's chain
is checked against the table's. The database never holds an entry a table commit did not make.

Reading a property: the table's own, else the batch the table carries, else, only if the
database's chain ends exactly where the table's does, the database's latest entry for it. If
the database is behind by more than the batch (lost, or restored from an older backup),
diverged from the table (another database, a table restored to older metadata), or not given
at all, the read raises :class:`ArchiveMismatchError` naming both sides: the question "was this
checkpoint committed?" is then refused, never answered "no". A duplicate is never possible;
the pipeline waits for an operator to restore the database.

A pipeline with at most ``keep`` properties (or a publisher built without an archive) never
archives: its table holds what it always held. Aborted attempts' tombstones are not archived
(one per abort a person makes).
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from airflow_provider_walsink.core.protocol.errors import TargetStateError

ARCHIVE_PREFIX = "walsink.archive."
#: Property name prefix of each kind that is archived (``<prefix><pipeline>/<item>``).
KIND_PREFIXES = {"marker": "walsink.marker.", "partition": "walsink.partition."}
#: How many markers and partition holders a pipeline keeps in the table before a commit archives.
DEFAULT_KEEP = 256
#: How many more than ``keep`` an archiving commit moves, so that one commit in ``batch`` archives.
DEFAULT_BATCH = 64


def archive_bounds(table_markers: Any) -> tuple[int, int]:
    """``(keep, batch)`` for a target's ``table_markers`` (as ``target_options`` gives it: an int or
    its digits): the batch a quarter of the bound, 1 to :data:`DEFAULT_BATCH`, so that one commit
    in ``batch`` archives. ``ValueError`` naming the option for anything but a whole number >= 1."""
    try:
        keep = int(str(table_markers).strip()) if not isinstance(table_markers, bool) else 0
    except ValueError:
        keep = 0
    if keep < 1:
        raise ValueError(f"table_markers must be a whole number of at least 1, not {table_markers!r}")
    return keep, max(1, min(DEFAULT_BATCH, keep // 4))


#: At most this many per commit: a table written by an earlier walsink, holding every marker,
#: shrinks over a few commits instead of carrying them all in one batch property.
MAX_PER_COMMIT = 1024


class ArchiveMismatchError(TargetStateError):
    """The table's archive chain and the committer database's do not end in the same place."""


@dataclass(frozen=True)
class ArchivedEntry:
    """One property as the table held it when it was archived."""

    kind: str  # "marker" or "partition"
    item: str  # the checkpoint key, or the partition path
    #: The checkpoint the value names: the marker's key, or the checkpoint holding the partition.
    checkpoint: str
    value: str

    def as_list(self) -> list[str]:
        return [self.kind, self.item, self.checkpoint, self.value]


def genesis(table_uuid: str, pipeline: str) -> str:
    return hashlib.sha256(f"walsink archive\n{table_uuid}\n{pipeline}".encode()).hexdigest()


def chained(previous: str, entry: ArchivedEntry) -> str:
    """The chain's digest after ``entry`` (length-prefixed fields: no two entries encode alike)."""
    h = hashlib.sha256(previous.encode())
    for field in entry.as_list():
        data = field.encode()
        h.update(len(data).to_bytes(8, "big") + data)
    return h.hexdigest()


def property_name(kind: str, pipeline: str, item: str) -> str:
    # "/" cannot occur in a pipeline id, so the item is unambiguous.
    return f"{KIND_PREFIXES[kind]}{pipeline}/{item}"


def commit_time() -> int:
    """What a marker or holder records as its commit time (ms): the archiving order, nothing else."""
    return int(time.time() * 1000)


@dataclass(frozen=True)
class ArchiveState:
    """What a table says about one pipeline's archive (its ``walsink.archive.<pipeline>`` property)."""

    count: int = 0
    digest: str = ""
    base: str = ""
    batch: tuple[ArchivedEntry, ...] = ()

    @classmethod
    def parse(cls, raw: str | None, where: str) -> ArchiveState:
        if not raw:
            return cls()
        try:
            data = json.loads(raw)
            batch = tuple(ArchivedEntry(*map(str, e)) for e in data["batch"])
            return cls(int(data["count"]), str(data["digest"]), str(data["base"]), batch)
        except (ValueError, KeyError, TypeError) as exc:
            raise ArchiveMismatchError(f"{where}: its archive property cannot be read ({exc})") from None

    def dump(self) -> str:
        return json.dumps(
            {
                "count": self.count,
                "digest": self.digest,
                "base": self.base,
                "batch": [e.as_list() for e in self.batch],
            },
            separators=(",", ":"),
        )

    @property
    def first(self) -> int:
        """The position of ``base``: the entries before the batch."""
        return self.count - len(self.batch)

    def digests(self) -> list[str]:
        """The chain's digest after each entry of the batch."""
        out, d = [], self.base
        for e in self.batch:
            d = chained(d, e)
            out.append(d)
        return out


class PropertyArchive(Protocol):
    """The committer database's side: the archived entries of each (table, pipeline), in chain order.

    Every method binds its values; positions start at 1. ``archive_extend`` inserts entries
    ``first, first + 1, ...`` with the chain digest after each; an entry already there with
    the same digest is left, one with another digest raises :class:`ArchiveMismatchError`.
    """

    def archive_head(self, table_uuid: str, pipeline: str) -> tuple[int, str]: ...

    def archive_digest(self, table_uuid: str, pipeline: str, n: int) -> str | None: ...

    def archive_extend(
        self, table_uuid: str, pipeline: str, first: int, entries: Sequence[tuple[ArchivedEntry, str]]
    ) -> None: ...

    def archive_value(
        self, table_uuid: str, pipeline: str, kind: str, item: str, upto: int
    ) -> str | None: ...

    def archive_held(self, table_uuid: str, pipeline: str, checkpoint: str, upto: int) -> list[str]: ...


class WalsinkProperties:
    """The walsink properties of one table state, with the archived ones behind them (module docstring)."""

    def __init__(
        self, properties: Mapping[str, str], table_uuid: str, archive: PropertyArchive | None, *, where: str
    ) -> None:
        self.properties = properties
        self.table_uuid = table_uuid
        self.archive = archive
        self.where = where
        self._synced: dict[str, int] = {}

    def state(self, pipeline: str) -> ArchiveState:
        return ArchiveState.parse(self.properties.get(ARCHIVE_PREFIX + pipeline), self.where)

    def get(self, kind: str, pipeline: str, item: str) -> str | None:
        """The property's value in this table state, archived or not; ``None``: never set."""
        own = self.properties.get(property_name(kind, pipeline, item))
        if own is not None:
            return own
        state = self.state(pipeline)
        for e in reversed(state.batch):
            if e.kind == kind and e.item == item:
                return e.value
        if state.first == 0:
            return None  # nothing archived before the batch
        upto = self.synced(pipeline)
        assert self.archive is not None  # synced() refuses without one
        return self.archive.archive_value(self.table_uuid, pipeline, kind, item, upto)

    def archived_partitions_of(self, pipeline: str, checkpoint: str) -> list[str]:
        """Archived partitions whose latest holder is ``checkpoint`` and that the table no longer names."""
        if self.state(pipeline).count == 0:
            return []
        upto = self.synced(pipeline)
        assert self.archive is not None
        held = self.archive.archive_held(self.table_uuid, pipeline, checkpoint, upto)
        return [p for p in held if property_name("partition", pipeline, p) not in self.properties]

    def synced(self, pipeline: str) -> int:
        """Copy the table's batch into the database and check both chains end alike; the count.

        Raises :class:`ArchiveMismatchError` when they cannot be made to (module docstring).
        """
        if pipeline in self._synced:
            return self._synced[pipeline]
        state = self.state(pipeline)
        if state.count == 0:
            return 0
        sync_chain(self.archive, self.table_uuid, pipeline, state, where=self.where)
        self._synced[pipeline] = state.count
        return state.count

    def archiving(
        self, pipeline: str, setting: Mapping[str, str], *, keep: int, batch: int
    ) -> tuple[dict[str, str], list[str]]:
        """What a commit that sets ``setting`` also sets and removes to keep ``pipeline`` bounded.

        ``({archive property: new state}, [property names to remove])``, or nothing when the
        pipeline stays within ``keep`` or there is no archive. The oldest by commit time (a
        value's ``t``; properties written before it first, by name) are archived; nothing being
        set by this commit is.
        """
        if self.archive is None:
            return {}, []
        names: dict[str, tuple[str, str]] = {}
        for kind, prefix in KIND_PREFIXES.items():
            start = f"{prefix}{pipeline}/"
            for name in [*self.properties, *setting]:
                if name.startswith(start):
                    names[name] = (kind, name[len(start) :])
        if len(names) <= keep:
            return {}, []
        candidates = sorted(
            (n for n in names if n not in setting), key=lambda n: (_commit_time(self.properties[n]), n)
        )
        chosen = candidates[: min(len(names) - keep + batch, MAX_PER_COMMIT)]
        if not chosen:
            return {}, []
        state = self.state(pipeline)
        self.synced(pipeline)  # the previous batch is in the database before the table drops it
        entries = []
        for name in chosen:
            kind, item = names[name]
            value = self.properties[name]
            entries.append(ArchivedEntry(kind, item, _checkpoint_of(kind, item, value), value))
        base = state.digest or genesis(self.table_uuid, pipeline)
        new = ArchiveState(state.count + len(entries), "", base, tuple(entries))
        new = ArchiveState(new.count, new.digests()[-1], base, new.batch)
        return {ARCHIVE_PREFIX + pipeline: new.dump()}, chosen


def sync_chain(
    archive: PropertyArchive | None, table_uuid: str, pipeline: str, state: ArchiveState, *, where: str
) -> None:
    """Copy the batch ``state`` carries into the database, after checking both chains end alike.

    ``state`` is what one committed table state says (``count``, ``digest``; the batch it carries
    with the digest before it, or no batch: ``base == digest``). Raises
    :class:`ArchiveMismatchError` when the database lost entries the table no longer carries, its
    chain differs, or there is no database (module docstring).
    """
    what = f"{where}, pipeline {pipeline!r}"
    table_says = f"the table archived {state.count} entries (chain {state.digest[:12]})"
    if archive is None:
        raise ArchiveMismatchError(
            f"{what}: {table_says} into a committer database, and this publisher was given none; "
            "open the target through the committer (or pass TargetOptions.property_archive)"
        )
    digests = state.digests()
    if (digests[-1] if digests else state.base) != state.digest or (
        state.first == 0 and state.base != genesis(table_uuid, pipeline)
    ):
        raise ArchiveMismatchError(f"{what}: {table_says}, but its archive record does not chain")
    head, head_digest = archive.archive_head(table_uuid, pipeline)
    head_digest = head_digest if head else genesis(table_uuid, pipeline)
    db_says = f"the committer database holds {head} (chain {head_digest[:12]})"
    if head < state.first:
        raise ArchiveMismatchError(
            f"{what}: {table_says}; {db_says}: the database lost entries the table no longer carries "
            "(it was lost, or restored from an older backup). Nothing is published while walsink "
            "cannot tell which checkpoints this table holds: restore the committer database"
        )
    # The chain's digest after each position from ``first`` (the base) to ``count``.
    chain = [state.base, *digests]
    at = min(head, state.count)
    at_digest = head_digest if head == at else (archive.archive_digest(table_uuid, pipeline, at) or "")
    if at_digest != chain[at - state.first]:
        raise ArchiveMismatchError(
            f"{what}: {table_says}; {db_says}, and the two chains differ (another database, or the "
            "table was replaced or restored). Nothing is published: point walsink at this table's "
            "committer database, or restore it"
        )
    if head < state.count:
        start = head - state.first
        archive.archive_extend(
            table_uuid, pipeline, head + 1, list(zip(state.batch[start:], digests[start:], strict=True))
        )


def _commit_time(value: str) -> int:
    try:
        data: Any = json.loads(value)
    except ValueError:
        return 0
    return int(data.get("t", 0)) if isinstance(data, dict) else 0


def _checkpoint_of(kind: str, item: str, value: str) -> str:
    if kind == "marker":
        return item
    try:
        return str(json.loads(value).get("checkpoint", ""))
    except (ValueError, AttributeError):
        return ""
