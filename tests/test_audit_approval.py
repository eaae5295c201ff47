"""A person's approval of a REJECTED checkpoint (issue 37): the store's REJECTED -> AUDITED
transition on SQLite, PostgreSQL and MariaDB, and the pipeline refusing an approval step without
an audit when the DAG is parsed. The approval through Airflow's HITL step, end to end, is
``tests/test_e2e_audit_approval.py``."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from airflow_provider_walsink.core.protocol import CheckpointState as S
from airflow_provider_walsink.core.store import StaleAttemptError, TransitionError
from tests.test_store import TTL, A, to_durable

REASON = "not_null(user_id): 3 of 1,000 rows are NULL"
WHY = "known test accounts; signed off in TICKET-4711"


def _rejected(store, key="k"):
    durable = to_durable(store, key)
    return store.reject("p", key, attempt_id=durable.sealed_attempt_id, reason=REASON, actor=A)


@pytest.mark.parametrize("mode", [None, "overwrite"])  # the general lease take and the one-statement path
def test_an_approval_makes_the_rejected_attempt_committable_and_names_who_and_why(store, mode):
    rejected = _rejected(store)
    with pytest.raises(ValueError, match="needs who approves it and a reason"):
        store.approve_rejected(
            "p", "k", attempt_id=rejected.sealed_attempt_id, approver="ann", reason=" ", actor=A
        )
    # An audit never overturns a rejection; only the approval does.
    with pytest.raises(TransitionError, match="only an approval"):
        store.mark_audited("p", "k", attempt_id=rejected.sealed_attempt_id, actor=A)
    done = store.approve_rejected(
        "p", "k", attempt_id=rejected.sealed_attempt_id, approver="ann (id 7)", reason=WHY, actor=A
    )
    assert done.state is S.AUDITED and done.error is None
    again = store.approve_rejected(
        "p", "k", attempt_id=rejected.sealed_attempt_id, approver="bob", reason="again", actor=A
    )
    assert again.state is S.AUDITED
    [row] = [h for h in store.history("p", "k") if (h.from_state, h.to_state) == ("REJECTED", "AUDITED")]
    assert row.detail == f"approved by ann (id 7): {WHY} (published despite the audit: {REASON})"
    assert (row.actor, row.task_id) == (A.name, A.task_id)
    # The commit's lease take (with require_audit, as an audited pipeline's commit) accepts it now.
    store.acquire_lease("p", "k", owner="c", ttl=TTL, actor=A, mode=mode, require_audit=True)
    assert store.require("p", "k").state is S.COMMITTING


def test_an_approval_or_abort_of_another_attempt_or_state_changes_nothing(store):
    rejected = _rejected(store)
    fresh = store.start_attempt("p", "k", actor=A)  # the interval was written again meanwhile
    with pytest.raises(StaleAttemptError, match="is stale"):
        store.approve_rejected(
            "p", "k", attempt_id=rejected.sealed_attempt_id, approver="ann", reason=WHY, actor=A
        )
    assert store.require("p", "k") == fresh
    # A person's Abort holds for the attempt shown too (issue 49): neither step of the abort ends
    # the newer attempt, and nothing is recorded.
    history = len(store.history("p", "k"))
    with pytest.raises(StaleAttemptError, match="is stale"):
        store.begin_abort("p", "k", actor=A, reason=WHY, ttl=TTL, attempt_id=rejected.sealed_attempt_id)
    with pytest.raises(StaleAttemptError, match="is stale"):
        store.abort("p", "k", actor=A, reason=WHY, attempt_id=rejected.sealed_attempt_id)
    assert store.require("p", "k") == fresh and len(store.history("p", "k")) == history
    durable = to_durable(store, "d")
    with pytest.raises(TransitionError, match="only a REJECTED checkpoint can be approved"):
        store.approve_rejected(
            "p", "d", attempt_id=durable.sealed_attempt_id, approver="ann", reason=WHY, actor=A
        )


def test_a_hitl_step_without_an_audit_is_refused_when_the_dag_is_parsed():
    from airflow.sdk import DAG

    from airflow_provider_walsink.operators.pipeline import walsink_pipeline

    with pytest.raises(ValueError, match=r"'p': audit_approval needs an audit \(audit=\[\.\.\.\]\)"):
        with DAG("walsink_bad_approval", schedule=None, start_date=datetime(2026, 1, 1, tzinfo=UTC)):
            walsink_pipeline("p", pipeline="p", application="job.py", target="/t", audit_approval=True)
    # Publishing a rejected checkpoint is never a response timeout's default.
    with pytest.raises(ValueError, match="only 'Abort' may be taken without a person's answer"):
        with DAG("walsink_bad_default", schedule=None, start_date=datetime(2026, 1, 1, tzinfo=UTC)):
            walsink_pipeline(
                "p",
                pipeline="p",
                application="job.py",
                target="/t",
                audit=[lambda staged: True],
                audit_approval={"defaults": ["Publish anyway"]},
            )
    # Without the option the gate is as before: no approval task, the audit fails on a rejection.
    with DAG("walsink_plain_audit", schedule=None, start_date=datetime(2026, 1, 1, tzinfo=UTC)) as plain:
        walsink_pipeline("p", pipeline="p", application="job.py", target="/t", audit=[lambda staged: True])
    assert "p.approval" not in plain.task_dict and plain.get_task("p.audit").fail_on_reject
    assert plain.get_task("p.commit").trigger_rule == "all_success"
