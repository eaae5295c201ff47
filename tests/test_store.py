"""The committer store's life cycle, on SQLite, PostgreSQL and MariaDB."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest

from airflow_provider_walsink.core.protocol import CheckpointState as S
from airflow_provider_walsink.core.protocol import InvalidIdentifierError
from airflow_provider_walsink.core.store import (
    Actor,
    CommitterStore,
    LeaseHeldError,
    LeaseLostError,
    OrderingError,
    StaleAttemptError,
    TransitionError,
)
from airflow_provider_walsink.core.store.store import utcnow

A = Actor(name="tester", dag_id="d", run_id="r", task_id="t", try_number=2)
TTL = timedelta(minutes=5)


def seal(store, key, attempt, *, p="p", end=None, start=None):
    return store.seal(
        p,
        key,
        attempt=attempt,
        manifest_uri=f"file:///m/{key}/{attempt}",
        manifest_digest=f"sha256:{attempt:064x}",
        committables=2,
        rows=10,
        bytes=100,
        start_offsets=start,
        end_offsets=end,
        actor=A,
    )


def to_durable(store, key, *, p="p", mode="overwrite", start=None, end=None):
    store.register(p, key, mode=mode, actor=A)
    rec = store.start_attempt(p, key, actor=A)
    seal(store, key, rec.attempt, p=p, start=start, end=end)
    return store.mark_durable(p, key, attempt=rec.attempt, actor=A)


def test_register_is_idempotent_and_sequences_are_monotonic(store):
    first = store.register("p", "k1", mode="overwrite", actor=A)
    again = store.register("p", "k1", mode="overwrite", actor=A)
    second = store.register("p", "k2", mode="overwrite", actor=A)
    other = store.register("q", "k1", mode="append", actor=A)
    assert first.id == again.id and first.state is S.REGISTERED
    assert (first.sequence, second.sequence, other.sequence) == (1, 2, 1)
    assert first.dag_id == "d" and first.run_id == "r"


def test_pipelines_and_keys_differing_only_in_case_are_different_rows(store):
    """The committer table compares its identifiers exactly on every backend (binary collation on
    MySQL/MariaDB, which would otherwise take ``Sales`` for ``sales``)."""
    upper = store.register("Sales", "K1", mode="append", actor=A)
    lower = store.register("sales", "K1", mode="overwrite", actor=A)
    lower_key = store.register("sales", "k1", mode="overwrite", actor=A)
    assert len({upper.id, lower.id, lower_key.id}) == 3
    assert (upper.sequence, lower.sequence, lower_key.sequence) == (1, 1, 2)


def test_the_rows_of_many_checkpoints_are_read_together(store):
    """What the triggers' watch reads (``triggers/watch.py``): state, attempt and sealed attempt
    of each registered key; unregistered, differently cased and invalid keys are left out."""
    keys = [("p", f"k{i:04d}") for i in range(8)]
    for p, k in keys:
        store.register(p, k, mode="overwrite", actor=A)
    to_durable(store, "sealed")
    writing = store.start_attempt("p", "k0001", actor=A)
    states = store.checkpoint_states([*keys, ("p", "sealed"), ("p", "nope"), ("P", "K0002"), ("p", "a b")])
    assert set(states) == {*keys, ("p", "sealed")}
    assert states[("p", "k0000")] == ("REGISTERED", 0, None)
    assert states[("p", "k0001")] == ("WRITING", writing.attempt, None)
    assert states[("p", "sealed")] == ("DURABLE", 1, 1)


def test_register_refuses_a_mode_change_and_bad_identifiers(store):
    store.register("p", "k1", mode="overwrite", actor=A)
    with pytest.raises(Exception, match="overwrite mode, not append"):
        store.register("p", "k2", mode="append", actor=A)
    with pytest.raises(InvalidIdentifierError):
        store.register("p'; DROP TABLE walsink_checkpoint; --", "k", mode="append", actor=A)


def test_a_pipeline_id_belongs_to_the_dag_that_registered_it(store):
    """A second DAG declaring the pipeline is refused, naming both, for a new key and for a key
    the first DAG registered; a script (no DAG) may still write; a renamed DAG takes it over."""
    from airflow_provider_walsink.core.store.errors import PipelineOwnedError

    dag_a, dag_b = (Actor(name="w", dag_id=d, run_id="r", task_id="write", try_number=1) for d in ("a", "b"))
    store.register("p", "k1", mode="overwrite", actor=dag_a)
    for key in ("k1", "k2"):
        with pytest.raises(
            PipelineOwnedError, match=r"belongs to DAG 'a'; DAG 'b' declares it too"
        ) as refused:
            store.register("p", key, mode="overwrite", actor=dag_b)
        assert "walsink reassign p --dag b" in str(refused.value)
    assert [r.checkpoint_key for r in store.checkpoints("p")] == ["k1"]  # nothing recorded for b
    store.register("p", "k3", mode="overwrite", actor=Actor(name="notebook"))
    assert store.reassign_pipeline("p", "b") == "a"
    assert store.register("p", "k4", mode="overwrite", actor=dag_b).dag_id == "b"
    with pytest.raises(PipelineOwnedError, match="belongs to DAG 'b'; DAG 'a'"):
        store.register("p", "k5", mode="overwrite", actor=dag_a)
    # A pipeline first registered from a script is owned by the first DAG that writes it.
    store.register("q", "k1", mode="overwrite", actor=Actor(name="notebook"))
    store.register("q", "k2", mode="overwrite", actor=dag_a)
    with pytest.raises(PipelineOwnedError):
        store.register("q", "k3", mode="overwrite", actor=dag_b)


def test_full_life_cycle_records_every_transition_with_who(store):
    to_durable(store, "k", end={"offset": 7})
    lease = store.acquire_lease("p", "k", owner="c1", ttl=TTL, actor=A)
    done = store.mark_committed(lease, actor=A)
    assert done.state is S.COMMITTED and done.committed_at is not None and done.lease_owner is None
    assert store.is_committed("p", "k")
    history = store.history("p", "k")
    assert [(h.from_state, h.to_state) for h in history] == [
        (None, "REGISTERED"),
        ("REGISTERED", "WRITING"),
        ("WRITING", "SEALED"),
        ("SEALED", "DURABLE"),
        ("DURABLE", "COMMITTING"),
        ("COMMITTING", "COMMITTED"),
    ]
    assert all(
        (h.dag_id, h.run_id, h.task_id, h.try_number, h.actor) == ("d", "r", "t", 2, "tester")
        for h in history
    )
    assert all(h.at is not None for h in history)
    assert store.last_committed_offsets("p") == {"offset": 7}


def test_only_the_newest_attempt_can_seal(store):
    store.register("p", "k", mode="overwrite", actor=A)
    first = store.start_attempt("p", "k", actor=A)
    second = store.start_attempt("p", "k", actor=A)
    assert second.attempt == first.attempt + 1
    with pytest.raises(StaleAttemptError, match="only the newest attempt counts"):
        seal(store, "k", first.attempt)
    sealed = seal(store, "k", second.attempt)
    assert sealed.sealed_attempt == second.attempt
    assert seal(store, "k", second.attempt).state is S.SEALED  # repeated call is harmless
    with pytest.raises(StaleAttemptError):
        store.mark_durable("p", "k", attempt=first.attempt, actor=A)


def test_the_attempt_watch_cancels_a_job_once_its_attempt_is_fenced(store):
    """What the write phase runs beside its job (``core/commit/attempt_watch.py``): nothing while
    the attempt is the newest; one cancel, naming the newer attempt, once another starts."""
    import threading

    from airflow_provider_walsink.core.commit.attempt_watch import AttemptWatch

    store.register("p", "k", mode="overwrite", actor=A)
    first = store.start_attempt("p", "k", actor=A)
    cancelled = threading.Event()
    calls: list[str] = []

    def cancel() -> None:
        calls.append("cancel")
        cancelled.set()

    with AttemptWatch(store, "p", "k", first.attempt, cancel, interval=0.05) as watch:
        assert not cancelled.wait(0.3) and watch.reason is None
        store.start_attempt("p", "k", actor=A)
        assert cancelled.wait(10)
        assert not cancelled.wait(0.2) or calls == ["cancel"]
    assert calls == ["cancel"]
    assert (
        watch.reason
        == f"attempt {first.attempt + 1} of the checkpoint started since (this attempt is fenced)"
    )


def test_a_new_attempt_supersedes_a_sealed_one_but_not_a_commit(store):
    to_durable(store, "k")
    rewritten = store.start_attempt("p", "k", actor=A)
    assert rewritten.state is S.WRITING and rewritten.sealed_attempt is None
    seal(store, "k", rewritten.attempt)
    store.mark_durable("p", "k", attempt=rewritten.attempt, actor=A)
    lease = store.acquire_lease("p", "k", owner="c", ttl=TTL, actor=A)
    with pytest.raises(TransitionError, match="being committed"):
        store.start_attempt("p", "k", actor=A)
    store.mark_committed(lease, actor=A)
    with pytest.raises(TransitionError, match="already COMMITTED"):
        store.start_attempt("p", "k", actor=A)


def test_lease_is_exclusive_until_it_expires_then_taken_over(store):
    now = [utcnow()]
    clocked = CommitterStore(store.engine, clock=lambda: now[0])
    to_durable(clocked, "k")
    lease = clocked.acquire_lease("p", "k", owner="c1", ttl=TTL, actor=A)
    with pytest.raises(LeaseHeldError, match="being committed by c1"):
        clocked.acquire_lease("p", "k", owner="c2", ttl=TTL, actor=A)
    assert clocked.acquire_lease("p", "k", owner="c1", ttl=TTL, actor=A).owner == "c1"  # re-entrant
    now[0] += TTL + timedelta(seconds=1)
    taken = clocked.acquire_lease("p", "k", owner="c2", ttl=TTL, actor=A)
    assert taken.taken_over_from == "c1"
    with pytest.raises(LeaseLostError):
        clocked.renew_lease(lease, TTL)
    with pytest.raises(LeaseLostError):
        clocked.mark_committed(lease, actor=A)
    assert clocked.mark_committed(taken, actor=A).state is S.COMMITTED
    assert clocked.mark_committed(taken, actor=A).state is S.COMMITTED  # idempotent
    assert "taken over from c1" in clocked.history("p", "k")[-2].detail


def test_lease_needs_a_durable_checkpoint(store):
    store.register("p", "k", mode="overwrite", actor=A)
    rec = store.start_attempt("p", "k", actor=A)
    seal(store, "k", rec.attempt)
    with pytest.raises(TransitionError, match="not DURABLE"):
        store.acquire_lease("p", "k", owner="c", ttl=TTL, actor=A)


def test_renew_and_release(store):
    to_durable(store, "k")
    lease = store.acquire_lease("p", "k", owner="c1", ttl=TTL, actor=A)
    renewed = store.renew_lease(lease, timedelta(hours=1))
    assert renewed.expires_at > lease.expires_at
    store.release_lease(renewed)
    assert store.acquire_lease("p", "k", owner="c2", ttl=TTL, actor=A).taken_over_from is None


def test_fail_keeps_the_error_and_the_checkpoint_uncommitted(store):
    to_durable(store, "k")
    lease = store.acquire_lease("p", "k", owner="c1", ttl=TTL, actor=A)
    failed = store.fail("p", "k", error="size mismatch: part-0", actor=A, lease=lease)
    assert failed.state is S.FAILED and failed.error == "size mismatch: part-0"
    assert not store.is_committed("p", "k")
    assert store.pending("p")[0].checkpoint_key == "k"
    # Once fixed, a failed but previously durable checkpoint can be committed again.
    again = store.acquire_lease("p", "k", owner="c2", ttl=TTL, actor=A)
    assert store.mark_committed(again, actor=A).error is None


def test_errors_and_details_are_stored_and_read_as_plain_text(store):
    """Spark and library errors carry terminal colours: the row and the history keep the text only,
    and a row written before (raw SQL, no cleaning) reads back clean too."""
    from sqlalchemy import text

    coloured = "\x1b[31mAnalysisException\x1b[0m: \x1b[1mcolumn\x1b[22m `x` not found\n\tat line 3\x07"
    to_durable(store, "k")
    lease = store.acquire_lease("p", "k", owner="c1", ttl=TTL, actor=A)
    failed = store.fail("p", "k", error=coloured, actor=A, lease=lease)
    assert failed.error == "AnalysisException: column `x` not found\n\tat line 3"
    assert store.history("p", "k")[-1].detail == failed.error
    with store.engine.begin() as conn:
        conn.execute(text("UPDATE walsink_checkpoint SET error = :e"), {"e": "\x1b[33mold\x1b[0m row"})
        assert "\x1b" in conn.execute(text("SELECT error FROM walsink_checkpoint")).scalar_one()
    assert store.require("p", "k").error == "old row"


def test_abort_unblocks_later_append_checkpoints_until_a_new_attempt_starts(store):
    to_durable(store, "k1", mode="append")
    to_durable(store, "k2", mode="append")
    with pytest.raises(OrderingError, match="waits for earlier checkpoint k1"):
        store.acquire_lease("p", "k2", owner="c", ttl=TTL, actor=A)
    store.abort("p", "k1", reason="bad data upstream", actor=A)
    # The aborted attempt is never committed, and repeating its seal changes nothing.
    with pytest.raises(TransitionError, match="not DURABLE"):
        store.acquire_lease("p", "k1", owner="c", ttl=TTL, actor=A)
    assert seal(store, "k1", 1).state is S.ABORTED
    lease = store.acquire_lease("p", "k2", owner="c", ttl=TTL, actor=A)
    assert lease.owner == "c"
    store.release_lease(lease)
    # A later run starts a fresh attempt of the aborted checkpoint: it is open (and first) again.
    again = store.start_attempt("p", "k1", actor=A)
    assert again.state is S.WRITING and again.attempt == 2 and again.error is None
    with pytest.raises(OrderingError, match="waits for earlier checkpoint k1"):
        store.acquire_lease("p", "k2", owner="c", ttl=TTL, actor=A)


def test_append_offsets_must_continue_the_last_commit(store):
    to_durable(store, "k1", mode="append", start={"n": 0}, end={"n": 5})
    store.mark_committed(store.acquire_lease("p", "k1", owner="c", ttl=TTL, actor=A), actor=A)
    to_durable(store, "k2", mode="append", start={"n": 4}, end={"n": 9})
    with pytest.raises(OrderingError, match="write it again from the committed offsets"):
        store.acquire_lease("p", "k2", owner="c", ttl=TTL, actor=A)
    to_durable(store, "k3", mode="append", start={"n": 5}, end={"n": 9})
    store.abort("p", "k2", reason="stale", actor=A)
    store.mark_committed(store.acquire_lease("p", "k3", owner="c", ttl=TTL, actor=A), actor=A)
    assert store.last_committed_offsets("p") == {"n": 9}


def test_overwrite_checkpoints_commit_independently(store):
    to_durable(store, "k1")
    to_durable(store, "k2")
    lease = store.acquire_lease("p", "k2", owner="c", ttl=TTL, actor=A)
    assert store.mark_committed(lease, actor=A).is_committed
    assert [c.checkpoint_key for c in store.pending("p")] == ["k1"]


def test_keyset_pages_and_run_queries(store):
    for i in range(7):
        store.register("p", f"k{i}", mode="overwrite", actor=A)
    page1 = store.checkpoints("p", limit=3)
    page2 = store.checkpoints("p", limit=3, before_sequence=page1[-1].sequence)
    assert [c.sequence for c in page1 + page2] == [7, 6, 5, 4, 3, 2]
    assert [c.sequence for c in store.checkpoints("p", limit=2, after_sequence=5, descending=False)] == [6, 7]
    assert len(store.checkpoints("p", states=["REGISTERED"], limit=100)) == 7
    assert len(store.checkpoints_of_run("d", "r")) == 7
    assert store.pipelines()[0]["counts"] == {"REGISTERED": 7}


def test_record_event_appends_history_without_changing_state(store):
    to_durable(store, "k")
    before = store.require("p", "k")
    store.record_event("p", "k", actor=A, detail="write skipped: already DURABLE")
    assert store.require("p", "k") == before
    last = store.history("p", "k")[-1]
    assert (last.from_state, last.to_state, last.detail) == (
        "DURABLE",
        "DURABLE",
        "write skipped: already DURABLE",
    )


def _life_cycle_history(store, key):
    """Take and re-take the lease, commit, and commit again; return the history (what, who, why)."""
    to_durable(store, key)
    lease = store.acquire_lease("p", key, owner="c1", ttl=TTL, actor=A, mode="overwrite")
    lease = store.acquire_lease("p", key, owner="c1", ttl=TTL, actor=A, mode="overwrite")  # re-entrant
    done = store.mark_committed(lease, actor=A, end_offsets={"n": 3}, detail="published 2")
    again = store.mark_committed(lease, actor=A, detail="published 2")  # a lost acknowledgement
    assert done.state is again.state is S.COMMITTED and again.end_offsets == {"n": 3}
    assert done.lease_owner is None and done.committed_at is not None
    history = [
        (t.from_state, t.to_state, t.attempt, t.actor, t.dag_id, t.run_id, t.task_id, t.try_number)
        for t in store.history("p", key)
    ]
    # Tokens are clock-based (leases.next_epoch): compare that each take's token is named, not its value.
    details = [
        re.sub(r"epoch \d+", "epoch N", t.detail) if t.detail else None for t in store.history("p", key)
    ]
    epochs = [int(m) for t in store.history("p", key) for m in re.findall(r"epoch (\d+)", t.detail or "")]
    assert epochs == sorted(set(epochs)), "every lease take must raise the fencing token"
    return history, details, store.require("p", key).end_offsets


def test_one_statement_transitions_record_what_the_locking_path_records(store):
    """PostgreSQL's one-statement lease and commit leave the row and history the locking path leaves."""
    locking = CommitterStore(store.engine)
    locking._one_statement = False
    assert _life_cycle_history(store, "fast") == _life_cycle_history(locking, "locking")


