"""Errors of the committer store; each message says what was refused and why."""

from __future__ import annotations

from airflow_provider_walsink.protocol.errors import FencedError, WalsinkError


class StoreError(WalsinkError):
    """A committer-store operation was refused; the message says why."""


class CheckpointNotFoundError(StoreError):
    pass


class TransitionError(StoreError):
    """The checkpoint is not in a state that allows the requested change."""


class StaleAttemptError(TransitionError):
    """An older write attempt tried to seal after a newer one started."""


class LeaseHeldError(StoreError):
    """Another committer holds a live lease on the checkpoint."""


class LeaseLostError(StoreError, FencedError):
    """The lease was taken over, released or fenced out by an abort (the epoch moved on)."""


class OrderingError(StoreError):
    """An ``append`` checkpoint must wait for an earlier one to commit (invariant 5)."""
