"""The committer database's side of a table target's archive (``core/targets/archive.py``).

The rows are copies of what committed table states carried, inserted in chain order; this module
never decides what is archived, it stores and answers. Mixed into
:class:`~.store.CommitterStore`, which so satisfies :class:`~..targets.archive.PropertyArchive`.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.exc import IntegrityError

from airflow_provider_walsink.core.protocol.errors import TargetStateError
from airflow_provider_walsink.core.store.models import table_archive_table as archive
from airflow_provider_walsink.core.store.retry import retrying
from airflow_provider_walsink.core.store.transitions import CheckpointTransitions


def _item_digest(item: str) -> str:
    return hashlib.sha256(item.encode()).hexdigest()


class TableArchives(CheckpointTransitions):
    """Store and read archived table properties; mixed into :class:`~.store.CommitterStore`."""

    def archive_head(self, table_uuid: str, pipeline: str) -> tuple[int, str]:
        """``(n, digest)`` of the last archived entry of the table's pipeline, ``(0, "")`` if none."""
        with self.engine.connect() as conn:
            last = conn.execute(
                select(archive.c.n, archive.c.digest)
                .where(archive.c.table_uuid == table_uuid, archive.c.pipeline == pipeline)
                .order_by(archive.c.n.desc())
                .limit(1)
            ).first()
        return (int(last.n), last.digest) if last is not None else (0, "")

    def archive_digest(self, table_uuid: str, pipeline: str, n: int) -> str | None:
        with self.engine.connect() as conn:
            return conn.execute(
                select(archive.c.digest).where(
                    archive.c.table_uuid == table_uuid, archive.c.pipeline == pipeline, archive.c.n == n
                )
            ).scalar()

    @retrying
    def archive_extend(
        self, table_uuid: str, pipeline: str, first: int, entries: Sequence[tuple[Any, str]]
    ) -> None:
        """Insert ``entries`` (``(entry, digest after it)``; an entry has ``kind``, ``item``,
        ``checkpoint`` and ``value``) at positions ``first, first + 1, ...``; safe to repeat and to race.

        An entry already there with the same digest is left; another digest at a position
        raises :class:`TargetStateError` (two tables, or two histories, claim the chain).
        """
        last = first + len(entries) - 1
        mine = (archive.c.table_uuid == table_uuid) & (archive.c.pipeline == pipeline)
        for attempt in range(2):
            try:
                with self._tx() as conn:
                    have = dict(
                        conn.execute(
                            select(archive.c.n, archive.c.digest).where(
                                mine & archive.c.n.between(first, last)
                            )
                        ).all()
                    )
                    now = self._now(conn)
                    rows = []
                    for n, (entry, digest) in enumerate(entries, start=first):
                        if n in have:
                            if have[n] != digest:
                                raise TargetStateError(
                                    f"table {table_uuid}, pipeline {pipeline!r}: the committer database "
                                    f"holds another entry {n} of the archive chain than the table carries"
                                )
                            continue
                        rows.append(
                            {
                                "table_uuid": table_uuid,
                                "pipeline": pipeline,
                                "n": n,
                                "kind": entry.kind,
                                "item": entry.item,
                                "item_digest": _item_digest(entry.item),
                                "checkpoint_key": entry.checkpoint,
                                "value": entry.value,
                                "digest": digest,
                                "archived_at": now,
                            }
                        )
                    if rows:
                        conn.execute(archive.insert(), rows)
                return
            except IntegrityError:
                if attempt:  # another copier inserted them first: read them again and compare
                    raise

    def archive_value(self, table_uuid: str, pipeline: str, kind: str, item: str, upto: int) -> str | None:
        """The latest archived value of the property at or before position ``upto``, or ``None``."""
        with self.engine.connect() as conn:
            return conn.execute(
                select(archive.c.value)
                .where(
                    archive.c.table_uuid == table_uuid,
                    archive.c.pipeline == pipeline,
                    archive.c.kind == kind,
                    archive.c.item_digest == _item_digest(item),
                    archive.c.n <= upto,
                )
                .order_by(archive.c.n.desc())
                .limit(1)
            ).scalar()

    def archive_held(self, table_uuid: str, pipeline: str, checkpoint: str, upto: int) -> list[str]:
        """Partitions whose latest archived holder (at or before ``upto``) is ``checkpoint``: one
        statement, the latest entry of each partition the checkpoint ever held."""
        mine = (
            (archive.c.table_uuid == table_uuid)
            & (archive.c.pipeline == pipeline)
            & (archive.c.kind == "partition")
            & (archive.c.n <= upto)
        )
        named = select(archive.c.item_digest).where(mine & (archive.c.checkpoint_key == checkpoint))
        latest = (
            select(archive.c.item_digest, func.max(archive.c.n).label("n"))
            .where(mine & archive.c.item_digest.in_(named))
            .group_by(archive.c.item_digest)
            .subquery()
        )
        with self.engine.connect() as conn:
            held = (
                conn.execute(
                    select(archive.c.item)
                    .join(
                        latest, (archive.c.item_digest == latest.c.item_digest) & (archive.c.n == latest.c.n)
                    )
                    .where(mine & (archive.c.checkpoint_key == checkpoint))
                )
                .scalars()
                .all()
            )
        return sorted(held)
