"""``verify_checksums``: the one check of a sealed attempt's bytes before any target publishes it.

The durability gate verified the staged committables when it marked the
checkpoint DURABLE; the commit may run much later. With ``verify_checksums``
the commit sequence recomputes, through the staging store (``checksum``:
streamed locally, read from the object store), the checksum of every staged
committable of the sealed attempt and compares it with the one the sealed
manifest records, after reading the sealed attempt (step 3 of
:class:`~.commit.CheckpointCommitter`) and before anything is published, alone
or in a group (:mod:`.group`). It is the same check for every target kind
(files, Iceberg, Delta, SQL) and every staging store (local, object store):
publishers never do it themselves.

A mismatch raises :class:`~..protocol.errors.ChecksumMismatchError` (bad input,
:data:`~.refusals.BAD_INPUT`): the checkpoint stays uncommitted with the error
recorded, and the target is unchanged. A committable missing from staging is
left to the publisher: the file target moves committables into the target,
so after a crash some are there already, and every publisher refuses one that
is in neither place. A committable without a recorded checksum is not checked.
"""

from __future__ import annotations

from airflow_provider_walsink.core.commit.sealed import read_sealed_attempt
from airflow_provider_walsink.core.protocol.errors import ChecksumMismatchError
from airflow_provider_walsink.core.protocol.manifest import Manifest
from airflow_provider_walsink.core.staging.durability import DurabilityReport, check_stored_attempt
from airflow_provider_walsink.core.staging.object_store import StagingStore
from airflow_provider_walsink.core.store.records import CheckpointRecord
from airflow_provider_walsink.core.targets.base import StagedAttempt


def verify_staged_checksums(manifest: Manifest, attempt: StagedAttempt) -> None:
    """Raise :class:`ChecksumMismatchError` naming every staged committable whose bytes (size or
    checksum) no longer match ``manifest`` (module docstring); reads every staged committable."""
    report = check_stored_attempt(attempt.store, manifest, attempt.location, verify_checksums=True)
    changed = DurabilityReport(
        checked=report.checked, wrong_size=report.wrong_size, wrong_checksum=report.wrong_checksum
    )
    if changed.durable:
        return
    raise ChecksumMismatchError(
        f"checkpoint {manifest.pipeline}/{manifest.checkpoint_key} attempt {manifest.attempt} "
        f"({manifest.attempt_id}) is refused, nothing was published: staged bytes changed after the "
        f"manifest was sealed (verify_checksums): {changed.describe()}"
    )


def read_verified_attempt(
    staging: StagingStore, record: CheckpointRecord, *, verify_checksums: bool
) -> tuple[Manifest, StagedAttempt]:
    """:func:`~.sealed.read_sealed_attempt`, then (``verify_checksums``) :func:`verify_staged_checksums`:
    step 3 of the commit sequence, for a single commit and for every member of a group."""
    manifest, attempt = read_sealed_attempt(staging, record)
    if verify_checksums:
        verify_staged_checksums(manifest, attempt)
    return manifest, attempt
