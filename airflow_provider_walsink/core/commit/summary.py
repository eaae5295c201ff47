"""What a commit did: the :class:`CommitSummary` returned to Airflow, and the publication it records."""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from typing import Any

from airflow_provider_walsink.core.store.records import CheckpointRecord
from airflow_provider_walsink.core.targets.base import Publisher, PublishResult

#: How many published file names the committer table keeps per checkpoint (the UI shows them).
PUBLICATION_FILES = 1000


@dataclass
class CommitSummary:
    """What a commit did, as returned to Airflow (XCom) or printed by the CLI."""

    pipeline: str
    checkpoint_key: str
    sequence: int
    attempt: int | None
    state: str
    already_committed: bool
    attempt_id: str | None = None
    published: int = 0
    already_published: int = 0
    committables: int | None = None
    rows: int | None = None
    bytes: int | None = None
    partitions_replaced: list[str] = field(default_factory=list)
    lease_taken_over_from: str | None = None
    end_offsets: dict[str, Any] | None = None
    seconds: float = 0.0
    #: A group commit: its leader's checkpoint key, then every member published with it.
    group: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def summarize(record: CheckpointRecord, *, already: bool, started: float) -> CommitSummary:
    """The summary of ``record`` as committed; ``started``: ``time.monotonic()`` when the commit began."""
    same = ("pipeline", "checkpoint_key", "sequence", "committables", "rows", "bytes", "end_offsets")
    return CommitSummary(
        **{name: getattr(record, name) for name in same},
        attempt=record.sealed_attempt,
        attempt_id=record.sealed_attempt_id,
        state=record.state.value,
        already_committed=already,
        seconds=round(time.monotonic() - started, 3),
    )


def with_result(summary: CommitSummary, result: PublishResult) -> CommitSummary:
    """``summary`` with what this publish did to the target."""
    summary.published, summary.already_published = result.published, result.already
    summary.partitions_replaced = result.partitions_replaced
    return summary


def publication(publisher: Publisher, result: PublishResult) -> dict[str, Any]:
    """What the committer table records of a publish (the UI shows it)."""
    return {
        "target": publisher.describe(),
        "kind": publisher.kind,
        "outcome": result.outcome.value,
        "snapshot": result.snapshot,
        "files": result.target_files[:PUBLICATION_FILES],
        "files_total": len(result.target_files),
        "partitions_replaced": result.partitions_replaced,
    }
