"""Operations on the staging and publish paths in their harder forms (issue 49, part B).

A mixin of :class:`~.world.World` (its ``op_*`` methods are steps like the others), drawn into
the random schedules by :data:`WEIGHTED` and :func:`draw` (``tests/model/machine.py``):

``abort_writing``
    A write task in a child process SIGSTOPped while its attempt is still WRITING (files staged,
    no manifest: ``write.after_staging``; or the manifest written, the seal not yet recorded:
    ``seal.after_manifest``); the checkpoint is aborted meanwhile; the write is resumed and
    tries to seal. Its attempt must never seal, become durable or be published: the row stays
    ABORTED (a later run starts a new attempt: ``rerun`` does, and commits it).
``seal_race``
    A write whose seal is two seals of the one attempt in flight at once (two threads released
    together: the job's driver and a restarted one, another ``job`` in each manifest), each the
    store's seal then the committer table's record, as the writer does. At most one is accepted;
    the row records the manifest the store holds (it reads back with the recorded digest).
    Then the durability check and the commit.
``resize``
    ``corrupt`` in its harder form: after the durability gate a staged committable is rewritten
    with other bytes *and* another size (one value longer), with ``verify_checksums`` on (off,
    a size change after the gate is outside the contract: skipped). The commit must refuse it,
    nothing published, the checkpoint uncommitted with the checksum error recorded.
``pause_publish``
    A files-target commit (of ``key``; if it is committed, of the first key still open)
    SIGSTOPped between two of its moves (``append``: after the first of
    its file moves; ``overwrite``: after the first of its partition swaps, the target showing
    one partition of the attempt and not the other); meanwhile ``then`` runs: a retry that takes
    the lease over, a second committer SIGKILLed mid-publish and then retried, an abort, or a
    garbage collection; then the paused committer resumes and the commit task is retried until
    the checkpoint is COMMITTED or ABORTED (a publish must be resumable from where any of them
    stopped, and a fenced committer change nothing).

Every step is then checked by :meth:`~.world.World.check` (each committed row once, nothing of an
aborted or changed attempt visible) besides the checks each operation makes itself.
"""

from __future__ import annotations

import io
import json
import logging
import os
import signal
import threading
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from airflow_provider_walsink.core import faults
from airflow_provider_walsink.core.commit.writer import CheckpointWriter
from airflow_provider_walsink.core.protocol.errors import WalsinkError
from airflow_provider_walsink.core.protocol.manifest import build_manifest, digest_of
from airflow_provider_walsink.core.staging.resolve import as_store

#: Operations and weights, added to :data:`.machine.WEIGHTED` (common: as often as ``crash``
#: together, each about as often as ``pause``).
WEIGHTED = ["abort_writing"] * 2 + ["seal_race"] * 2 + ["resize"] * 2 + ["pause_publish"] * 2
OPS = frozenset(WEIGHTED)
#: Where a write is stopped while its attempt is WRITING (``core/faults.py``).
WRITE_PAUSES = ("write.after_staging", "seal.after_manifest")
#: What runs while a files publish is stopped between two moves.
PUBLISH_THEN = ("retry", "crash", "abort", "gc")
#: The child writer's serials start this far past the parent's (ids stay unique in the model).
_CHILD_SERIALS = 1_000_000


def draw(op: str, key: str, data: Any, world: Any) -> dict[str, Any] | None:
    """The step of ``op`` for ``key`` with its drawn arguments; None: not for this combination."""
    from hypothesis import strategies as st

    cfg = world.cfg
    if op == "abort_writing":
        if cfg.kafka or cfg.spark_write:
            return None
        point = data.draw(st.sampled_from(WRITE_PAUSES), label="point")
        rerun = data.draw(st.booleans(), label="rerun")
        return {"op": op, "key": key, "point": point, "rerun": rerun}
    if op == "seal_race":
        if cfg.kafka or cfg.spark_write:
            return None
        return {"op": op, "key": key, "parts": data.draw(st.sampled_from([[0], [0, 1]]), label="parts")}
    if op == "resize":
        return None if cfg.kafka else {"op": op, "key": key}
    if op == "pause_publish":
        if cfg.kind != "files":
            return None
        return {"op": op, "key": key, "then": data.draw(st.sampled_from(PUBLISH_THEN), label="then")}
    raise ValueError(op)


