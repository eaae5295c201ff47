"""What people and Airflow do around a pipeline (issue 49, part A): operations :class:`~.world.World`
mixes in, drawn in the same random schedules as the others (:func:`draw`, :data:`WEIGHTED`).

* ``partition_run``: a run of a partition-keyed pipeline (docs/backfill.md, "Partitioned runs"): the
  run's partition key becomes its checkpoint key and names the one target partition it replaces
  (``PartitionSpec``, as the write operator uses it). The keys need escaping, and pairs of them
  differ only in case (``München``, ``münchen``) or in an escaped character (``a=b``, ``a%3Db``,
  ``a+3Db``). ``overwrite`` only (a partition key names the partition its checkpoint replaces).
* ``audit``: the audit task on the checkpoint's sealed attempt, passing or failing (REJECTED).
* ``decide``: a person answers the approval question about a REJECTED attempt: publish it anyway or
  abort the checkpoint, after someone aborted it meanwhile, or the interval was written (and audited)
  again meanwhile; then the commit task runs (``require_audit``, as an audited pipeline's does).
* ``deadline``: the commit-deadline callback for the checkpoint's run, once, twice in a row (a
  triggerer restart), twice at once (two triggerers), or twice at once while its commit task runs.

Invariants (:meth:`People.people_check`, after every step):

* one checkpoint per partition key: a key always names the same checkpoint, no two keys share one,
  and the checkpoint names its key back (as the UI and the CLI show it); nothing of one key is ever
  published under another (the rows of each key's committed attempt, in its own partition, and no
  other rows there);
* nothing published for an aborted or unapproved checkpoint: no COMMITTED attempt that its audit
  REJECTED and no person approved; an audited pipeline's commit publishes only an attempt that
  passed its audit or was approved;
* at most one notification per deadline, and the deadline never changes the checkpoint's state.
"""

from __future__ import annotations

import json
import threading
import uuid
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from airflow_provider_walsink.core.protocol.errors import WalsinkError

#: Partition keys, with what they must map to, written out here (not computed by the package):
#: ``key -> (checkpoint key, the Hive directory's value as the files target holds it)``.
PARTITION_KEYS = {
    "a=b": ("pk=a+3Db", "a%3Db"),
    "a%3Db": ("pk=a+253Db", "a%253Db"),
    "a+3Db": ("pk=a+2B3Db", "a+3Db"),
    "München": ("pk=M+C3+BCnchen", "München"),
    "münchen": ("pk=m+C3+BCnchen", "münchen"),
    "Q1:2026*": ("pk=Q1+3A2026+2A", "Q1%3A2026%2A"),
}
#: The operations and their weights, added to the machine's (about one draw in five).
WEIGHTED = ["partition_run"] * 4 + ["audit"] + ["decide"] * 3 + ["deadline"] * 3
OPS = frozenset(WEIGHTED)
APPROVER = "ann (id ann)"


@dataclass
class PeopleModel:
    #: Partition keys run so far and the checkpoint each named (both ways).
    key_of: dict[str, str] = field(default_factory=dict)
    pk_of: dict[str, str] = field(default_factory=dict)
    #: attempt id -> the partition key it was written for; partition key -> its visible attempt.
    attempt_pk: dict[str, str] = field(default_factory=dict)
    visible: dict[str, str] = field(default_factory=dict)
    rejected: set[str] = field(default_factory=set)
    approved: set[str] = field(default_factory=set)
    audited: set[str] = field(default_factory=set)
    #: deadline id -> notifications sent.
    notified: Counter = field(default_factory=Counter)


