"""The committer table and the commit step (Airflow-free)."""

from .commit import CheckpointCommitter, CommitSummary
from .store import (
    Actor,
    AuditRejectedError,
    CheckpointNotFoundError,
    CheckpointRecord,
    CommitterStore,
    Lease,
    LeaseHeldError,
    LeaseLostError,
    NotAuditedError,
    OffsetsError,
    OrderingError,
    StaleAttemptError,
    StoreError,
    TransitionError,
)
from .writer import CheckpointWriter

__all__ = [
    "Actor",
    "AuditRejectedError",
    "CheckpointCommitter",
    "CheckpointNotFoundError",
    "CheckpointRecord",
    "CheckpointWriter",
    "CommitSummary",
    "CommitterStore",
    "Lease",
    "LeaseHeldError",
    "LeaseLostError",
    "NotAuditedError",
    "OffsetsError",
    "OrderingError",
    "StaleAttemptError",
    "StoreError",
    "TransitionError",
]