def _child_write(cfg: Any, key: str, serial: int, point: str, out: str) -> None:
    """The write task of ``key`` (the model's ``op_write``, n=2 over two partitions), SIGSTOPped at
    ``point``; writes ``{"ok", "told"|"error", "attempt": the model's attempt if sealed}`` to ``out``."""
    from airflow_provider_walsink.core.store.store import CommitterStore

    from .world import Model, World

    logging.disable(logging.ERROR)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)  # see world._child_commit
    result: dict[str, Any]
    try:
        os.environ[faults.ENV] = f"{point}:1"
        os.environ[faults.SIGNAL_ENV] = "STOP"
        w = World.__new__(World)
        w.cfg, w.store, w.layout, w.model = (
            cfg,
            CommitterStore.from_url(cfg.db_url, migrate=False),
            cfg.layout(),
            Model(),
        )
        w.counts, w.notes, w.log, w._n, w.kafka = Counter(), [], [], serial, None
        told = w.op_write(key, 2, [0, 1])
        sealed = [
            {"key": a.key, "attempt_id": a.attempt_id, "version": a.version, "rows": a.rows, "partitions": a.partitions,
             "start": a.start, "end": a.end}
            for a in w.model.attempts.values()
        ]  # fmt: skip
        result = {"ok": True, "told": told, "sealed": sealed}
    except BaseException as exc:  # noqa: BLE001 - reported to the parent
        result = {"ok": False, "error": type(exc).__name__, "text": str(exc)[:400]}
    Path(out).write_text(json.dumps(result))
    os._exit(0)


def _rows(rows: list[list[Any]]) -> list[tuple[Any, str, int | None]]:
    """Rows read back from JSON: a widened domain's partition is a tuple again."""
    return [(tuple(p) if isinstance(p, list) else p, i, v) for p, i, v in rows]


def resized(data: bytes) -> tuple[bytes, str, str] | None:
    """``data`` (a staged Parquet file of the model) rewritten with one ``id`` a character longer:
    other bytes and another size, still a Parquet file of the model's columns."""
    try:
        t = pq.read_table(io.BytesIO(data))
    except Exception:  # noqa: BLE001 - not a Parquet file of the model
        return None
    ids = t.column("id").to_pylist()
    if not ids or ids[0] is None:
        return None
    old = ids[0]
    ids[0] = new = f"{old}+"
    buf = io.BytesIO()
    pq.write_table(t.set_column(t.schema.get_field_index("id"), "id", pa.array(ids, pa.string())), buf,
                   compression="none")  # fmt: skip
    changed = buf.getvalue()
    return (changed if len(changed) != len(data) else changed + b"\0"), old, new


