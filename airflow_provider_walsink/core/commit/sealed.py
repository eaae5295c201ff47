"""Reading a checkpoint's sealed attempt: the one place a committer (and an audit, an abort) finds it.

Every location is built from the committer table's identifiers inside the
staging root, never taken from a row or a manifest (invariant 6), and the
manifest read must be the sealed one (its digest) of this checkpoint's sealed
attempt.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from airflow_provider_walsink.core.protocol.errors import LayoutError, ManifestError, WalsinkError
from airflow_provider_walsink.core.protocol.manifest import Manifest
from airflow_provider_walsink.core.staging.cleanup import staged_locations
from airflow_provider_walsink.core.staging.object_store import AttemptLocation, StagingStore
from airflow_provider_walsink.core.store.records import CheckpointRecord
from airflow_provider_walsink.core.targets.base import Publisher, StagedAttempt


def read_sealed_attempt(staging: StagingStore, record: CheckpointRecord) -> tuple[Manifest, StagedAttempt]:
    """The checkpoint's sealed manifest and where its attempt is, on any staging store.

    The location is built from the record's identifiers (never taken from a row
    or a manifest), the manifest read through the store with its size cap must
    carry the sealed digest and describe this checkpoint's sealed attempt. A
    store whose root is not the one the row records is refused (``LayoutError``):
    the checkpoint's attempts are where the write phase recorded them.
    Raises ``ManifestError`` / ``LayoutError``; reads no data file.
    """
    assert record.sealed_attempt is not None and record.manifest_digest is not None
    recorded = (record.staging_root or "").rstrip("/")
    if recorded and not staging.names_root(recorded):
        raise LayoutError(
            f"checkpoint {record.pipeline}/{record.checkpoint_key} is staged under {recorded}, but the "
            f"committer was given the staging store {staging.root_uri}; open the store of the recorded root"
        )
    location = staging.attempt(
        record.pipeline, record.checkpoint_key, record.sealed_attempt, record.sealed_attempt_id
    )
    manifest = staging.read_manifest(location, expected_digest=record.manifest_digest)
    if (manifest.pipeline, manifest.checkpoint_key, manifest.attempt) != (
        record.pipeline,
        record.checkpoint_key,
        record.sealed_attempt,
    ) or (record.sealed_attempt_id and manifest.attempt_id != record.sealed_attempt_id):
        raise ManifestError(
            f"manifest {location.uri}/_manifest.json describes {manifest.pipeline}/{manifest.checkpoint_key} "
            f"attempt {manifest.attempt} ({manifest.attempt_id}), not {record.pipeline}/"
            f"{record.checkpoint_key} attempt {record.sealed_attempt} ({record.sealed_attempt_id})"
        )
    return manifest, StagedAttempt(staging, replace(location, attempt_id=manifest.attempt_id))


def publish_argument(publisher: Publisher, attempt: StagedAttempt) -> StagedAttempt | Path:
    """What ``publisher.publish`` takes as the attempt: the :class:`StagedAttempt` itself, or (a
    publisher without ``takes_staged_attempt``) its local directory (``LayoutError`` on an object store)."""
    if publisher.takes_staged_attempt:
        return attempt
    return attempt.local_dir()


def staged_attempts(
    staging: StagingStore, pipeline: str, checkpoint_key: str
) -> list[tuple[int, str | None, AttemptLocation]]:
    """The checkpoint's staged attempts as ``(number, attempt id, location)``, on any staging root
    (only names walsink gives attempts). A root that cannot be listed gives ``[]``: callers decide
    from the row alone then."""
    try:
        return [
            (loc.attempt, loc.attempt_id, loc) for loc in staged_locations(staging, pipeline, checkpoint_key)
        ]
    except (WalsinkError, OSError):
        return []