def test_a_commit_is_two_statements_on_postgresql(pg_url):
    """Lease and COMMITTED are one statement each: no ping, no BEGIN, no separate history insert."""
    from sqlalchemy import event

    store = CommitterStore.from_url(pg_url, migrate=False)
    to_durable(store, "k")
    store.get("p", "k")  # the pool's connection exists (its first checkout asks for server settings)
    statements: list[str] = []
    listener = lambda *args: statements.append(args[2])  # noqa: E731 - (conn, cursor, statement, ...)
    event.listen(store.engine, "before_cursor_execute", listener)
    try:
        lease = store.acquire_lease("p", "k", owner="c", ttl=TTL, actor=A, mode="overwrite")
        store.mark_committed(lease, actor=A)
    finally:
        event.remove(store.engine, "before_cursor_execute", listener)
    assert len(statements) == 2, statements
    assert all("INSERT INTO walsink_transition" in s for s in statements)
    assert [t.to_state for t in store.history("p", "k")][-2:] == ["COMMITTING", "COMMITTED"]
    store.dispose()


def test_psycopg3_takes_the_same_two_statements_and_leaves_the_same_history(pg_url):
    """``postgresql+psycopg://`` (psycopg 3) works like psycopg2, one-statement path included."""
    from sqlalchemy import event
    from sqlalchemy.engine import make_url

    url = make_url(pg_url).set(drivername="postgresql+psycopg").render_as_string(hide_password=False)
    psycopg3 = CommitterStore.from_url(url, migrate=False)
    psycopg2 = CommitterStore.from_url(pg_url, migrate=False)
    statements: list[str] = []
    listener = lambda *args: statements.append(args[2])  # noqa: E731
    event.listen(psycopg3.engine, "before_cursor_execute", listener)
    try:
        to_durable(psycopg3, "k")
        del statements[:]
        lease = psycopg3.acquire_lease("p", "k", owner="c", ttl=TTL, actor=A, mode="overwrite")
        psycopg3.mark_committed(lease, actor=A)
        assert len(statements) == 2, statements
    finally:
        event.remove(psycopg3.engine, "before_cursor_execute", listener)
    assert _life_cycle_history(psycopg3, "v3") == _life_cycle_history(psycopg2, "v2")
    for s in (psycopg3, psycopg2):
        s.dispose()


def test_transient_errors_are_recognised_from_either_postgresql_driver():
    """Deadlocks and serialization failures are retried whether psycopg2 or psycopg 3 raised them."""
    from psycopg import errors  # a test dependency (setup.cfg [test]): no skip when missing
    from sqlalchemy.exc import IntegrityError, OperationalError

    from airflow_provider_walsink.core.store.store import is_transient

    assert is_transient(OperationalError("UPDATE", {}, errors.DeadlockDetected("deadlock detected")))
    assert is_transient(OperationalError("UPDATE", {}, errors.SerializationFailure("could not serialize")))
    assert not is_transient(IntegrityError("INSERT", {}, errors.UniqueViolation("duplicate key")))