class StorageOps:
    """The operations of the module docstring, as :class:`~.world.World` methods."""

    # ------------------------------------------------------------------ abort while WRITING

    def op_abort_writing(self, key: str, point: str = "write.after_staging", rerun: bool = False) -> str:
        from . import world as W

        cfg = self.cfg
        if cfg.kafka or cfg.spark_write:
            return "skipped: the model's own writes only"
        out = f"{cfg.work}/{uuid.uuid4().hex}.out"
        proc = W._CHILDREN.Process(
            target=_child_write, args=(cfg, key, _CHILD_SERIALS * self._next(), point, out)
        )
        proc.start()
        while proc.is_alive() and W._proc_state(proc.pid) != "T":
            time.sleep(0.01)
        if not proc.is_alive():
            proc.join()
            told = W.World._result(out)
            self._adopt(told)
            return f"never paused: {json.dumps(told)[:300]}"
        self.counts["abort_writing.paused"] += 1
        rec = self.store.require(cfg.pipeline, key)
        writing = rec.attempt_id if rec.state.value == "WRITING" else None
        try:
            aborted = self.op_abort(key)
        except WalsinkError as exc:
            aborted = f"refused: {type(exc).__name__}: {str(exc)[:160]}"
        finally:
            W.resume(proc)
        told = W.World._result(out)
        now = self.store.require(cfg.pipeline, key)
        if aborted == "ABORTED" and writing:
            self.counts["abort_writing.aborted"] += 1
            for a in told.get("sealed", []) if told.get("ok") else []:
                self._adopt({"ok": True, "sealed": [a]})
            if told.get("ok") or now.state.value != "ABORTED" or now.sealed_attempt_id == writing:
                self.notes.append(
                    f"{key}: attempt {writing[:8]} was aborted while WRITING, yet the write that resumed "
                    f"after it said {json.dumps(told)[:300]} and the row is {now.state.value} with sealed "
                    f"attempt {(now.sealed_attempt_id or '-')[:8]} (it must stay ABORTED, never sealed)"
                )
            # Nothing of it becomes durable or committed afterwards either.
            after = f"; {self.op_durable(key)}; commit {json.dumps(self._commit_here(key))[:200]}"
            if self._committed(key) or self.store.require(cfg.pipeline, key).state.value != "ABORTED":
                self.notes.append(f"{key}: the checkpoint aborted while WRITING moved on: {after}")
        else:
            self._adopt(told)
            after = ""
        if rerun:  # the write task run again: a fresh attempt, verified and committed
            wrote = self.op_write(key, 1, [0, 1])
            after += f"; rerun {wrote}"
            if not wrote.startswith("skipped"):
                after += f"; {self.op_durable(key)}; {json.dumps(self._commit_until_done(key))[:200]}"
        return f"paused at {point}; abort: {aborted}; the write resumed: {json.dumps(told)[:200]}{after}"

    def _adopt(self, told: dict[str, Any]) -> None:
        """The model of the attempts a child writer sealed."""
        from .world import Attempt

        for a in told.get("sealed", []) if told.get("ok") else []:
            self.model.attempts[a["attempt_id"]] = Attempt(
                a["key"], a["attempt_id"], a["version"], _rows(a["rows"]),
                [tuple(p) if isinstance(p, list) else p for p in a["partitions"]], a["start"], a["end"],
            )  # fmt: skip

    # ------------------------------------------------------------------ racing seals

    def op_seal_race(self, key: str, parts: list[int] | None = None) -> str:
        cfg = self.cfg
        if cfg.kafka or cfg.spark_write:
            return "skipped: the model's own writes only"
        world = self
        told: list[str] = []
        original = CheckpointWriter.seal

        def racing_seal(writer: CheckpointWriter, *, file_format: str = "parquet", start_offsets: Any = None,
                        end_offsets: Any = None, job: str | None = None) -> tuple[Any, str]:  # fmt: skip
            record = writer.record
            assert record is not None
            start = record.start_offsets if start_offsets is None else start_offsets
            manifests = [
                build_manifest(pipeline=writer.pipeline, checkpoint_key=writer.checkpoint_key,
                               sequence=record.sequence, attempt=record.attempt, attempt_id=record.attempt_id or "",
                               partition_columns=writer.partition_columns, file_format=file_format,
                               committables=writer.committables, partitions=writer.partitions,
                               start_offsets=start, end_offsets=end_offsets, job=f"{job}-{who}")
                for who in ("driver", "restarted")
            ]  # fmt: skip
            staging = as_store(writer.objects or writer.layout)
            location = staging.attempt(
                writer.pipeline, writer.checkpoint_key, record.attempt, record.attempt_id
            )
            uri = staging.manifest_uri(location)
            gate = threading.Barrier(2)
            results: list[Any] = [None, None]

            def seal(i: int) -> None:
                gate.wait()
                stored = None
                for _ in range(3):  # a 409 (another conditional write in flight) says: retry
                    try:
                        stored = staging.seal(location, manifests[i])
                        break
                    except WalsinkError as exc:
                        if "in flight" not in str(exc):
                            results[i] = ("store refused", type(exc).__name__)
                            return
                if stored is None:
                    results[i] = ("store refused", "409 thrice")
                    return
                try:
                    results[i] = ("sealed", stored, writer.store.seal_manifest(
                        manifests[i], manifest_uri=uri, manifest_digest=stored, actor=writer.actor))  # fmt: skip
                except WalsinkError as exc:
                    results[i] = ("store accepted, record refused", type(exc).__name__, stored)

            threads = [threading.Thread(target=seal, args=(i,)) for i in range(2)]
            for t in threads:
                t.start()
            for t in threads:
                t.join(120)
            told.extend(r[0] for r in results if r)
            digests = [digest_of(m.to_bytes()) for m in manifests]
            accepted = [r for r in results if r and r[0] != "store refused"]
            sealed = [r for r in results if r and r[0] == "sealed"]
            problems = []
            if len(accepted) > 1:
                problems.append(f"the staging store accepted both seals of one attempt ({told})")
            row = writer.store.require(writer.pipeline, writer.checkpoint_key)
            if not sealed or row.manifest_digest not in digests:
                problems.append(f"neither racing seal was recorded ({results}); the row is {row.state.value}")
            else:
                try:
                    staging.read_manifest(location, expected_digest=row.manifest_digest)
                except (WalsinkError, OSError) as exc:
                    problems.append(
                        f"the recorded seal ({row.manifest_digest[:12]}) is not the manifest the store holds: "
                        f"{type(exc).__name__}: {str(exc)[:200]}"
                    )
            if problems:
                world.notes.extend(f"{writer.checkpoint_key}: two seals racing: {p}" for p in problems)
                raise RuntimeError("; ".join(problems))
            writer.record = sealed[0][2]
            world.counts["seal_race.raced"] += 1
            return manifests[digests.index(row.manifest_digest)], row.manifest_digest

        CheckpointWriter.seal = racing_seal  # type: ignore[method-assign]
        try:
            wrote = self.op_write(key, 2, parts or [0, 1])
        except RuntimeError as exc:
            return f"raced {told}: {exc}"
        finally:
            CheckpointWriter.seal = original  # type: ignore[method-assign]
        if wrote.startswith("skipped"):
            return wrote
        return (
            f"{wrote}, raced {told}; {self.op_durable(key)}; {json.dumps(self._commit_until_done(key))[:200]}"
        )

    # ------------------------------------------------------------------ bytes and size changed

    def op_resize(self, key: str) -> str:
        if not self.cfg.verify_checksums:
            return "skipped: a size change after durability with verify_checksums off (outside the contract)"
        return self.op_corrupt(key, resize=True)

    # ------------------------------------------------------------------ a files publish paused

    def op_pause_publish(self, key: str, then: str = "retry") -> str:
        from . import world as W

        cfg = self.cfg
        if cfg.kind != "files":
            return "skipped: the files target's publish"
        if self._committed(key):
            # A committed key's commit is a no-op that never pauses: the first key still open instead
            # (decided on the state, so a replay does the same; in append the one that may commit).
            key = next((k for k in W.KEYS if not self._committed(k)), key)
        first_write = self._ensure_durable(key)
        point = "publish.after_swap" if cfg.mode == "overwrite" else "publish.after_k"
        proc, out = self._spawn(key, point, stop=True)
        while proc.is_alive() and W._proc_state(proc.pid) != "T":
            time.sleep(0.01)
        if not proc.is_alive():
            first = self._result(out)
            self._note_commit(first)
            return f"{first_write}never paused: {json.dumps(first)[:300]}"
        self.counts["pause_publish.paused"] += 1
        rec = self.store.require(cfg.pipeline, key)
        time.sleep(W.LEASE_TTL.total_seconds() * 1.2)
        try:
            if then == "abort":
                meanwhile = self.op_abort(key)
            elif then == "gc":
                meanwhile = self.op_gc()
            elif then == "crash":
                other, other_out = self._spawn(key, point, stop=False)
                other.join(300)
                killed = other.exitcode == -signal.SIGKILL
                if not killed:
                    self._note_commit(self._result(other_out))
                else:
                    self.counts["kills"] += 1
                    time.sleep(W.LEASE_TTL.total_seconds() * 1.1)
                meanwhile = f"second committer {'killed' if killed else 'finished'}; " + json.dumps(
                    self._commit_until_done(key)
                )
            else:
                meanwhile = json.dumps(self._commit_until_done(key))
        except WalsinkError as exc:
            meanwhile = f"refused: {type(exc).__name__}: {str(exc)[:160]}"
        finally:
            W.resume(proc)
        resumed = self._result(out)
        self._note_commit(resumed)
        # The commit task's retries: the publish must finish from wherever the others left it.
        done = self._commit_until_done(key) if then != "abort" or not self._aborted(key) else {}
        now = self.store.require(cfg.pipeline, key)
        if not now.is_committed and now.state.value != "ABORTED":
            self.notes.append(
                f"{key}: a files publish paused between two moves ({point}, then {then}) did not finish: the "
                f"row is {now.state.value} ({(now.error or '')[:200]!r}) after the retries ({json.dumps(done)[:200]})"
            )
        if now.state.value == "ABORTED" and rec.sealed_attempt_id:
            self.model.aborted.add(rec.sealed_attempt_id)
        return (f"{first_write}paused at {point}; meanwhile {then}: {meanwhile[:200]}; resumed: "
                f"{json.dumps(resumed)[:200]}; retried: {json.dumps(done)[:200]}")  # fmt: skip

    def _aborted(self, key: str) -> bool:
        rec = self.store.get(self.cfg.pipeline, key)
        return rec is not None and rec.state.value == "ABORTED"
