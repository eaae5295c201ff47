"""Committer-table records → JSON-ready dicts for the commit-state API and pages.

Airflow-free: reads the store and the staging area only. The manifest of a
checkpoint is read through the staging store contract (``attempt`` →
``read_manifest`` with the sealed digest), so nothing outside the staging
root is ever opened because a database row says so (invariant 6).
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict
from datetime import datetime, timedelta
from typing import Any
from urllib.parse import quote

from airflow_provider_walsink.core.commit.audit import AuditReport
from airflow_provider_walsink.core.protocol.errors import WalsinkError
from airflow_provider_walsink.core.protocol.manifest import MANIFEST_NAME
from airflow_provider_walsink.core.protocol.partition_keys import partition_key_of_checkpoint
from airflow_provider_walsink.core.protocol.partitions import unescape_path_name
from airflow_provider_walsink.core.protocol.states import AUDIT_VERDICTS, ERROR_STATES, CheckpointState
from airflow_provider_walsink.core.staging.object_store import StagingStore
from airflow_provider_walsink.core.store.deadlines import is_overdue
from airflow_provider_walsink.core.store.models import plain_text
from airflow_provider_walsink.core.store.queries import wait_status
from airflow_provider_walsink.core.store.records import VersionRecord
from airflow_provider_walsink.core.store.store import (
    CheckpointRecord,
    CommitterStore,
    TransitionRecord,
    utcnow,
)
from airflow_provider_walsink.core.store.verdicts import DECISION_ASKED
from airflow_provider_walsink.ui.links import required_actions_link, task_log_link

S = CheckpointState
#: Display order of a checkpoint row's states (life-cycle order, then the dead ends).
#: SUPERSEDED is a state of an earlier *version* (listed per checkpoint), never of a row.
STATE_ORDER = [s.value for s in S if s is not S.SUPERSEDED]
#: The history detail a skipped re-run of a committed checkpoint records (operators/write.py).
SKIPPED_RERUN = "write skipped"
#: How many committables a detail response lists at most (the manifest may hold a million).
MAX_COMMITTABLES_SHOWN = 1000
#: States the pages colour as failures (red); every other state, ABORTED included, is neutral.
FAILURE_STATES = frozenset(s for s in STATE_ORDER if s in ("FAILED", "REJECTED"))


#: ``90s``, ``15m``, ``12h``, ``7d``, ``2w``: the ages the filters take (as ``walsink checkpoints --older-than``).
_AGE = re.compile(r"\s*(\d+)\s*([smhdw])\s*")
_AGE_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}
#: The choices of the overview's "not committed for longer than" control.
AGE_CHOICES = ("15m", "1h", "6h", "1d", "7d")


def parse_age(text: str) -> timedelta:
    """``"90s"``, ``"15m"``, ``"12h"``, ``"7d"``, ``"2w"`` -> a timedelta; ``ValueError`` (saying
    what is accepted) for anything else, a number without a unit included."""
    match = _AGE.fullmatch(text or "")
    if match is None:
        raise ValueError(f"not an age: {text!r}; give a whole number with a unit: 90s, 15m, 12h, 7d or 2w")
    return timedelta(seconds=int(match.group(1)) * _AGE_UNITS[match.group(2)])


def plural(n: int | None, word: str, plural_word: str | None = None) -> str:
    """``"1 committable"``, ``"2 committables"``, ``"1,024 rows"`` (``None`` counts as unknown)."""
    if n is None:
        return f"? {plural_word or word + 's'}"
    return f"{n:,} {word if n == 1 else (plural_word or word + 's')}"


def key_values(value: Any, prefix: str = "") -> list[tuple[str, str]]:
    """Offsets and similar JSON as readable ``(key, value)`` pairs: nested keys joined by
    dots, lists by commas, in the order given (``{"events": {"0": 42}}`` -> ``events.0 = 42``)."""
    if isinstance(value, dict):
        if not value and prefix:
            return [(prefix, "{}")]
        out: list[tuple[str, str]] = []
        for k, v in value.items():
            out += key_values(v, f"{prefix}.{k}" if prefix else str(k))
        return out
    if isinstance(value, list):
        text = ", ".join(str(v) if not isinstance(v, dict | list) else json.dumps(v) for v in value)
    elif value is None:
        text = "null"
    else:
        text = str(value)
    return [(prefix or "value", text)]


def airflow_links(
    dag_id: str | None, run_id: str | None, task_id: str | None = None, try_number: int | None = None
) -> dict[str, str]:
    """Relative links to Airflow 3's own pages for a DAG, a run, a task and its try's log
    (whichever are known).

    Relative (``/dags/...``), so they follow the api-server wherever it is served from.
    """
    if not dag_id:
        return {}
    dag = f"/dags/{quote(dag_id, safe='')}"
    out = {"dag": dag}
    if run_id:
        out["run"] = f"{dag}/runs/{quote(run_id, safe='')}"
        if task_id:
            out["task"] = f"{out['run']}/tasks/{quote(task_id, safe='')}"
            out["log"] = task_log_link(dag_id, run_id, task_id, try_number)
    return out


def failing_try(history: list[TransitionRecord]) -> TransitionRecord | None:
    """The task try whose log says why the checkpoint is where it is: the newest row a task
    recorded that fails it, refuses or waits on it (a row that changes no state, with a detail),
    or moves it. A failure a later move went past is not why it is where it is: an audit's
    REJECTED that a person approved and a commit task then COMMITTED links that commit try.

    Rows that say nothing about the checkpoint's state are passed over: a skipped re-run of a
    COMMITTED checkpoint, and the approval step's question (the page says that one is waiting,
    with its own link; the REJECTED verdict's try stays the one whose log says why). ``None``
    when no Airflow task touched it."""
    tasks = [t for t in history if t.dag_id and t.run_id and t.task_id]
    for t in reversed(tasks):
        if (t.detail or "").startswith((SKIPPED_RERUN, DECISION_ASKED)):
            continue
        if t.from_state != t.to_state or t.detail:
            return t
    return tasks[-1] if tasks else None


def log_link(history: list[TransitionRecord]) -> dict[str, Any] | None:
    """``{"url", "dag_id", "run_id", "task_id", "try_number", "state"}`` of :func:`failing_try`."""
    t = failing_try(history)
    if t is None:
        return None
    return {
        "url": task_log_link(t.dag_id, t.run_id, t.task_id, t.try_number),
        "dag_id": t.dag_id,
        "run_id": t.run_id,
        "task_id": t.task_id,
        "try_number": t.try_number,
        "state": t.to_state,
        "at": _iso(t.at),
    }


def decision_asked(record: CheckpointRecord, history: list[TransitionRecord]) -> TransitionRecord | None:
    """The approval step's question on a REJECTED checkpoint, as the committer table has it: the
    newest :data:`DECISION_ASKED` row a task recorded since the checkpoint last changed state
    (a decision, or a new attempt, changes it and ends the question). ``None`` for any other
    state, or when no question is recorded. Whether that task still waits is Airflow's to say."""
    if record.state is not S.REJECTED:
        return None
    for t in reversed(history):
        if t.from_state != t.to_state:
            return None
        if (t.detail or "").startswith(DECISION_ASKED) and t.dag_id and t.run_id and t.task_id:
            return t
    return None