class People:
    """Mixed into :class:`~.world.World` (its ``cfg``, ``store``, ``model``, ``notes`` and steps)."""

    _people: PeopleModel | None = None

    @property
    def people(self) -> PeopleModel:
        if self._people is None:
            self._people = PeopleModel()
        return self._people

    # ------------------------------------------------------------------ partition keys

    def op_partition_run(self, pk: str, n: int = 2, replace: bool = False) -> str:
        """A run of partition key ``pk``: register its checkpoint, write ``n`` rows into its partition
        (0: an empty one), durability check, commit; ``replace``: a COMMITTED one is reprocessed."""
        from airflow_provider_walsink.core.commit.writer import CheckpointWriter
        from airflow_provider_walsink.core.protocol.partition_keys import (
            PartitionSpec,
            partition_key_of_checkpoint,
        )

        from .world import Attempt, actor

        cfg, store, pm = self.cfg, self.store, self.people
        if cfg.mode != "overwrite" or cfg.kafka or cfg.domain is not None or cfg.spark_write:
            return "skipped: partition keys name an overwrite partition of the dt column"
        spec = PartitionSpec(column="dt")
        key = spec.checkpoint_key(pk)
        directory = spec.target_partition(pk)
        if pm.key_of.get(pk, key) != key:
            self.notes.append(f"partition key {pk!r} named checkpoint {pm.key_of[pk]}, now {key}")
        if pm.pk_of.get(key, pk) != pk:
            self.notes.append(f"partition keys {pm.pk_of[key]!r} and {pk!r} share checkpoint {key}")
        if partition_key_of_checkpoint(key) != pk:
            self.notes.append(
                f"checkpoint {key} of partition key {pk!r} names {partition_key_of_checkpoint(key)!r}"
            )
        pm.key_of.setdefault(pk, key)
        pm.pk_of.setdefault(key, pk)
        a = actor("partition", key, self._next())
        record = store.register(cfg.pipeline, key, mode=cfg.mode, actor=a, target=cfg.uri())
        if record.is_committed:
            if not replace:
                return f"{key}: skipped: COMMITTED"
            store.begin_version(cfg.pipeline, key, token=f"model/{key}#{self._next()}", actor=a,
                                reason="model: partition reprocess")  # fmt: skip
        writer = CheckpointWriter(store, self.layout, cfg.pipeline, key, actor=a, partition_columns=("dt",))
        attempt_dir = writer.begin()
        version = store.require(cfg.pipeline, key).version
        held = PARTITION_KEYS[pk][1] if cfg.kind == "files" else pk  # as rows() reads it back
        rows = []
        for _ in range(n):
            serial = self._next()
            rows.append((held, f"{key}.{serial}", None if serial % 3 == 0 else serial))
        if rows:
            buf = pa.BufferOutputStream()
            pq.write_table(pa.table({"id": pa.array([r[1] for r in rows], pa.string()),
                                     "v": pa.array([r[2] for r in rows], pa.int64())}), buf,
                           compression="none")  # fmt: skip
            rel = f"{directory}/part-{self._next():05d}.parquet"
            if hasattr(attempt_dir, "mkdir"):  # a local directory
                (attempt_dir / directory).mkdir(parents=True, exist_ok=True)
                (attempt_dir / rel).write_bytes(buf.getvalue().to_pybytes())
            else:
                objects = writer.objects
                with objects.filesystem.open_output_stream(objects.committable(attempt_dir, rel)) as out:
                    out.write(buf.getvalue().to_pybytes())
            writer.add_files([rel], rows={rel: len(rows)}, checksum="crc32", writer="model")
        else:
            writer.declare_partition(directory)
        writer.seal(file_format="parquet", job="model")
        aid = store.require(cfg.pipeline, key).sealed_attempt_id
        self.model.attempts[aid] = Attempt(key, aid, version, rows, [held])
        pm.attempt_pk[aid] = pk
        self.counts["partition_run.written"] += 1
        durable = self.op_durable(key)
        committed = self._commit_until_done(key)
        if committed.get("error") == "OrderError":
            # Invariant 10 refuses an older checkpoint over a newer one's partition: each key has a
            # partition of its own, so another key's checkpoint holds this key's partition.
            self.notes.append(f"{key} ({pk!r}) was refused a partition another checkpoint holds: {committed}")
        return f"{key}: sealed {aid[:8]} v{version} ({len(rows)} rows); {durable}; {json.dumps(committed)}"

    def _partition_rows(self, problems: list[str]) -> list[tuple[Any, str, int | None]]:
        """Check the partition-keyed checkpoints against the model; the rows they must show."""
        m, pm = self.model, self.people
        for key, pk in pm.pk_of.items():
            rec = self.store.get(self.cfg.pipeline, key)
            if rec is None:
                continue  # retention trimmed it: what it committed stays
            aid = rec.sealed_attempt_id if rec.is_committed else rec.supersedes_attempt_id
            if aid is None or aid == pm.visible.get(pk):
                continue
            att = m.attempts.get(aid)
            if att is None or aid not in pm.attempt_pk:
                problems.append(
                    f"{key} ({pk!r}) is COMMITTED with attempt {aid[:8]}, which no partition run wrote"
                )
                continue
            if pm.attempt_pk[aid] != pk:
                problems.append(
                    f"{key} ({pk!r}) is COMMITTED with attempt {aid[:8]}, written for partition key "
                    f"{pm.attempt_pk[aid]!r}"
                )
            if aid in m.aborted or not att.durable:
                problems.append(
                    f"{key} ({pk!r}) is COMMITTED with attempt {aid[:8]}, aborted or never durable"
                )
            pm.visible[pk] = aid
        return [r for aid in pm.visible.values() for r in m.attempts[aid].rows]

    # ------------------------------------------------------------------ audits and a person's decision

    def op_audit(self, key: str, verdict: str = "fail") -> str:
        """The audit task on the checkpoint (made durable first if it is not): a check that
        ``fail``s (REJECTED) or passes (AUDITED)."""
        from airflow_provider_walsink.core.commit.audit import CallableCheck, audit_checkpoint
        from airflow_provider_walsink.core.staging.layout import StagingLayout
        from airflow_provider_walsink.core.staging.object_store import StagingStore

        from .world import actor

        cfg = self.cfg
        first = self._ensure_durable(key)
        passes = verdict == "pass"
        check = CallableCheck(lambda staged: (passes, f"model: the audit {verdict}s"), name="model")
        if cfg.staging != "local":
            options = cfg.store_options()
            layout: Any = StagingLayout(f"{cfg.work}/staging")
            stores: Any = lambda root: StagingStore.open(root, options)  # noqa: E731
        else:
            layout, stores = self.layout, None
        try:
            done = audit_checkpoint(self.store, layout, cfg.pipeline, key, [check],
                                    actor=actor("audit", key, self._next()), stores=stores)  # fmt: skip
        except WalsinkError as exc:
            return f"{first}audit refused: {type(exc).__name__}: {str(exc)[:120]}"
        if not done.already and done.attempt_id:
            (self.people.audited if passes else self.people.rejected).add(done.attempt_id)
            self.counts[f"audit.{done.verdict}"] += 1
        return f"{first}audit {done.verdict} ({'already' if done.already else 'now'}): {done.state}"

    def op_decide(self, key: str, choice: str = "publish", meanwhile: str = "none") -> str:
        """A person answers the approval question about the REJECTED attempt shown (audited and
        rejected first if the checkpoint is not REJECTED): ``publish`` anyway or ``abort``; before
        the answer, ``meanwhile``: someone aborts the checkpoint (``abort``), the interval is written
        again (``rewrite``: durable, not audited; ``rewrite_reject``: rejected too), or both
        (``abort_rewrite_reject``). Then the commit task runs."""
        from .world import actor

        cfg, store, pm = self.cfg, self.store, self.people
        rec = store.get(cfg.pipeline, key)
        first = ""
        if rec is None or rec.state.value != "REJECTED":
            first = self.op_audit(key, "fail") + "; "
            rec = store.get(cfg.pipeline, key)
            if rec is None or rec.state.value != "REJECTED":
                return f"{first}skipped: not REJECTED"
        shown = rec.sealed_attempt_id or ""
        a = actor("approval", key, self._next())
        store.ask_decision(cfg.pipeline, key, attempt_id=shown, actor=a)
        then = []
        if "abort" in meanwhile.split("_"):
            then.append(f"abort {self.op_abort(key)}")
        if "rewrite" in meanwhile:
            wrote = self.op_write(key, 2, [0, 1])
            then.append(wrote if wrote.startswith("skipped") else f"{wrote}; {self.op_durable(key)}")
            if meanwhile.endswith("reject"):
                then.append(self.op_audit(key, "fail"))
        if choice == "publish":
            try:
                done = store.approve_rejected(cfg.pipeline, key, attempt_id=shown, approver=APPROVER,
                                              reason="model: known test accounts", actor=a)  # fmt: skip
                pm.approved.add(shown)
                decided = f"approved: {done.state.value}"
                self.counts["decide.approved"] += 1
            except WalsinkError as exc:
                decided = f"approval refused: {type(exc).__name__}"
                self.counts["decide.refused"] += 1
        else:
            decided = self._person_aborts(key, shown)
        return f"{first}meanwhile {'; '.join(then) or '-'}; {decided}; commit {self._commit_audited(key)}"

    def _person_aborts(self, key: str, shown: str) -> str:
        """A person's Abort of the REJECTED attempt ``shown``, as the approval step runs it (the
        aborter told which attempt was decided about); checked: it never ends a newer attempt."""
        from airflow_provider_walsink.core.commit.abort import CheckpointAborter

        from .world import ABORT_GRACE, LEASE_TTL, actor

        cfg, m = self.cfg, self.model
        before = self.store.require(cfg.pipeline, key)
        aborter = CheckpointAborter(self.store, self.layout, cfg.publisher(self.layout), grace=ABORT_GRACE,
                                    lease_ttl=LEASE_TTL)  # fmt: skip
        try:
            outcome = aborter.abort(cfg.pipeline, key, reason="model: a person's abort",
                                    actor=actor("approval", key, self._next()), attempt_id=shown)  # fmt: skip
        except WalsinkError as exc:
            self.counts["decide.abort_refused"] += 1
            return f"abort refused: {type(exc).__name__}"
        if outcome.state == "ABORTED" and before.attempt_id:  # as World.op_abort keeps the model
            m.aborted.update(a for a in (before.attempt_id, before.sealed_attempt_id) if a)
        elif before.supersedes_attempt_id and before.attempt_id:  # an abandoned new version
            m.aborted.add(before.attempt_id)
            chain = m.reprocessing.get(key)
            if chain:
                chain.pop()
                if not chain:
                    del m.reprocessing[key]
        if outcome.state in ("ABORTED", "COMMITTED"):
            if before.state.value not in ("ABORTED", "COMMITTED") and before.attempt_id != shown:
                self.notes.append(
                    f"{key}: a person's abort of attempt {shown[:8]} aborted attempt {(before.attempt_id or '')[:8]}, "
                    "written after they were shown theirs"
                )
        self.counts["decide.aborted"] += 1
        return f"aborted: {outcome.state}"

    def _commit_audited(self, key: str) -> str:
        """The commit task of an audited pipeline (``require_audit``), with Airflow's retries."""
        import time

        from .world import LEASE_TTL, MAX_TRIES, actor, committer

        if self.cfg.kafka:  # the Kafka source's step after the commit: the world's commit task
            return json.dumps(self._commit_until_done(key))
        result: dict[str, Any] = {}
        for _ in range(MAX_TRIES):
            a = actor("commit", key, self._next())
            c = committer(self.cfg, self.store, a.name)
            c.require_audit = True
            try:
                s = c.commit(self.cfg.pipeline, key, actor=a)
            except WalsinkError as exc:
                result = {"ok": False, "error": type(exc).__name__}
                if result["error"] in ("LeaseHeldError", "TableCommitConflict"):
                    time.sleep(LEASE_TTL.total_seconds() / 2)
                    continue
                return json.dumps(result)
            result = {"ok": True, "already": s.already_committed, "attempt_id": s.attempt_id}
            self._note_commit(result)
            pm = self.people
            if not s.already_committed and s.attempt_id not in pm.audited | pm.approved:
                self.notes.append(
                    f"{key}: an audited pipeline's commit published attempt {s.attempt_id[:8]}, which "
                    "neither passed its audit nor was approved"
                )
            break
        return json.dumps(result)

    # ------------------------------------------------------------------ the commit deadline

    def op_deadline(self, key: str, runs: str = "once") -> str:
        """Airflow runs the commit-deadline callback of the checkpoint's run: ``once``, ``twice``
        (one after the other: a triggerer restarted), ``concurrent`` (two triggerers at once), or
        ``during_commit`` (two at once while the checkpoint's commit task runs, a real process).
        Each run claims the deadline's notification (``walsink_deadline_notice``) and only a
        claim's holder notifies (counted), then writes what the notifier did on the claim."""
        from airflow_provider_walsink.core.store.records import Actor, utcnow
        from airflow_provider_walsink.core.store.store import CommitterStore

        cfg, pm = self.cfg, self.people
        rec = self.store.get(cfg.pipeline, key)
        # Airflow's id of the run's deadline: one per run of the interval (a reprocess is a new run).
        deadline = f"{key}@v{rec.version if rec else 0}"
        lock = threading.Lock()
        told: list[str] = []

        def callback(barrier: threading.Barrier | None) -> None:
            store = CommitterStore.from_url(cfg.db_url, migrate=False)  # another triggerer's connection
            claimant = f"triggerer {uuid.uuid4().hex[:8]}"
            try:
                if barrier is not None:
                    barrier.wait(30)
                claimed = store.claim_deadline_notice(
                    cfg.pipeline, deadline, checkpoint_key=key if rec else None, due_at=utcnow(),
                    actor=Actor(name=f"airflow deadline alert@{key}", dag_id="model", run_id=key),
                    claimant=claimant, detail=f"commit deadline missed: {key}",
                )  # fmt: skip
                if claimed:
                    with lock:
                        pm.notified[deadline] += 1
                    store.finish_deadline_notice(
                        cfg.pipeline, deadline, claimant=claimant, outcome="notified"
                    )
                with lock:
                    told.append("notified" if claimed else "not again")
            except Exception as exc:  # noqa: BLE001 - reported as a finding
                with lock:
                    self.notes.append(
                        f"the deadline callback of {key} raised {type(exc).__name__}: {exc}"[:400]
                    )
            finally:
                store.dispose()

        proc = out = None
        if runs == "during_commit":
            self._ensure_durable(key)
            rec = self.store.get(cfg.pipeline, key)
            proc, out = self._spawn(key, None, stop=False)
        before = rec.state.value if rec else None
        if runs in ("once", "twice"):
            for _ in range(1 if runs == "once" else 2):
                callback(None)
        else:
            barrier = threading.Barrier(2)
            threads = [threading.Thread(target=callback, args=(barrier,)) for _ in range(2)]
            for t in threads:
                t.start()
            for t in threads:
                t.join(120)
        committed = ""
        if proc is not None:
            proc.join(300)
            result = self._result(out)
            self._note_commit(result)
            committed = f"; commit {result.get('ok')} {result.get('error', '')}"
        now = self.store.get(cfg.pipeline, key)
        after = now.state.value if now else None
        if proc is None and after != before:
            self.notes.append(f"{key}: the commit deadline's callback moved it from {before} to {after}")
        notice = self.store.deadline_notice(cfg.pipeline, deadline)
        if notice is None or (pm.notified[deadline] and notice["outcome"] != "notified"):
            self.notes.append(f"{key}: deadline {deadline}'s notice is {notice and notice['outcome']}")
        self.counts[f"deadline.{runs}"] += 1
        return f"{deadline}: {', '.join(told)}; {before} -> {after}{committed}"

    # ------------------------------------------------------------------ the invariants

    def people_check(self, problems: list[str]) -> list[tuple[Any, str, int | None]]:
        """Add the violations of this module's invariants to ``problems``; the rows the
        partition-keyed checkpoints must show (added to what the world expects)."""
        from .world import KEYS

        pm = self.people
        for key in KEYS:
            rec = self.store.get(self.cfg.pipeline, key)
            aid = rec.sealed_attempt_id if rec is not None and rec.is_committed else None
            if aid in pm.rejected and aid not in pm.approved:
                problems.append(
                    f"{key} is COMMITTED with attempt {aid[:8]}, REJECTED by its audit and never approved"
                )
        for deadline, n in pm.notified.items():
            if n > 1:
                problems.append(f"deadline {deadline}: {n} notifications (at most one)")
        return self._partition_rows(problems)


