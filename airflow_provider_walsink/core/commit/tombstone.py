"""The abort's tombstone in a table: the table refuses every attempt a committer could still publish."""

from __future__ import annotations

from typing import Any

from airflow_provider_walsink.core.commit.sealed import staged_attempts
from airflow_provider_walsink.core.protocol.errors import WalsinkError
from airflow_provider_walsink.core.protocol.manifest import Manifest
from airflow_provider_walsink.core.staging.object_store import StagingStore
from airflow_provider_walsink.core.store.records import CheckpointRecord
from airflow_provider_walsink.core.targets._tables import CheckpointRef
from airflow_provider_walsink.core.targets.base import StagedAttempt


def tombstone_for_abort(
    publisher: Any,
    staging: StagingStore,
    record: CheckpointRecord,
    manifest: Manifest | None,
    *,
    accepted: str | None = None,
) -> str | None:
    """Make the table refuse every attempt of the checkpoint a committer could still publish.

    Called by the abort (:mod:`.abort`) after it fenced the lease holder out, for
    targets that can carry a tombstone (``capabilities.table_fence``), in both
    fencing modes: with table fencing there is no lease, and with a lease it
    closes the window between a committer's last fence check and its table
    commit. The attempts: the row's current and sealed attempts and every
    attempt staged under the checkpoint, except the committed version a
    reprocess supersedes (the table holds it: not ours to abort) and attempts
    the table holds or held (the publisher leaves those out).

    Returns the id of the attempt the table holds if it holds *any* attempt of
    the checkpoint but the committed version a reprocess supersedes (the
    checkpoint is published: the abort must refuse; not only the sealed
    attempt: a write retry after a commit that died past its table commit
    seals a new attempt while the table holds the earlier one), else ``None``
    once the tombstone is in the table (or nothing needed one). The check is
    made on the table state the tombstone's own commit is based on. ``accepted``: an attempt the
    table may hold (an earlier life's commit the abort found accounted for), treated as a
    reprocess's superseded version is: left in the table, not tombstoned, not a refusal; any other
    attempt held is. Raises the target's error when it
    cannot carry the tombstone (e.g. the table does not exist and may not be
    created): the abort must then refuse too.
    """
    ids: set[str] = {a for a in (record.attempt_id, record.sealed_attempt_id) if a}
    for _number, attempt_id, where in staged_attempts(staging, record.pipeline, record.checkpoint_key):
        if attempt_id is None:
            try:
                attempt_id = staging.read_manifest(where).attempt_id
            except (WalsinkError, OSError):
                continue  # never sealed (no manifest): nothing a committer could publish
        ids.add(attempt_id)
    superseded = accepted or record.supersedes_attempt_id
    ids.discard(superseded or "")
    if not ids:
        return None
    create_from = None
    if manifest is not None:
        # The table is created from the staged files, read through the store that holds them (its
        # credentials), as a publish reads them.
        location = staging.attempt(
            record.pipeline, record.checkpoint_key, manifest.attempt, manifest.attempt_id
        )
        create_from = (manifest, StagedAttempt(staging, location))
    ref = CheckpointRef(record.pipeline, record.checkpoint_key, record.sealed_attempt_id or "")
    return publisher.tombstone(ref, frozenset(ids), superseded=superseded, create_from=create_from)