def decision_dict(asked: TransitionRecord) -> dict[str, Any]:
    """A question waiting for a person: the task that asks, since when, and where to answer it
    (the run's *Required actions* in Airflow's UI)."""
    assert asked.dag_id and asked.run_id and asked.task_id
    return {
        "dag_id": asked.dag_id,
        "run_id": asked.run_id,
        "task_id": asked.task_id,
        "try_number": asked.try_number,
        "asked_at": _iso(asked.at),
        "question": asked.detail,
        "required_actions": required_actions_link(asked.dag_id, asked.run_id),
        "task": airflow_links(asked.dag_id, asked.run_id, asked.task_id)["task"],
    }


def _iso(value: datetime | None) -> str | None:
    return value.isoformat(timespec="milliseconds") + "Z" if value is not None else None


def _seconds(start: datetime | None, end: datetime | None) -> float | None:
    if start is None or end is None:
        return None
    return round((end - start).total_seconds(), 3)


def phases(
    record: CheckpointRecord, now: datetime | None = None, *, started_at: datetime | None = None
) -> dict[str, Any]:
    """Seconds spent writing, waiting to be durable and committing.

    A phase that has started but not finished counts up to ``now`` and is
    named in ``current``; phases never reached are ``None``. ``started_at``: when
    the row's current version began (a reprocess, see ``store.version_starts``);
    the write phase of a later version counts from there, never from the
    checkpoint's first registration.
    """
    start = started_at or record.created_at
    running = not record.state.is_final and record.state not in ERROR_STATES
    ends = (record.sealed_at, record.durable_at, record.committed_at)
    return {"started_at": _iso(start), **_timings((now or utcnow()) if running else None, start, *ends)}


