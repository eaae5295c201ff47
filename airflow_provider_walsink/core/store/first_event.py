"""First-event claims: one commit task at a time adds a pipeline's first asset event.

An orchestrator that links an alias to an asset when the first event passes
through the alias (Airflow 3.3's ``AssetManager``) can fail one of two tasks
whose first events are recorded at the same moment, on the link's unique key,
although both commits succeeded. The committer table serializes that first
event: a commit task that finds no event of its target through the alias yet
claims the pipeline's ``first_event_holder`` (a compare-and-set on the
pipeline's row) and adds its event; the others wait until an event shows up,
then add theirs. A claim older than ``stale_after`` (its holder died before its
event was recorded, or the pipeline's target changed since) is taken over. The
holder's retries (same ``holder`` string) claim again at once.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from sqlalchemy import Connection, and_, or_, update
from sqlalchemy.sql.elements import ColumnElement

from airflow_provider_walsink.core.store.models import pipeline_table as pipe
from airflow_provider_walsink.core.store.retry import retrying
from airflow_provider_walsink.core.store.transitions import CheckpointTransitions


class FirstEventClaims(CheckpointTransitions):
    """Claim a pipeline's first asset event; mixed into :class:`~.store.CommitterStore`."""

    @retrying
    def claim_first_event(self, pipeline: str, holder: str, *, stale_after: timedelta) -> bool:
        """Make ``holder`` the one allowed to add the pipeline's first asset event; ``True`` if it is.

        It is when no one holds the claim, when ``holder`` already does, or when the claim
        is older than ``stale_after`` on the database's clock. One statement, so two
        claimants never both win. ``False`` also for a pipeline with no row (nothing was
        ever registered). Safe to repeat.
        """
        holder = holder[:255]
        with self._tx() as conn:
            now = self._now(conn)
            claimed_at = pipe.c.first_event_claimed_at
            return claim_on_pipeline_row(
                conn,
                pipeline,
                pipe.c.first_event_holder,
                holder,
                expired=and_(claimed_at.is_not(None), claimed_at < now - stale_after),
                values={"first_event_holder": holder, "first_event_claimed_at": now},
            )


def claim_on_pipeline_row(
    conn: Connection,
    pipeline: str,
    holder_column: Any,
    holder: str,
    *,
    expired: ColumnElement[bool],
    values: dict[str, Any],
) -> bool:
    """One compare-and-set on the pipeline's row: ``holder`` takes the claim in ``holder_column``
    when it is free, already its own, or ``expired``; ``True`` if it did (so two claimants never
    both win). Writes ``values`` when it does."""
    claimed = conn.execute(
        update(pipe)
        .where(pipe.c.name == pipeline, or_(holder_column.is_(None), holder_column == holder, expired))
        .values(**values)
    )
    return claimed.rowcount == 1
