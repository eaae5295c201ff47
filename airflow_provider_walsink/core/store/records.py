"""What the committer store returns: checkpoints, transitions, leases, and who acts."""

from __future__ import annotations

import json
import os
import secrets
import socket
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from datetime import UTC, datetime
from typing import Any

from airflow_provider_walsink.core.protocol.states import CheckpointState
from airflow_provider_walsink.core.staging.layout import StagingLayout
from airflow_provider_walsink.core.staging.resolve import staging_for
from airflow_provider_walsink.core.store.models import plain_text

S = CheckpointState


@dataclass(frozen=True)
class Actor:
    """Who makes a transition: a free-form name plus the Airflow task instance, if any."""

    name: str
    dag_id: str | None = None
    run_id: str | None = None
    task_id: str | None = None
    try_number: int | None = None
    #: Unique per task try (and per process): ``lease_owner`` below. Two tries
    #: of one task never share it, so try 2 cannot adopt try 1's live lease.
    instance: str = field(default_factory=lambda: new_instance_id())

    @classmethod
    def local(cls, label: str = "walsink") -> Actor:
        return cls(name=f"{label}@{socket.gethostname()}:{os.getpid()}")

    @property
    def lease_owner(self) -> str:
        """The name a lease is taken under: who acts plus this try's unique instance id."""
        suffix = f"#{self.instance}"
        return self.name[: 255 - len(suffix)] + suffix


def new_instance_id(task_instance_id: object = None, try_number: int | None = None) -> str:
    """A lease owner suffix unique to this process and try: ti id, try, host, pid, random part."""
    parts = []
    if task_instance_id is not None:
        parts.append(f"ti={task_instance_id}")
    if try_number is not None:
        parts.append(f"try={try_number}")
    parts.append(f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(4)}")
    return "/".join(parts)


@dataclass(frozen=True)
class CheckpointRecord:
    id: int
    pipeline: str
    checkpoint_key: str
    sequence: int
    state: CheckpointState
    attempt: int
    sealed_attempt: int | None
    manifest_uri: str | None
    manifest_digest: str | None
    committables: int | None
    rows: int | None
    bytes: int | None
    start_offsets: dict[str, Any] | None
    end_offsets: dict[str, Any] | None
    lease_owner: str | None
    lease_expires_at: datetime | None
    lease_epoch: int
    attempt_id: str | None
    sealed_attempt_id: str | None
    publication: dict[str, Any] | None
    error: str | None
    dag_id: str | None
    run_id: str | None
    created_at: datetime
    updated_at: datetime
    sealed_at: datetime | None
    durable_at: datetime | None
    committed_at: datetime | None
    #: Reprocess: this row's version, the run that started it, and the attempt id
    #: of the committed version it replaces (None for a first version).
    version: int = 1
    version_token: str | None = None
    supersedes_attempt_id: str | None = None
    #: The staging root every attempt of this checkpoint is staged under, as the write
    #: phase used it; None on rows written before walsink recorded it (see :meth:`layout`).
    staging_root: str | None = None
    #: Where the current attempt's job runs when it can outlive its worker (``JobRunner.job_ref``).
    write_job: dict[str, Any] | None = None
    #: The commit deadline Airflow's deadline alert found missed for this version (naive
    #: UTC; None: none missed, or no deadline). See :mod:`.deadlines`.
    commit_due_at: datetime | None = None

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> CheckpointRecord:
        values = {name: row[name] for name in _RECORD_FIELDS}
        values["state"] = CheckpointState(values["state"])
        values["error"] = plain_text(values["error"])  # also as just written, not only as read back
        for key in ("start_offsets", "end_offsets", "publication", "write_job"):
            values[key] = json.loads(values[key]) if values[key] is not None else None
        return cls(**values)

    @property
    def is_committed(self) -> bool:
        return self.state is S.COMMITTED

    def layout(self, fallback: StagingLayout | Callable[[], StagingLayout]) -> StagingLayout:
        """Where this checkpoint's attempts are staged: the one place every reader looks.

        The recorded :attr:`staging_root` when there is one (it wins over any
        connection, target or operator setting: that is where the write phase
        put the data). Only for a row written before walsink recorded it
        (``None``) is ``fallback`` used: a layout, or a function giving one
        (called only then, so a costly derivation, such as resolving a table
        target, is skipped for recorded rows).

        Raises ``ValueError`` for a recorded root this walsink cannot read
        through the file system (an object-store URI: see
        :func:`~airflow_provider_walsink.core.staging.layout.staging_path`).
        """
        # No store opener: a URI root raises ValueError here, as this gives local layouts only.
        return staging_for(self, fallback)  # type: ignore[return-value]


_RECORD_FIELDS = tuple(f.name for f in fields(CheckpointRecord))


@dataclass(frozen=True)
class VersionRecord:
    """A committed version of a checkpoint that a reprocess replaced, or is replacing.

    ``state`` is COMMITTED while its successor is being written (its data is
    what readers see) and SUPERSEDED once the successor committed
    (``superseded_by_attempt_id`` names it).
    """

    id: int
    checkpoint_id: int
    version: int
    state: CheckpointState
    attempt: int | None
    attempt_id: str | None
    version_token: str | None
    manifest_digest: str | None
    committables: int | None
    rows: int | None
    bytes: int | None
    start_offsets: dict[str, Any] | None
    end_offsets: dict[str, Any] | None
    publication: dict[str, Any] | None
    dag_id: str | None
    run_id: str | None
    committed_at: datetime | None
    superseded_at: datetime | None
    superseded_by_attempt_id: str | None

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> VersionRecord:
        values = {f.name: row[f.name] for f in fields(cls)}
        values["state"] = CheckpointState(values["state"])
        for key in ("start_offsets", "end_offsets", "publication"):
            values[key] = json.loads(values[key]) if values[key] is not None else None
        return cls(**values)


@dataclass(frozen=True)
class TransitionRecord:
    id: int
    checkpoint_id: int
    from_state: str | None
    to_state: str
    attempt: int
    at: datetime
    actor: str | None
    dag_id: str | None
    run_id: str | None
    task_id: str | None
    try_number: int | None
    detail: str | None


@dataclass(frozen=True)
class Lease:
    """A committer's right to publish one checkpoint until ``expires_at`` (naive UTC, database clock).

    ``epoch`` is the fencing token: every lease take bumps the checkpoint's
    epoch, and every change made under a lease is a compare-and-set on it.
    """

    pipeline: str
    checkpoint_key: str
    owner: str
    expires_at: datetime
    epoch: int = 0
    taken_over_from: str | None = None
    #: The checkpoint as the lease left it (COMMITTING, this owner), so the
    #: committer needs no second read of the row it just locked.
    record: CheckpointRecord | None = field(default=None, compare=False, repr=False)


def utcnow() -> datetime:
    return datetime.now(UTC).replace(tzinfo=None)