def _timings(now: datetime | None, start: datetime, *ends: datetime | None) -> dict[str, Any]:
    """Seconds of each phase from ``start`` and its ``(sealed, durable, committed)`` times; with
    ``now`` (not finished), the first phase not ended counts up to it and is named in ``current``."""
    sealed, durable, committed = ends
    out: dict[str, Any] = {
        "write_s": _seconds(start, sealed),
        "durable_s": _seconds(sealed, durable),
        "commit_s": _seconds(durable, committed),
        "total_s": _seconds(start, committed),
        "current": None,
    }
    spans = (("write", start, sealed), ("durable", sealed, durable), ("commit", durable, committed))
    if now is not None:
        for name, began, ended in spans:
            if ended is None:
                out["current"], out[f"{name}_s"] = name, _seconds(began, now)
                break
    return out


#: Per pipeline: its mode and its earliest open checkpoint (what blocks a later ``append`` one).
WaitContext = dict[str, tuple[str | None, CheckpointRecord | None]]


def wait_context(store: CommitterStore, pipelines: set[str] | list[str]) -> WaitContext:
    """What :func:`checkpoint_dict` needs to tell a blocked checkpoint from a writing one,
    for every pipeline of a page in two statements (:meth:`~CommitterStore.wait_heads`)."""
    return store.wait_heads(list(pipelines))


def checkpoint_dict(
    record: CheckpointRecord,
    now: datetime | None = None,
    *,
    waits: WaitContext | None = None,
    version_started_at: datetime | None = None,
) -> dict[str, Any]:
    now = now or utcnow()
    mode, first_open = (waits or {}).get(record.pipeline, (None, None))
    waiting = wait_status(record, mode, first_open)
    current_phases = phases(record, now, started_at=version_started_at)
    if waiting is not None and waiting["status"] == "blocked":
        current_phases["current"] = "blocked"  # waiting, not writing: never counted as a running phase
    return {
        "pipeline": record.pipeline,
        "checkpoint_key": record.checkpoint_key,
        # The run's partition key as written (``münchen-ü`` for ``pk=m+C3+BCnchen-+C3+BC``);
        # None for a data-interval or explicit checkpoint key.
        "partition_key": partition_key_of_checkpoint(record.checkpoint_key),
        "sequence": record.sequence,
        "state": record.state.value,
        "attempt": record.attempt,
        "sealed_attempt": record.sealed_attempt,
        "sealed_attempt_id": record.sealed_attempt_id,
        # Reprocess: which version this is and the committed attempt it replaces.
        "version": record.version,
        "supersedes_attempt_id": record.supersedes_attempt_id,
        "rows": record.rows,
        "bytes": record.bytes,
        "committables": record.committables,
        "manifest_digest": record.manifest_digest,
        # Where its attempts are staged (None: a row from before walsink recorded it).
        "staging_root": record.staging_root,
        "start_offsets": record.start_offsets,
        "end_offsets": record.end_offsets,
        "lease_owner": record.lease_owner,
        "lease_expires_at": _iso(record.lease_expires_at),
        "error": record.error,
        # Why it does not move on although nothing failed: blocked (by which checkpoint),
        # refused (for what), with the fix; None when it is moving or done.
        "waiting": waiting,
        "dag_id": record.dag_id,
        "run_id": record.run_id,
        "created_at": _iso(record.created_at),
        "updated_at": _iso(record.updated_at),
        # How long it has been in its current state ("stuck since"): every transition sets updated_at.
        "state_since": _iso(record.updated_at),
        "age_s": _seconds(record.updated_at, now),
        "sealed_at": _iso(record.sealed_at),
        "durable_at": _iso(record.durable_at),
        "committed_at": _iso(record.committed_at),
        # Its pipeline's commit deadline (Airflow's deadline alert) passed and it is not COMMITTED or ABORTED.
        "commit_due_at": _iso(record.commit_due_at),
        "overdue": is_overdue(record, now),
        "phases": current_phases,
        # Where the current attempt's job runs when it can outlive its write task (a Spark
        # Connect session): what to look for on the server, or to stop by hand.
        "write_job": record.write_job,
        # What the commit published (target, files or snapshot), when the committer recorded it.
        "publication": getattr(record, "publication", None),
        "airflow": airflow_links(record.dag_id, record.run_id),
    }


