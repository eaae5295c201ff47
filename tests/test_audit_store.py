"""The audit gate in the committer store: AUDITED / REJECTED on SQLite, PostgreSQL and MariaDB."""

from __future__ import annotations

import json
from datetime import timedelta

import pytest

from airflow_provider_walsink.core.protocol import CheckpointState as S
from airflow_provider_walsink.core.protocol.states import TRANSITIONS
from airflow_provider_walsink.core.store import (
    AuditRejectedError,
    NotAuditedError,
    StaleAttemptError,
    TransitionError,
)
from tests.test_store import TTL, A, seal, to_durable

DETAIL = json.dumps({"audit": {"attempt_id": "x", "checks": []}})
REASON = "not_null(user_id): 3 of 1,000 rows are NULL"


def changes(store, key, p="p"):
    return [(h.from_state, h.to_state) for h in store.history(p, key) if h.from_state != h.to_state]


def test_the_state_machine_table_has_the_audit_gate():
    assert {S.AUDITED, S.REJECTED} <= TRANSITIONS[S.DURABLE]
    assert TRANSITIONS[S.AUDITED] == {S.WRITING, S.COMMITTING, S.FAILED, S.ABORTED}
    # Never COMMITTING; AUDITED only by a person's approval (tests/test_audit_approval.py).
    assert TRANSITIONS[S.REJECTED] == {S.WRITING, S.ABORTED, S.AUDITED}
    assert S.REJECTED not in TRANSITIONS[S.AUDITED]


def test_audited_is_recorded_once_with_who_and_the_results(store):
    durable = to_durable(store, "k")
    done = store.mark_audited("p", "k", attempt_id=durable.sealed_attempt_id, actor=A, detail=DETAIL)
    assert done.state is S.AUDITED and done.error is None
    again = store.mark_audited("p", "k", attempt_id=durable.sealed_attempt_id, actor=A, detail=DETAIL)
    assert again.state is S.AUDITED
    audited = [h for h in store.history("p", "k") if h.to_state == "AUDITED"]
    assert len(audited) == 1  # the repeat added nothing
    h = audited[0]
    assert (h.from_state, h.actor, h.dag_id, h.run_id, h.task_id, h.try_number) == (
        "DURABLE", "tester", "d", "r", "t", 2
    )  # fmt: skip
    assert json.loads(h.detail) == json.loads(DETAIL)
    # A durability check repeated on an AUDITED checkpoint changes nothing.
    assert store.mark_durable("p", "k", attempt=durable.sealed_attempt, actor=A).state is S.AUDITED


def test_rejected_keeps_the_reason_and_is_never_committed(store):
    durable = to_durable(store, "k")
    done = store.reject("p", "k", attempt_id=durable.sealed_attempt_id, reason=REASON, actor=A, detail=DETAIL)
    assert done.state is S.REJECTED and done.error == REASON
    assert (
        store.reject("p", "k", attempt_id=durable.sealed_attempt_id, reason=REASON, actor=A).state
        is S.REJECTED
    )
    assert changes(store, "k")[-1] == ("DURABLE", "REJECTED")
    assert [h.to_state for h in store.history("p", "k")].count("REJECTED") == 1
    for mode in (None, "overwrite"):  # the general path and (on PostgreSQL) the one-statement path
        with pytest.raises(
            AuditRejectedError, match=r"REJECTED by its audit.*not_null\(user_id\): 3 of 1,000"
        ):
            store.acquire_lease("p", "k", owner="c", ttl=TTL, actor=A, mode=mode)
    with pytest.raises(TransitionError):
        store.mark_audited("p", "k", attempt_id=durable.sealed_attempt_id, actor=A)
    assert store.require("p", "k").state is S.REJECTED
    # A fixed job writes a new attempt: REJECTED -> WRITING, the reason cleared.
    fresh = store.start_attempt("p", "k", actor=A)
    assert fresh.state is S.WRITING and fresh.error is None and fresh.attempt == durable.attempt + 1


def test_a_rejected_checkpoint_can_be_aborted(store):
    durable = to_durable(store, "k")
    store.reject("p", "k", attempt_id=durable.sealed_attempt_id, reason=REASON, actor=A)
    assert store.abort("p", "k", reason="bad source, INC-1", actor=A).state is S.ABORTED


