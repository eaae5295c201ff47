"""Errors of the committer store; each message says what was refused and why."""

from __future__ import annotations

from airflow_provider_walsink.core.protocol.errors import FencedError, WalsinkError


class StoreError(WalsinkError):
    """A committer-store operation was refused; the message says why."""


class CommitterDatabaseError(StoreError):
    """The committer database cannot be used as configured (e.g. it does not exist); the
    message says what to do. Raised without the driver's exception chained: the task log
    shows the fix, not a driver traceback."""


class PipelineOwnedError(StoreError):
    """The pipeline id belongs to another DAG (recorded when it was first registered).
    Retrying does not help: rename the pipeline, or hand it over (``walsink reassign``)."""


class CheckpointNotFoundError(StoreError):
    pass


class TransitionError(StoreError):
    """The checkpoint is not in a state that allows the requested change."""


class StaleAttemptError(TransitionError):
    """An older write attempt tried to seal after a newer one started."""


class AuditRejectedError(TransitionError):
    """The checkpoint was REJECTED by its audit: it is never committed (the message names
    the failed checks). Retrying does not help; write a new attempt or abort it."""


class NotAuditedError(TransitionError):
    """The pipeline declares an audit and the checkpoint's sealed attempt has not passed it."""


class LeaseHeldError(StoreError):
    """Another committer holds a live lease on the checkpoint."""


class LeaseLostError(StoreError, FencedError):
    """The lease was taken over, released or fenced out by an abort (the epoch moved on)."""


class OrderingError(StoreError):
    """An ``append`` checkpoint must wait for an earlier one to commit (invariant 5)."""


class OffsetsError(OrderingError):
    """An ``append`` checkpoint's source offsets can never be committed as they stand.

    Not a wait: retrying the same attempt is refused again. The message names the
    cause and the way out (write it again, abort it); the refusal is recorded as
    the checkpoint's error (state unchanged).
    """


class ConsumerGroupOwnedError(PipelineOwnedError):
    """The Kafka consumer group belongs to another pipeline (recorded when that pipeline's
    source was first planned). Retrying does not help: give this pipeline its own group id."""


class ConsumerGroupMovedError(ConsumerGroupOwnedError):
    """After a commit: the Kafka consumer group the pipeline planned with was handed over to
    another pipeline since (``walsink reassign-group``), so its offsets are not sent. Retrying
    does not help; the checkpoint itself is committed."""