def partition_as_written(directory: str) -> str:
    """A target partition as the page shows it: ``k=a=b`` for Spark's ``k=a%3Db``, so every
    value reads in the same characters (Spark escapes ``=`` and ``:`` but not ``ü``). Display
    only: the JSON keeps the directory as the target names it."""
    return "/".join(
        f"{column}={unescape_path_name(text)}" if sep else part
        for part in directory.split("/")
        for column, sep, text in [part.partition("=")]
    )


def timeline_order(checkpoints: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The pipeline timeline's cells, left to right: other checkpoints oldest first (sequence
    order), then a partitioned run's checkpoints in partition key order, so a backfill reads
    ``a=b``, ``eu west 1``, ``münchen-ü`` whatever order its runs registered in."""
    return sorted(
        checkpoints,
        key=lambda c: (c["partition_key"] is not None, c["partition_key"] or "", c["sequence"]),
    )


def checkpoint_dicts(store: CommitterStore, records: list[CheckpointRecord]) -> list[dict[str, Any]]:
    """:func:`checkpoint_dict` for a list: blocked-or-not and, for reprocessed checkpoints,
    the start of their current version, in a few queries for the whole list."""
    waits = wait_context(store, {r.pipeline for r in records})
    starts = store.version_starts([r.id for r in records if r.version > 1])
    now = utcnow()
    return [checkpoint_dict(r, now, waits=waits, version_started_at=starts.get(r.id)) for r in records]


def version_phases(history: list[TransitionRecord], now: datetime | None = None) -> list[dict[str, Any]]:
    """Each version's own phases, from the history: a reprocess (COMMITTED -> REGISTERED)
    starts the next version, so no version's write phase counts another version's time.

    ``[{"version", "started_at", "sealed_at", "durable_at", "committed_at", "write_s",
    "durable_s", "commit_s", "total_s", "current"}]``, oldest first; the newest version's
    unfinished phase counts up to ``now``. Empty without history (trimmed by retention).
    """
    now = now or utcnow()
    segments: list[list[TransitionRecord]] = []
    for t in history:
        if not segments or (t.from_state == S.COMMITTED.value and t.to_state == S.REGISTERED.value):
            segments.append([])
        segments[-1].append(t)
    out = []
    for number, segment in enumerate(segments, start=1):

        def last(state: CheckpointState, segment: list[TransitionRecord] = segment) -> datetime | None:
            times = [t.at for t in segment if t.to_state == state.value and t.from_state != t.to_state]
            return times[-1] if times else None

        start, sealed, durable, committed = (
            segment[0].at,
            last(S.SEALED),
            last(S.DURABLE),
            last(S.COMMITTED),
        )
        if sealed is not None and sealed < start:
            sealed = None
        newest = number == len(segments)
        state = segment[-1].to_state
        running = newest and committed is None and not S(state).is_final and state not in ERROR_STATES
        out.append(
            {
                "version": number,
                "started_at": _iso(start),
                "sealed_at": _iso(sealed),
                "durable_at": _iso(durable),
                "committed_at": _iso(committed),
                **_timings(now if running else None, start, sealed, durable, committed),
            }
        )
    return out


def version_dict(record: VersionRecord) -> dict[str, Any]:
    """An earlier committed version of a checkpoint (COMMITTED while replaced, then SUPERSEDED)."""
    return {
        "version": record.version,
        "state": record.state.value,
        "attempt": record.attempt,
        "attempt_id": record.attempt_id,
        "rows": record.rows,
        "committables": record.committables,
        "bytes": record.bytes,
        "committed_at": _iso(record.committed_at),
        "superseded_at": _iso(record.superseded_at),
        "superseded_by_attempt_id": record.superseded_by_attempt_id,
        "publication": record.publication,
        "airflow": airflow_links(record.dag_id, record.run_id),
        "dag_id": record.dag_id,
        "run_id": record.run_id,
    }


def skipped_reruns(history: list[TransitionRecord]) -> int:
    """How many re-runs of the checkpoint were skipped because it was already COMMITTED."""
    return sum(
        1 for t in history if t.from_state == t.to_state and (t.detail or "").startswith(SKIPPED_RERUN)
    )


def transition_dict(record: TransitionRecord) -> dict[str, Any]:
    out = asdict(record)
    out["at"] = _iso(record.at)
    del out["checkpoint_id"]
    out["airflow"] = airflow_links(record.dag_id, record.run_id, record.task_id, record.try_number)
    # An audit verdict's detail is its check results (JSON): also given parsed.
    out["audit"] = AuditReport.from_detail(record.detail) if record.to_state in _VERDICTS else None
    return out


_VERDICTS = frozenset(s.value for s in AUDIT_VERDICTS)


def audit_results(record: CheckpointRecord, history: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The latest audit verdict on the checkpoint's sealed attempt (given ``transition_dict`` rows):
    ``{"verdict", "at", "task_id", "summary", "checks": [{"check", "passed", "reason"}]}``, or None.

    A verdict on an earlier attempt is not shown as this attempt's. A REJECTED verdict a person
    then approved (``approve_rejected``: REJECTED -> AUDITED) carries ``approved``: that history
    row's detail (who, why), so the page never shows the rejection alone.
    """
    approved: str | None = None
    for t in reversed(history):
        audit = t.get("audit")
        if t["to_state"] == S.WRITING.value:
            return None  # a newer attempt than any verdict before this row
        if audit is None and t["from_state"] == S.REJECTED.value and t["to_state"] == S.AUDITED.value:
            approved = approved or t["detail"]
            continue
        if audit is not None and t["to_state"] in _VERDICTS:
            if record.sealed_attempt_id and audit.get("attempt_id") not in (None, record.sealed_attempt_id):
                return None
            return {
                "verdict": t["to_state"],
                "at": t["at"],
                "task_id": t["task_id"],
                "summary": audit.get("summary"),
                "passed_not_listed": audit.get("passed_not_listed", 0),
                "checks": [c for c in audit["checks"] if isinstance(c, dict)],
                "approved": approved if t["to_state"] == S.REJECTED.value else None,
            }
    return None


