"""The committer table's source plans (issue 28): fixed once per checkpoint version, reused by retries."""

from __future__ import annotations

from airflow_provider_walsink.committer import CommitterStore
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
