"""The publisher contract (Flink's ``Committer.commit``)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from airflow_provider_walsink.protocol.manifest import Manifest


@dataclass
class PublishResult:
    """What one ``publish`` call did; a re-run after a full publish reports only ``already``."""

    published: int = 0
    already: int = 0
    partitions_replaced: list[str] = field(default_factory=list)
    files_rolled_back: int = 0
    target_files: list[str] = field(default_factory=list)


class Publisher(Protocol):
    """Makes a sealed attempt's committables visible in a target, exactly once.

    ``publish(manifest, attempt_dir)`` may be called any number of times for
    the same sealed attempt, by the same or another committer, after a crash
    at any point: every step already done is recognised and skipped, so the
    target ends with each committable once. Before changing the target it
    checks that every committable can be published (staged with the recorded
    size, or already in place); if one cannot, it raises
    :class:`~airflow_provider_walsink.protocol.errors.CommittableError` and
    the target is unchanged. A publish of a newer attempt of the same
    checkpoint first removes what an older attempt had published.
    ``keep_alive`` is called between steps so the caller can renew its lease
    (and abort by raising). ``forget`` drops the publisher's own bookkeeping
    for a checkpoint once the commit is recorded.
    """

    def publish(
        self, manifest: Manifest, attempt_dir: Path, *, keep_alive: Callable[[], None] | None = None
    ) -> PublishResult: ...

    def forget(self, manifest: Manifest) -> None: ...