def pipeline_dict(
    store: CommitterStore, row: dict[str, Any], summary: dict[str, Any] | None = None
) -> dict[str, Any]:
    """A pipeline with counts per state, latest committed checkpoint and last error
    (``summary``: its :meth:`~CommitterStore.pipeline_summary`, read here if not given)."""
    summary = summary if summary is not None else store.pipeline_summary(row["name"])
    counts = {state: summary["counts"].get(state, 0) for state in STATE_ORDER}
    committed = summary["latest_committed"]
    failed = summary["last_error"]
    return {
        "pipeline": row["name"],
        "mode": row["mode"],
        "target": row["target"],
        "dag_id": row["dag_id"],
        "created_at": _iso(row["created_at"]),
        "checkpoints": sum(counts.values()),
        "counts": counts,
        # Rows retention (``walsink gc``) removed: no longer listed or counted above.
        "retired": summary.get("retired", 0),
        "latest_committed": checkpoint_dict(committed) if committed else None,
        "last_error": (
            {
                "checkpoint_key": failed.checkpoint_key,
                "partition_key": partition_key_of_checkpoint(failed.checkpoint_key),
                "sequence": failed.sequence,
                "state": failed.state.value,
                "error": failed.error,
                "at": _iso(failed.updated_at),
            }
            if failed
            else None
        ),
    }


