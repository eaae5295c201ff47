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
recorded, and the target is unchanged; unless the target already holds that
very attempt (``published_attempt``: a try killed after its table commit or SQL
transaction, the table maybe compacted since): it published the bytes as they
were then, so a change to the staged bytes after that is not what the target
shows, and the retry goes on to record what the target holds (a refusal would
leave the checkpoint FAILED for ever, its data visible). The target is asked
only on a mismatch. A committable missing from staging is
left to the publisher: the file target moves committables into the target,
so after a crash some are there already, and every publisher refuses one that
is in neither place. A committable without a recorded checksum is not checked.
"""

from __future__ import annotations

import logging

from airflow_provider_walsink.core.commit.sealed import read_sealed_attempt
from airflow_provider_walsink.core.protocol.errors import ChecksumMismatchError
from airflow_provider_walsink.core.protocol.manifest import Manifest
from airflow_provider_walsink.core.staging.durability import DurabilityReport, check_stored_attempt
from airflow_provider_walsink.core.staging.object_store import StagingStore
from airflow_provider_walsink.core.store.records import CheckpointRecord
from airflow_provider_walsink.core.targets.base import Publisher, StagedAttempt

log = logging.getLogger(__name__)


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
    staging: StagingStore,
    record: CheckpointRecord,
    *,
    verify_checksums: bool,
    publisher: Publisher | None = None,
) -> tuple[Manifest, StagedAttempt]:
    """:func:`~.sealed.read_sealed_attempt`, then (``verify_checksums``) :func:`verify_staged_checksums`:
    step 3 of the commit sequence, for a single commit and for every member of a group. A
    mismatch is not raised when ``publisher`` holds the attempt already (module docstring)."""
    manifest, attempt = read_sealed_attempt(staging, record)
    if verify_checksums:
        try:
            verify_staged_checksums(manifest, attempt)
        except ChecksumMismatchError:
            if publisher is None or publisher.published_attempt(manifest) != manifest.attempt_id:
                raise
            log.warning(
                "checkpoint %s/%s: staged bytes of attempt %s changed after the target published it; "
                "the target holds it as published: recorded, not refused",
                manifest.pipeline,
                manifest.checkpoint_key,
                manifest.attempt_id,
            )
    return manifest, attempt
