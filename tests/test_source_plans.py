"""The committer table's source plans (issue 28): fixed once per checkpoint version, reused by retries."""

from __future__ import annotations

from airflow_provider_walsink.core.store import CommitterStore
from tests.helpers import ACTOR

START = {"events": {"0": 5}}


def _plan(end: int, start=START) -> dict:
    return {"start": start, "end": {"events": {"0": end}}, "read_from": start, "gaps": []}


def test_the_first_plan_of_a_version_wins_and_is_in_the_history(store: CommitterStore):
    store.register("p", "k", mode="append", actor=ACTOR)
    assert store.source_plan("p", "k") is None
    first = store.fix_source_plan("p", "k", _plan(9), actor=ACTOR, detail="fixed by the first attempt")
    assert first == {**_plan(9), "version": 1}
    # A retry that planned later (the log grew) gets the recorded plan back, unchanged.
    assert store.fix_source_plan("p", "k", _plan(12), actor=ACTOR, detail="again") == first
    assert store.source_plan("p", "k") == first
    # A plan from another start (the committed offsets moved: an earlier checkpoint was aborted) replaces it.
    other = store.fix_source_plan("p", "k", _plan(12, {"events": {"0": 7}}), actor=ACTOR, detail="moved")
    assert other["end"] == {"events": {"0": 12}} and store.source_plan("p", "k") == other
    # replace=True (a retry that found a larger accepted gap) records over a matching plan.
    gap = {
        **_plan(12, {"events": {"0": 7}}),
        "gaps": [{"topic": "events", "partition": 0, "start": 7, "end": 8}],
    }
    assert (
        store.fix_source_plan("p", "k", gap, actor=ACTOR, detail="gap", replace=True)["gaps"] == gap["gaps"]
    )
    details = [h.detail for h in store.history("p", "k")]
    assert details.count("fixed by the first attempt") == 1 and "again" not in details
    assert "moved" in details and "gap" in details
    assert store.require("p", "k").state.value == "REGISTERED"  # a plan changes no state


def test_the_write_tasks_plan_records_an_accepted_gap_and_refuses_an_unaccepted_one(store: CommitterStore):
    """FAULT INJECTED at the planner's cluster boundary (retention; the mock cluster cannot delete
    records): the write task's planning (``core.sources.kafka.plan_attempt``) against the real store."""
    import pytest

    from airflow_provider_walsink.core.sources.kafka import KafkaSourceSpec, RetentionGapError, plan_attempt

    class Retention:
        def partitions(self, topic):
            return [0]

        def watermarks(self, topic, partition):
            return 6, 10  # offsets below 6 were deleted

    store.register("p", "k", mode="append", actor=ACTOR)
    record = store.require("p", "k")
    with pytest.raises(RetentionGapError, match=r"topic 'events' partition 0: offsets \[5, 6\)"):
        plan_attempt(store, record, KafkaSourceSpec(topics=["events"]), {}, start_offsets=START,
                     until_offsets=None, actor=ACTOR, meta=Retention())  # fmt: skip
    assert store.source_plan("p", "k") is None  # refused before anything was recorded
    spec = KafkaSourceSpec(topics=["events"], accept_data_loss=True)
    start, until, extra = plan_attempt(store, record, spec, {}, start_offsets=START, until_offsets=None,
                                       actor=ACTOR, meta=Retention())  # fmt: skip
    assert (start, until) == (START, {"events": {"0": 10}})
    assert extra["kafka"]["plan"]["read_from"] == {"events": {"0": 6}}
    assert store.source_plan("p", "k")["gaps"] == [{"topic": "events", "partition": 0, "start": 5, "end": 6}]
    (detail,) = [h.detail for h in store.history("p", "k") if h.detail and "DATA LOSS" in h.detail]
    assert "DATA LOSS accepted: topic 'events' partition 0: offsets [5, 6) (1 records)" in detail