def pipeline_dicts(store: CommitterStore, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """:func:`pipeline_dict` for a page of pipelines, summarised in two statements."""
    summaries = store.pipeline_summaries([r["name"] for r in rows])
    return [pipeline_dict(store, r, summaries[r["name"]]) for r in rows]


def pipeline_writers(store: CommitterStore, names: list[str] | None = None) -> dict[str, set[str]]:
    """Pipeline -> the DAG ids that write it: the DAG that registered the pipeline
    and every DAG that registered one of its checkpoints (all pipelines, or ``names``).

    Access is decided per pipeline on the page, never per row; the store reads the
    writers by a skip scan of the ``(pipeline, dag_id)`` index
    (:meth:`~CommitterStore.pipeline_writers`), not by reading every checkpoint.
    """
    if names is None:
        names = [p["name"] for p in store.pipelines(with_counts=False)]
    return store.pipeline_writers(list(names))


def committables(record: CheckpointRecord, staging: StagingStore) -> dict[str, Any]:
    """The committables of the checkpoint's sealed manifest, or why they cannot be shown.

    Read through the staging store of the checkpoint's recorded root (local or object
    store, opened with the walsink connection's staging credentials). ``status`` is one of
    ``available``, ``not_sealed`` (no sealed attempt yet), ``cleaned`` (committed or
    aborted and its staging already removed, as designed) and ``unavailable`` (missing,
    invalid or unreadable before commit: a problem worth a look; the message says why).
    """
    base: dict[str, Any] = {"status": None, "message": None, "items": [], "total": 0, "truncated": False}
    if record.sealed_attempt is None or record.manifest_digest is None:
        return {**base, "status": "not_sealed", "message": "No sealed attempt yet: nothing to list."}
    try:
        location = staging.attempt(
            record.pipeline, record.checkpoint_key, record.sealed_attempt, record.sealed_attempt_id
        )
        if record.state in (S.COMMITTED, S.ABORTED) and staging.describe(location, MANIFEST_NAME) is None:
            return {
                **base,
                "status": "cleaned",
                "message": f"Staging of attempt {record.sealed_attempt} was cleaned after the checkpoint was "
                f"{record.state.value.lower()}; the committer table keeps its totals "
                f"({plural(record.committables, 'committable')}, {plural(record.rows, 'row')}, "
                f"{plural(record.bytes, 'byte')}).",
            }
        manifest = staging.read_manifest(location, expected_digest=record.manifest_digest)
    except (WalsinkError, OSError) as exc:  # OSError: the store cannot be read (credentials, network)
        return {**base, "status": "unavailable", "message": plain_text(str(exc))}
    items = [c.to_json() for c in manifest.committables[:MAX_COMMITTABLES_SHOWN]]
    for item, committable in zip(items, manifest.committables, strict=False):
        item["partition"] = committable.partition_path or None
    return {
        **base,
        "status": "available",
        "message": None,
        "items": items,
        "total": len(manifest.committables),
        "truncated": len(manifest.committables) > MAX_COMMITTABLES_SHOWN,
        "attempt": manifest.attempt,
        "total_rows": manifest.total_rows,
        "total_bytes": manifest.total_bytes,
    }
