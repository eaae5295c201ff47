"""The write task's plan: checked against the cluster before anything is recorded, recorded
once on the checkpoint's row, and reused by every retry (docs/kafka.md, "The offset rule").
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from airflow_provider_walsink.core.sources.kafka.cluster import ConsumerMetadata, KafkaMetadata
from airflow_provider_walsink.core.sources.kafka.planning import OffsetPlan, plan_offsets, plan_summary
from airflow_provider_walsink.core.sources.kafka.spec import PLAN_KEY, KafkaSourceSpec

if TYPE_CHECKING:
    from airflow_provider_walsink.core.store.store import Actor, CheckpointRecord


log = logging.getLogger(__package__)  # the package's logger, as before the split


def as_spec(source: KafkaSourceSpec | Mapping[str, Any]) -> KafkaSourceSpec:
    return source if isinstance(source, KafkaSourceSpec) else KafkaSourceSpec.from_dict(source)


class OffsetPlanner:
    """Plans of one write task, each asked of the cluster once (:func:`plan_offsets`, memoized).

    The write task checks its checkpoint's ranges *before* it records anything
    (:func:`check_before_recording`) and records the same plan afterwards
    (:func:`plan_attempt`): the memo makes both the same plan, with no window
    between them in which the log could move. The cluster connection opens on
    the first plan not in the memo; :meth:`close` closes it and keeps the memo.
    """

    def __init__(self, config: Mapping[str, Any], meta: KafkaMetadata | None = None) -> None:
        self.config = dict(config)
        self._meta = meta
        self._owned: ConsumerMetadata | None = None
        self._plans: dict[str, OffsetPlan] = {}

    @property
    def meta(self) -> KafkaMetadata:
        if self._meta is None:
            self._owned = ConsumerMetadata(self.config)
            self._meta = self._owned
        return self._meta

    def plan(
        self,
        spec: KafkaSourceSpec,
        *,
        start: Mapping[str, Any] | None,
        end: Mapping[str, Any] | None = None,
        read_ids: Mapping[str, str] | None = None,
    ) -> OffsetPlan:
        """:func:`plan_offsets` of these arguments (the memoized plan when asked before)."""
        memo = json.dumps([spec.to_dict(), start, end, read_ids], sort_keys=True)
        if memo not in self._plans:
            self._plans[memo] = plan_offsets(self.meta, spec, start=start, end=end, read_ids=read_ids)
        return self._plans[memo]

    def close(self) -> None:
        """Close the connection this planner opened (an injected ``meta`` is the caller's)."""
        if self._owned is not None:
            self._owned.close()
            self._owned = None
            self._meta = None


def check_before_recording(
    store: Any,
    pipeline: str,
    existing: CheckpointRecord | None,
    spec: KafkaSourceSpec,
    planner: OffsetPlanner,
    *,
    start_offsets: Mapping[str, Any] | None,
    until_offsets: Mapping[str, Any] | None,
) -> OffsetPlan:
    """Plan the next attempt of ``existing`` (``None``: a checkpoint not registered yet) as
    :func:`plan_attempt` will, recording nothing: a refusal (missing topic or partition,
    offsets gone backwards, a retention gap not accepted) is raised while the committer
    table is unchanged. Raises what :func:`plan_offsets` raises.
    """
    version = existing.version if existing is not None else 1
    key = existing.checkpoint_key if existing is not None else None
    plan, _ = _planned(
        store, pipeline, key, version, spec, planner, start_offsets=start_offsets, until_offsets=until_offsets
    )
    return plan


def _planned(
    store: Any,
    pipeline: str,
    checkpoint_key: str | None,
    version: int,
    spec: KafkaSourceSpec,
    planner: OffsetPlanner,
    *,
    start_offsets: Mapping[str, Any] | None,
    until_offsets: Mapping[str, Any] | None,
) -> tuple[OffsetPlan, str]:
    """The plan and how it is to be recorded: ``reprocess`` (only its gaps), ``fixed`` (the
    recorded plan, re-checked against the log) or ``new`` (recorded unless one is already).

    Topic ids are checked against what was read: a reprocess against the version it replaces
    (its plan is still on the row), a retry against its recorded plan, a new plan against the
    pipeline's last committed checkpoint's plan."""
    recorded = store.source_plan(pipeline, checkpoint_key) if checkpoint_key is not None else None
    if until_offsets is not None:
        read_ids = (recorded or {}).get("topic_ids")
        return planner.plan(spec, start=start_offsets, end=until_offsets, read_ids=read_ids), "reprocess"
    if (
        recorded is not None
        and recorded.get("version") == version
        and (start_offsets is None or _same(recorded.get("start"), start_offsets))
    ):
        fixed = OffsetPlan.from_dict(recorded)
        # Re-checked against the log now (retention may have moved on), never re-planned.
        plan = planner.plan(spec, start=fixed.start, end=fixed.end, read_ids=fixed.topic_ids)
        ids = {**plan.topic_ids, **fixed.topic_ids}
        known = set(fixed.gaps)
        if set(plan.gaps) - known:
            gaps = tuple(sorted(known | set(plan.gaps), key=_gap_key))
            return OffsetPlan(plan.start, plan.end, plan.read_from, gaps, ids), "fixed"
        return OffsetPlan(fixed.start, fixed.end, fixed.read_from, fixed.gaps, ids), "fixed"
    committed = store.newest_committed_source_plan(pipeline)
    return planner.plan(spec, start=start_offsets, read_ids=(committed or {}).get("topic_ids")), "new"


def plan_attempt(
    store: Any,
    record: CheckpointRecord,
    spec: KafkaSourceSpec,
    config: Mapping[str, Any],
    *,
    start_offsets: Mapping[str, Any] | None,
    until_offsets: Mapping[str, Any] | None,
    actor: Actor,
    meta: KafkaMetadata | None = None,
    planner: OffsetPlanner | None = None,
) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    """The write task's plan of the next attempt: ``(start_offsets, until_offsets, extra)``.

    * a reprocess (``until_offsets`` given) re-reads ``[its start, until)``;
    * otherwise the plan recorded on the checkpoint wins when it starts at ``start_offsets``
      (a retried write reads the same records); else the ranges are planned now (end: the high
      watermarks; a first checkpoint's start: ``spec.starting``) and recorded.

    ``planner`` (the one :func:`check_before_recording` used) gives back the plan it checked.
    An accepted retention gap is recorded as a history row naming it (``walsink status``
    and the UI show it). Raises the :mod:`~airflow_provider_walsink.core.sources.kafka` errors
    (missing topic, retention gap, offsets gone backwards) before anything is recorded.
    """
    planner = planner or OffsetPlanner(config, meta)
    try:
        plan, how = _planned(
            store,
            record.pipeline,
            record.checkpoint_key,
            record.version,
            spec,
            planner,
            start_offsets=start_offsets,
            until_offsets=until_offsets,
        )
        if how == "reprocess":
            _record_gaps(store, record, plan, actor)
        elif how == "fixed":
            _store_plan(store, record, plan, actor, replace=True, why="a retry keeps the end fixed before")
        else:
            held = _store_plan(store, record, plan, actor, replace=False, why="fixed by the first attempt")
            plan = OffsetPlan.from_dict(held)
    finally:
        planner.close()
    log.info("Kafka source of %s/%s: %s", record.pipeline, record.checkpoint_key, plan_summary(plan))
    extra = {PLAN_KEY: {"spec": spec.to_dict(), "plan": plan.to_dict()}}
    return plan.start, plan.end, extra


def _gap_key(gap: Any) -> tuple[str, int, int]:
    return gap.topic, gap.partition, gap.start


def _same(a: Any, b: Any) -> bool:
    return json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)


def _store_plan(
    store: Any, record: CheckpointRecord, plan: OffsetPlan, actor: Actor, *, replace: bool, why: str
) -> dict[str, Any]:
    detail = f"Kafka source ranges {why}: {plan_summary(plan)}"
    return store.fix_source_plan(
        record.pipeline, record.checkpoint_key, plan.to_dict(), actor=actor, detail=detail, replace=replace
    )


def _record_gaps(store: Any, record: CheckpointRecord, plan: OffsetPlan, actor: Actor) -> None:
    if plan.gaps:
        store.record_event(
            record.pipeline,
            record.checkpoint_key,
            actor=actor,
            detail="DATA LOSS accepted (accept_data_loss): " + "; ".join(g.describe() for g in plan.gaps),
        )
