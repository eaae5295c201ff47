"""Checkpoint states and the transitions the committer table allows.

The life cycle is DESIGN.md's::

    REGISTERED -> WRITING -> SEALED -> DURABLE -> [AUDITED] -> COMMITTING -> COMMITTED
                     \\          \\         \\           \\             \\
                      +----------+---------+-----------+-------------+--> FAILED / ABORTED / REJECTED

AUDITED and REJECTED are the optional audit gate (write-audit-publish): a
pipeline that declares an audit publishes only an AUDITED checkpoint, and a
REJECTED one (its staged data failed a check) is never published by itself: a
new write attempt, an abort, or a person's recorded approval (REJECTED ->
AUDITED, :meth:`~..store.verdicts.AuditVerdicts.approve_rejected`, the
pipeline's ``audit_approval`` step) leaves REJECTED.

A reprocess (``reprocess="replace"``) starts a new *version* of a COMMITTED
checkpoint: the row goes back to REGISTERED under the same key, and the
published version is kept in the version table, COMMITTED until the new
version commits and SUPERSEDED from then on (with a link to its successor).

ABORTED (``walsink abort``, the UI's Abort button) ends a checkpoint's current
attempt for good: that attempt is never committed. A COMMITTING checkpoint
becomes ABORTED only through the abort's own lease (``core/commit/abort.py``:
the holder is fenced out first and the target is checked). A later run may
start a *new* write attempt of an ABORTED checkpoint (ABORTED -> WRITING);
nothing else leaves ABORTED, so the aborted attempt itself never goes on to
DURABLE, COMMITTING or COMMITTED.
"""

from __future__ import annotations

import enum


class CheckpointState(enum.StrEnum):
    REGISTERED = "REGISTERED"
    WRITING = "WRITING"
    SEALED = "SEALED"
    DURABLE = "DURABLE"
    #: The sealed attempt's staged data passed the pipeline's audit.
    AUDITED = "AUDITED"
    COMMITTING = "COMMITTING"
    COMMITTED = "COMMITTED"
    FAILED = "FAILED"
    ABORTED = "ABORTED"
    #: The sealed attempt's staged data failed the audit (``error`` names the failed checks).
    REJECTED = "REJECTED"
    #: A committed version replaced by a newer version of the same checkpoint (version table only).
    SUPERSEDED = "SUPERSEDED"

    @property
    def is_final(self) -> bool:
        """Done: nothing more happens to the checkpoint unless a new run starts it again
        (a reprocess of a COMMITTED one, a new write attempt of an ABORTED one)."""
        return self in (CheckpointState.COMMITTED, CheckpointState.ABORTED, CheckpointState.SUPERSEDED)


S = CheckpointState

#: Which states each state may move to. A new write attempt may start from any
#: state that has not begun publishing, so a cleared write task supersedes an
#: earlier sealed attempt (only the newest sealed attempt ever counts).
TRANSITIONS: dict[CheckpointState, frozenset[CheckpointState]] = {
    S.REGISTERED: frozenset({S.WRITING, S.FAILED, S.ABORTED}),
    S.WRITING: frozenset({S.WRITING, S.SEALED, S.FAILED, S.ABORTED}),
    S.SEALED: frozenset({S.WRITING, S.DURABLE, S.FAILED, S.ABORTED}),
    S.DURABLE: frozenset({S.WRITING, S.DURABLE, S.AUDITED, S.REJECTED, S.COMMITTING, S.FAILED, S.ABORTED}),
    S.AUDITED: frozenset({S.WRITING, S.COMMITTING, S.FAILED, S.ABORTED}),
    # ABORTED only under the abort's own lease, after the holder was fenced out.
    S.COMMITTING: frozenset({S.COMMITTING, S.COMMITTED, S.FAILED, S.ABORTED}),
    # Only a reprocess leaves COMMITTED (store.begin_version): a new version starts.
    S.COMMITTED: frozenset({S.REGISTERED}),
    # A failed checkpoint is never lost: it can be written again, or, if it was
    # durable before it failed, audited and committed again once the cause is fixed.
    S.FAILED: frozenset({S.WRITING, S.DURABLE, S.AUDITED, S.REJECTED, S.COMMITTING, S.FAILED, S.ABORTED}),
    # A later run starts a fresh attempt; the aborted attempt is never committed as-is.
    S.ABORTED: frozenset({S.WRITING}),
    # Its data failed the audit: never committed as it is; a fixed job writes a new attempt, or
    # a person approves the rejected attempt with a recorded reason (-> AUDITED; verdicts.py).
    S.REJECTED: frozenset({S.WRITING, S.ABORTED, S.AUDITED}),
    S.SUPERSEDED: frozenset(),
}

#: States in which the sealed attempt was verified durable already (the
#: durability gate passes at once; an audit verdict does not undo durability).
VERIFIED_DURABLE = frozenset({S.DURABLE, S.AUDITED, S.REJECTED, S.COMMITTING, S.COMMITTED})
#: States a commit may take the lease from (FAILED only if it was durable before).
COMMITTABLE = frozenset(s for s, nxt in TRANSITIONS.items() if S.COMMITTING in nxt)
#: Audit verdicts: each names the sealed attempt it judged in its history row.
AUDIT_VERDICTS = frozenset({S.AUDITED, S.REJECTED})
#: States shown as a pipeline's "last error". Not ABORTED: an abort is a person's decision,
#: recorded with its reason, not an error to look into.
ERROR_STATES = frozenset({S.FAILED, S.REJECTED})
