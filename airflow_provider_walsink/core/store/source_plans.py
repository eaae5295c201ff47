"""Source plans: the input ranges a checkpoint's write phase fixes once and every retry reuses.

A source read by offsets (Kafka) must give a retried write attempt exactly the
records its first attempt was given, or the staged data would depend on when
the retry ran. The write task plans the ranges (start and end offsets per
partition, any accepted retention gap) before it submits the job, and records
the plan on the checkpoint's row (``source_plan``, migration 0006) in one
transaction with a history row; the **first recorded plan wins** for the
checkpoint's version as long as it starts where the attempt starts. A new
version (reprocess) reads up to the end of the version it replaces instead and
never reuses a plan of an older version.

A consumer group a source commits offsets to belongs to one pipeline per
Kafka cluster (``walsink_consumer_group``, migration 0009): the first pipeline
to plan with it claims it, and a second one is refused, naming both.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from sqlalchemy import select, update
from sqlalchemy.exc import IntegrityError

from airflow_provider_walsink.core.protocol.identifiers import validate_identifier
from airflow_provider_walsink.core.store.errors import (
    ConsumerGroupMovedError,
    ConsumerGroupOwnedError,
    StoreError,
)
from airflow_provider_walsink.core.store.models import checkpoint_table as ckpt
from airflow_provider_walsink.core.store.models import consumer_group_table as groups
from airflow_provider_walsink.core.store.models import pipeline_table as pipe
from airflow_provider_walsink.core.store.queries import newest_committed_json, newest_committed_offsets
from airflow_provider_walsink.core.store.records import Actor
from airflow_provider_walsink.core.store.retry import retrying
from airflow_provider_walsink.core.store.transitions import CheckpointTransitions


def _same(a: Any, b: Any) -> bool:
    return json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)


class SourcePlans(CheckpointTransitions):
    """Record and read source plans; mixed into :class:`~.store.CommitterStore`."""

    @contextmanager
    def newest_committed_offsets_held(
        self, pipeline: str, *, consumer_group: tuple[str, str] | None = None
    ) -> Iterator[dict[str, Any] | None]:
        """The end offsets of the pipeline's newest COMMITTED checkpoint, held while the caller
        sends them on (a consumer group's commit): the pipeline's row stays locked (``SELECT ...
        FOR UPDATE``; SQLite's write lock) until the block ends, so two commit tasks send one
        after the other, each the newest at its turn, and a slow one never moves the group
        behind a newer commit. A pipeline with nothing committed yields ``None``.

        ``consumer_group``: ``(cluster, group_id)`` the offsets are sent to. It must still belong
        to ``pipeline``, checked under the same lock (:meth:`reassign_consumer_group` takes the
        owner's lock too, so a hand-over waits for a send in flight and every later send sees
        it): a group handed to another pipeline since this one planned with it raises
        :class:`~.errors.ConsumerGroupMovedError` naming both, before anything is yielded. A
        group no pipeline holds (claimed before migration 0009) is claimed for ``pipeline``.
        """
        with self._tx() as conn:
            conn.execute(select(pipe.c.name).where(pipe.c.name == pipeline).with_for_update())
            if consumer_group is not None:
                self._hold_consumer_group(conn, *consumer_group, pipeline)
            yield newest_committed_offsets(conn, pipeline)

    def _hold_consumer_group(self, conn: Any, cluster: str, group_id: str, pipeline: str) -> None:
        key = (groups.c.cluster == cluster) & (groups.c.group_id == group_id)
        owner = conn.execute(select(groups.c.pipeline).where(key)).scalar_one_or_none()
        if owner is None:
            # No claim (a group first used before claims were recorded): this pipeline's, as at a plan.
            conn.execute(
                groups.insert().values(
                    cluster=cluster, group_id=group_id, pipeline=pipeline, claimed_at=self._now(conn)
                )
            )
        elif owner != pipeline:
            raise ConsumerGroupMovedError(
                f"Kafka consumer group {group_id!r} ({cluster}) belongs to pipeline {owner!r} now, not to "
                f"pipeline {pipeline!r}, which committed with it (it was handed over since): no offsets of "
                f"{pipeline!r} were sent, so the group still shows {owner!r}'s progress. The checkpoint "
                f"itself is committed. If the hand-over was a mistake, give the group back (walsink "
                f"reassign-group {group_id} --cluster {cluster} --pipeline {pipeline}); otherwise give "
                f"pipeline {pipeline!r} its own group_id"
            )

    @retrying
    def reassign_consumer_group(self, cluster: str, group_id: str, pipeline: str) -> str:
        """Hand consumer group ``group_id`` of ``cluster`` over to ``pipeline``; return its previous owner.

        From then on ``pipeline`` plans with the group and sends its committed offsets to it,
        and the previous owner is refused both (:class:`~.errors.ConsumerGroupOwnedError` at its
        plan, :class:`~.errors.ConsumerGroupMovedError` after its commits). The previous owner's
        pipeline row is locked first, as its after-commit send holds it
        (:meth:`newest_committed_offsets_held`): a send in flight finishes before the hand-over.
        ``pipeline`` need not be registered yet (a renamed pipeline's first run comes after).
        Raises :class:`~.errors.StoreError` for a group no pipeline holds. Safe to repeat.
        """
        validate_identifier(pipeline, "pipeline id")
        key = (groups.c.cluster == cluster) & (groups.c.group_id == group_id)
        with self._tx() as conn:
            owner = conn.execute(select(groups.c.pipeline).where(key)).scalar_one_or_none()
            if owner is None:
                raise StoreError(f"no pipeline holds Kafka consumer group {group_id!r} ({cluster})")
            conn.execute(select(pipe.c.name).where(pipe.c.name == owner).with_for_update())
            owner = conn.execute(select(groups.c.pipeline).where(key).with_for_update()).scalar_one()
            if owner != pipeline:
                conn.execute(update(groups).where(key).values(pipeline=pipeline, claimed_at=self._now(conn)))
        return owner

    def consumer_groups(self, group_id: str | None = None) -> list[dict[str, Any]]:
        """The recorded consumer groups (of ``group_id`` only, on every cluster): ``[{"cluster",
        "group_id", "pipeline", "claimed_at"}]`` ordered by group and cluster."""
        query = select(groups).order_by(groups.c.group_id, groups.c.cluster)
        if group_id is not None:
            query = query.where(groups.c.group_id == group_id)
        with self.engine.connect() as conn:
            return [dict(row) for row in conn.execute(query).mappings()]

    @retrying
    def claim_consumer_group(self, cluster: str, group_id: str, pipeline: str) -> str:
        """Record that consumer group ``group_id`` of Kafka cluster ``cluster`` belongs to
        ``pipeline``, unless it already does; return the pipeline it belongs to.

        Raises :class:`~.errors.ConsumerGroupOwnedError` naming both pipelines and the group
        when another pipeline claimed it first. Race-safe: the row's primary key
        ``(cluster, group_id)`` lets one of two pipelines claiming at once insert it; the other
        reads the winner back and is refused. Safe to repeat (the owner claiming again changes
        nothing).
        """
        key = (groups.c.cluster == cluster) & (groups.c.group_id == group_id)
        with self.engine.connect() as conn:
            owner = conn.execute(select(groups.c.pipeline).where(key)).scalar_one_or_none()
        if owner is None:
            try:
                with self._tx() as conn:
                    conn.execute(
                        groups.insert().values(
                            cluster=cluster, group_id=group_id, pipeline=pipeline, claimed_at=self._now(conn)
                        )
                    )
                return pipeline
            except IntegrityError:
                with self.engine.connect() as conn:  # another pipeline won the race: read who
                    owner = conn.execute(select(groups.c.pipeline).where(key)).scalar_one()
        if owner != pipeline:
            raise ConsumerGroupOwnedError(
                f"Kafka consumer group {group_id!r} ({cluster}) belongs to pipeline {owner!r}; pipeline "
                f"{pipeline!r} names it too, and its commits would move {owner!r}'s group offsets (lag "
                f"tools would show either pipeline's progress). Give pipeline {pipeline!r} its own group_id"
            )
        return owner

    def consumer_group_owner(self, cluster: str, group_id: str) -> str | None:
        """The pipeline consumer group ``group_id`` of ``cluster`` belongs to, or ``None``."""
        with self.engine.connect() as conn:
            return conn.execute(
                select(groups.c.pipeline).where(groups.c.cluster == cluster, groups.c.group_id == group_id)
            ).scalar_one_or_none()

    def newest_committed_source_plan(self, pipeline: str) -> dict[str, Any] | None:
        """The source plan recorded on the pipeline's newest COMMITTED checkpoint (what the
        last committed checkpoint read), or ``None``."""
        with self.engine.connect() as conn:
            return newest_committed_json(conn, pipeline, ckpt.c.source_plan)

    @retrying
    def fix_source_plan(
        self,
        pipeline: str,
        checkpoint_key: str,
        plan: Mapping[str, Any],
        *,
        actor: Actor,
        detail: str,
        replace: bool = False,
    ) -> dict[str, Any]:
        """Record ``plan`` unless the row holds one for this version with the same ``start``;
        return the plan that holds (the recorded one wins, unless ``replace``).

        ``plan`` is JSON-able and has a ``start`` key. ``replace=True`` records ``plan``
        over a matching one (a retry that found a larger accepted gap). A history row with
        ``detail`` is written when something is recorded. Raises
        :class:`~.errors.CheckpointNotFoundError`. Safe to repeat.
        """
        with self._tx() as conn:
            row = self._lock(conn, pipeline, checkpoint_key)
            recorded = json.loads(row["source_plan"]) if row["source_plan"] else None
            if (
                recorded is not None
                and recorded.get("version") == row["version"]
                and _same(recorded.get("start"), plan.get("start"))
            ):
                if not replace or _same({**recorded, "version": None}, {**plan, "version": None}):
                    return recorded
            value = {**plan, "version": row["version"]}
            conn.execute(
                update(ckpt)
                .where(ckpt.c.id == row["id"])
                .values(source_plan=json.dumps(value, sort_keys=True), updated_at=row["_now"])
            )
            self._event(conn, row, actor, detail)
            return value

    def source_plan(self, pipeline: str, checkpoint_key: str) -> dict[str, Any] | None:
        """The plan recorded on the checkpoint (any version), or ``None``."""
        with self.engine.connect() as conn:
            text = conn.execute(
                select(ckpt.c.source_plan).where(
                    ckpt.c.pipeline == pipeline, ckpt.c.checkpoint_key == checkpoint_key
                )
            ).scalar_one_or_none()
        return json.loads(text) if text else None
