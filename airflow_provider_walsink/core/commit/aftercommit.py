"""After COMMITTED: drop the publish journal and the staged attempts, fenced by the committed row.

Best effort: the commit is already recorded, so a clean-up that stops (a
racing committer, a reprocess that began meanwhile, an OS error) leaves the
rest to GC and never turns a recorded commit into a failed task.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from airflow_provider_walsink.core.commit.refusals import BAD_INPUT
from airflow_provider_walsink.core.protocol.manifest import MANIFEST_NAME, Manifest
from airflow_provider_walsink.core.protocol.states import CheckpointState
from airflow_provider_walsink.core.staging.cleanup import CleanupFencedError
from airflow_provider_walsink.core.staging.object_store import StagingStore
from airflow_provider_walsink.core.store.records import CheckpointRecord
from airflow_provider_walsink.core.store.store import CommitterStore
from airflow_provider_walsink.core.targets.base import Publisher

log = logging.getLogger(__name__)
S = CheckpointState
T = TypeVar("T")


def commit_then_follow(
    commit: Callable[[], T], follow: Callable[[], Mapping[str, Any] | None] | None
) -> tuple[T, dict[str, Any]]:
    """The commit task's sequence after the lease is asked for: the core commit, then, only once it
    returned (the checkpoint is COMMITTED, by this call or an earlier one), the source's step after
    COMMITTED (``follow``: a consumer group's offsets follow the committer table, never lead it).

    The one place this order is written: the commit operator and the model checker both call it,
    so the checker tests the order the operator runs. Returns the commit's result and what
    ``follow`` returned (summary entries; empty without a source). A commit that raises runs no
    ``follow``.
    """
    done = commit()
    extra = dict(follow() or {}) if follow is not None else {}
    return done, extra


def committed_fence(store: CommitterStore, manifest: Manifest) -> Callable[[], None]:
    """The fence of a post-commit clean-up: the row must still be COMMITTED as ``manifest``'s attempt.

    Raises :class:`CleanupFencedError` once a new version began (or committed),
    or the row is gone (retention): the version that cleans up is no longer
    the checkpoint, so nothing of the checkpoint's staging is its to delete.
    """

    def fence() -> None:
        now = store.get(manifest.pipeline, manifest.checkpoint_key)
        if now is None or now.state is not S.COMMITTED or now.sealed_attempt_id != manifest.attempt_id:
            raise CleanupFencedError(
                f"clean-up of {manifest.pipeline}/{manifest.checkpoint_key} attempt {manifest.attempt_id} "
                f"stopped: the checkpoint moved on ({'no row' if now is None else now.state}, attempt "
                f"{None if now is None else now.sealed_attempt_id}); nothing more deleted"
            )

    return fence


def finish(store: CommitterStore, staging: StagingStore, publisher: Publisher, manifest: Manifest) -> None:
    """Drop the journal and the staged attempts; best effort, the commit is already recorded.

    Racing committers (a loser finishing the cleanup, a zombie writer still
    writing) may remove or fill the directory meanwhile: that must not turn
    a recorded commit into a failed task. What is left, GC removes. Every
    deletion is fenced by :func:`committed_fence` (a reprocess may begin,
    and commit, while this process is paused) and checked against what the
    target references at that moment (:mod:`~..staging.cleanup`).
    """
    try:
        publisher.finish(manifest, staging, fence=committed_fence(store, manifest))
    except CleanupFencedError as exc:
        log.warning(
            "committed %s/%s; its clean-up stopped (left to GC): %s",
            manifest.pipeline,
            manifest.checkpoint_key,
            exc,
        )
    except Exception as exc:  # noqa: BLE001 - an OS error, or the table or its catalog unreachable
        # Nothing the commit depends on: the staging is left whole (deletions are checked against
        # the table, so one that cannot be read deletes nothing) for GC or the next ask.
        log.warning(
            "committed %s/%s, but its staging was not fully removed (GC will): %s",
            manifest.pipeline,
            manifest.checkpoint_key,
            exc,
            exc_info=not isinstance(exc, OSError),
        )


def finish_cleanup(
    store: CommitterStore, staging: StagingStore, publisher: Publisher, record: CheckpointRecord
) -> None:
    """Do the cleanup a committer killed after COMMITTED never did (harmless when done).

    Without it the publish journal outlives the commit, and if the row were
    later trimmed by retention and the key re-run, a stale journal would
    make the new publish roll back committed files.
    """
    if record.sealed_attempt is None:
        return
    try:
        location = staging.attempt(
            record.pipeline, record.checkpoint_key, record.sealed_attempt, record.sealed_attempt_id
        )
        if staging.describe(location, MANIFEST_NAME) is None:
            return  # staging is removed after the journal: nothing left to do
        manifest = staging.read_manifest(location, expected_digest=record.manifest_digest)
    except BAD_INPUT as exc:
        log.warning(
            "leaving staging of committed %s/%s alone: %s", record.pipeline, record.checkpoint_key, exc
        )
        return
    finish(store, staging, publisher, manifest)
