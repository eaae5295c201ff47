"""Why a checkpoint is not committed: classifying, describing and recording a refusal or a failure.

Every commit path (lease or table fencing, alone or in a group) words and
records its errors through these, so the committer table says the same thing
whichever path refused.
"""

from __future__ import annotations

import logging

from airflow_provider_walsink.core.protocol.errors import (
    CommittableError,
    InvalidIdentifierError,
    LayoutError,
    ManifestError,
    OrderError,
    PathEscapeError,
    SupersedeError,
    TargetStateError,
)
from airflow_provider_walsink.core.protocol.states import CheckpointState
from airflow_provider_walsink.core.store.records import Actor, CheckpointRecord
from airflow_provider_walsink.core.store.store import CommitterStore

log = logging.getLogger(__name__)
S = CheckpointState

#: Errors caused by what is on disk: recorded on the checkpoint, which stays uncommitted.
BAD_INPUT = (
    ManifestError,
    PathEscapeError,
    CommittableError,
    InvalidIdentifierError,
    LayoutError,
    OrderError,
    SupersedeError,
    TargetStateError,
)


def explain_not_committable(record: CheckpointRecord) -> str:
    """Say, for a user, why a checkpoint cannot be committed yet."""
    name = f"checkpoint {record.pipeline}/{record.checkpoint_key}"
    match record.state:
        case S.REGISTERED:
            return f"{name} is not durable: its write phase has not started (no attempt, no manifest)"
        case S.WRITING:
            return f"{name} is not durable: attempt {record.attempt} is still writing; no sealed manifest yet"
        case S.SEALED:
            return (
                f"{name} is not durable: attempt {record.sealed_attempt} sealed its manifest but its "
                f"{record.committables} committables have not been verified (run the durability sensor)"
            )
        case S.FAILED:
            return f"{name} is not durable: it FAILED before it was verified: {record.error}"
        case S.ABORTED:
            return (
                f"{name} was ABORTED ({record.error}): its attempt {record.attempt} will never be "
                "committed; a new run of its write task starts a fresh attempt"
            )
        case S.REJECTED:
            return f"{name} was REJECTED by its audit and will never be committed: {record.error}"
    return f"{name} is {record.state}"


def describe_error(exc: BaseException) -> str:
    """The error recorded on a checkpoint that could not be committed (an OS error says so)."""
    text = str(exc).strip() or type(exc).__name__
    if isinstance(exc, OSError) and not isinstance(exc, BAD_INPUT):
        return f"{type(exc).__name__} while publishing: {text}"
    return text


def record_refusal(store: CommitterStore, pipeline: str, key: str, exc: Exception, actor: Actor) -> None:
    """Record an :class:`OffsetsError` on the checkpoint (state unchanged), keeping the original error."""
    try:
        store.record_refusal(pipeline, key, actor=actor, error=str(exc))
    except Exception as failure:  # noqa: BLE001 - keep the original error
        log.warning("could not record the refusal of %s/%s: %s", pipeline, key, failure)
