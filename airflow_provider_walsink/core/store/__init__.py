"""The committer table: schema and migrations, leases, transitions and queries (Airflow-free)."""

from airflow_provider_walsink.core.store.store import (
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

__all__ = [
    "Actor",
    "AuditRejectedError",
    "CheckpointNotFoundError",
    "CheckpointRecord",
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