def draw(op: str, key: str, data: Any, cfg: Any) -> dict[str, Any] | None:
    """The step of ``op`` (one of :data:`OPS`) drawn for the machine; None: not for this world."""
    from hypothesis import strategies as st

    if op == "partition_run":
        if cfg.mode != "overwrite" or cfg.kafka or cfg.domain is not None:
            return None
        pk = data.draw(st.sampled_from(list(PARTITION_KEYS)), label="pk")
        n = data.draw(st.sampled_from([2, 1, 0]), label="n")
        return {"op": op, "pk": pk, "n": n, "replace": data.draw(st.booleans(), label="replace")}
    if op == "audit":
        return {
            "op": op,
            "key": key,
            "verdict": data.draw(st.sampled_from(["fail", "pass"]), label="verdict"),
        }
    if op == "decide":
        choice = data.draw(st.sampled_from(["publish", "publish", "abort"]), label="choice")
        meanwhile = data.draw(
            st.sampled_from(["none", "none", "abort", "rewrite", "rewrite_reject", "abort_rewrite_reject"]),
            label="meanwhile",
        )
        return {"op": op, "key": key, "choice": choice, "meanwhile": meanwhile}
    runs = data.draw(st.sampled_from(["once", "twice", "concurrent", "during_commit"]), label="runs")
    return {"op": "deadline", "key": key, "runs": runs}