def test_a_stale_audit_never_judges_a_newer_attempt(store):
    old = to_durable(store, "k")
    newer = store.start_attempt("p", "k", actor=A)  # a cleared write task started attempt 2
    for verdict in (
        lambda: store.reject("p", "k", attempt_id=old.sealed_attempt_id, reason=REASON, actor=A),
        lambda: store.mark_audited("p", "k", attempt_id=old.sealed_attempt_id, actor=A),
    ):
        with pytest.raises(StaleAttemptError, match=f"audit of attempt {old.sealed_attempt_id}.*is stale"):
            verdict()
    assert store.require("p", "k").state is S.WRITING
    # Attempt 2 sealed and durable: the old audit still cannot judge it.
    seal(store, "k", newer.attempt)
    store.mark_durable("p", "k", attempt=newer.attempt, actor=A)
    with pytest.raises(StaleAttemptError):
        store.reject("p", "k", attempt_id=old.sealed_attempt_id, reason=REASON, actor=A)
    record = store.require("p", "k")
    assert record.state is S.DURABLE and record.error is None
    assert "REJECTED" not in [h.to_state for h in store.history("p", "k")]


def test_only_a_durable_checkpoint_is_audited(store):
    store.register("p", "k", mode="overwrite", actor=A)
    rec = store.start_attempt("p", "k", actor=A)
    seal(store, "k", rec.attempt)
    sealed = store.require("p", "k")
    with pytest.raises(TransitionError, match="SEALED; it cannot move to AUDITED"):
        store.mark_audited("p", "k", attempt_id=sealed.sealed_attempt_id, actor=A)
    with pytest.raises(TransitionError, match="SEALED; it cannot move to REJECTED"):
        store.reject("p", "k", attempt_id=sealed.sealed_attempt_id, reason=REASON, actor=A)


@pytest.mark.parametrize("mode", [None, "overwrite"])
def test_require_audit_refuses_an_unaudited_attempt(store, mode):
    durable = to_durable(store, "k")
    with pytest.raises(NotAuditedError, match="has not passed the pipeline's audit"):
        store.acquire_lease("p", "k", owner="c", ttl=TTL, actor=A, mode=mode, require_audit=True)
    assert store.require("p", "k").state is S.DURABLE
    store.mark_audited("p", "k", attempt_id=durable.sealed_attempt_id, actor=A)
    lease = store.acquire_lease("p", "k", owner="c", ttl=TTL, actor=A, mode=mode, require_audit=True)
    assert store.mark_committed(lease, actor=A).state is S.COMMITTED
    assert changes(store, "k")[-3:] == [
        ("DURABLE", "AUDITED"),
        ("AUDITED", "COMMITTING"),
        ("COMMITTING", "COMMITTED"),
    ]


@pytest.mark.parametrize("mode", [None, "overwrite"])
def test_a_failed_commit_of_an_audited_attempt_is_retried_without_a_new_audit(store, mode):
    durable = to_durable(store, "k")
    store.mark_audited("p", "k", attempt_id=durable.sealed_attempt_id, actor=A)
    lease = store.acquire_lease("p", "k", owner="c1", ttl=TTL, actor=A, mode=mode, require_audit=True)
    store.fail("p", "k", error="ENOSPC", actor=A, lease=lease)
    assert store.require("p", "k").state is S.FAILED
    # Re-running the audit task now changes nothing: its verdict on this attempt stands.
    before = len(store.history("p", "k"))
    again = store.mark_audited("p", "k", attempt_id=durable.sealed_attempt_id, actor=A)
    assert again.state is S.FAILED and len(store.history("p", "k")) == before
    # The verdict is in the history, so the retried commit may take the lease.
    store.acquire_lease("p", "k", owner="c2", ttl=TTL, actor=A, mode=mode, require_audit=True)
    assert store.require("p", "k").state is S.COMMITTING
    assert changes(store, "k")[-2:] == [("COMMITTING", "FAILED"), ("FAILED", "COMMITTING")]


def test_a_new_attempt_voids_the_earlier_verdict(store):
    first = to_durable(store, "k")
    store.mark_audited("p", "k", attempt_id=first.sealed_attempt_id, actor=A)
    second = store.start_attempt("p", "k", actor=A)  # AUDITED -> WRITING
    seal(store, "k", second.attempt)
    store.mark_durable("p", "k", attempt=second.attempt, actor=A)
    lease_ttl = timedelta(minutes=1)
    with pytest.raises(NotAuditedError):
        store.acquire_lease("p", "k", owner="c", ttl=lease_ttl, actor=A, require_audit=True)
    # Without an audit requirement the durable attempt commits as before.
    assert store.acquire_lease("p", "k", owner="c", ttl=lease_ttl, actor=A).epoch > 0
