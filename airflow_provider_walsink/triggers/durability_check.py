"""The durability gate's one check, shared by the poke sensor and the deferrable trigger.

:func:`evaluate_durability` is the one implementation: it reads the
checkpoint's row, and for a SEALED checkpoint reads the sealed manifest
(digest-checked against the committer table), checks every committable with
:func:`~airflow_provider_walsink.core.staging.durability.check_attempt` (size, and
checksum when asked), checks the manifest's totals against the counts
recorded at sealing, and then marks the checkpoint DURABLE.

It does blocking file and database I/O and imports the committer table's and the staging
stores' libraries (SQLAlchemy, Alembic, pyarrow): the trigger
(:mod:`~airflow_provider_walsink.triggers.durable`) imports this module only in its worker
threads, never on the triggerer's event loop.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

from airflow_provider_walsink.core.faults import crashpoint
from airflow_provider_walsink.core.protocol.errors import ManifestError
from airflow_provider_walsink.core.protocol.manifest import MANIFEST_NAME
from airflow_provider_walsink.core.protocol.states import VERIFIED_DURABLE, CheckpointState
from airflow_provider_walsink.core.staging.durability import check_stored_attempt
from airflow_provider_walsink.core.staging.layout import StagingLayout
from airflow_provider_walsink.core.staging.object_store import StagingStore
from airflow_provider_walsink.core.staging.resolve import staging_for, store_for
from airflow_provider_walsink.core.store.records import CheckpointRecord
from airflow_provider_walsink.core.store.store import Actor, CommitterStore, StaleAttemptError

S = CheckpointState
#: States in which the checkpoint was verified durable already (audited or rejected included).
DURABLE_OR_LATER = VERIFIED_DURABLE
#: The row states (values) in which a check could find the checkpoint durable: the watch tests
#: every watched row against them twice a second.
_CHECKABLE = frozenset({S.SEALED.value} | {s.value for s in DURABLE_OR_LATER})


@dataclass(frozen=True)
class DurabilityStatus:
    """The outcome of one check: ``durable``, the checkpoint's state and what is missing."""

    durable: bool
    state: str | None
    message: str
    attempt: int | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def evaluate_durability(
    store: CommitterStore,
    layout: StagingLayout | StagingStore | Callable[[], StagingLayout],
    pipeline: str,
    checkpoint_key: str,
    *,
    actor: Actor,
    verify_checksums: bool = False,
    record: CheckpointRecord | None = None,
) -> DurabilityStatus:
    """Check one checkpoint and mark it DURABLE when it is; never raises for "not yet".

    ``layout`` is the staging root: a local :class:`StagingLayout`, or a
    :class:`StagingStore` (any root, object stores included: sizes from one
    listing of the attempt, :func:`check_stored_attempt`).

    Not durable yet (with the reason in ``message``): not registered, still
    writing, FAILED/ABORTED, manifest missing or not matching its recorded
    digest, a committable missing or of the wrong size/checksum, or totals
    that differ from the counts recorded at sealing.

    The staged attempt is read under the checkpoint's recorded staging root
    (:meth:`CheckpointRecord.layout`); ``layout`` (or the function giving it)
    is used only for a row that records none (written before walsink
    recorded roots).

    ``record``: the checkpoint's row, when the caller has just read it (one query less per
    check); marking DURABLE compares the sealed attempt under the row's lock either way.
    """
    name = f"checkpoint {pipeline}/{checkpoint_key}"
    if record is None:
        record = store.get(pipeline, checkpoint_key)
    if record is None:
        return DurabilityStatus(False, None, f"{name} is not registered (the write task has not run)")
    if record.state in DURABLE_OR_LATER:
        return DurabilityStatus(True, record.state.value, f"{name} is {record.state}", record.sealed_attempt)

    def not_yet(message: str, attempt: int | None) -> DurabilityStatus:
        return DurabilityStatus(False, record.state.value, message, attempt)

    if record.state is not S.SEALED or record.sealed_attempt is None or record.manifest_digest is None:
        detail = f": {record.error}" if record.error else ""
        why = f"at attempt {record.attempt}, no sealed manifest yet{detail}"
        return not_yet(f"{name} is {record.state} {why}", record.attempt)
    attempt = record.sealed_attempt
    staging = store_for(record, layout)
    location = staging.attempt(pipeline, checkpoint_key, attempt, record.sealed_attempt_id)
    manifest_path = f"{location.uri}/{MANIFEST_NAME}"
    try:
        manifest = staging.read_manifest(location, expected_digest=record.manifest_digest)
    except ManifestError as e:
        return not_yet(f"{name} attempt {attempt}: {e}", attempt)
    identity = (manifest.pipeline, manifest.checkpoint_key, manifest.attempt)
    if identity != (pipeline, checkpoint_key, attempt):
        return not_yet(
            f"{name}: manifest {manifest_path} describes {identity}, not attempt {attempt}", attempt
        )
    totals = (manifest.expected_count, manifest.total_rows, manifest.total_bytes)
    recorded = (record.committables, record.rows, record.bytes)
    if totals != recorded:
        why = f"manifest totals (count, rows, bytes) {totals} differ from the sealed record {recorded}"
        return not_yet(f"{name}: {why}", attempt)
    report = check_stored_attempt(staging, manifest, location, verify_checksums=verify_checksums)
    if not report.durable:
        return not_yet(f"{name} attempt {attempt}: {report.describe()}", attempt)
    crashpoint("durable.before_mark")
    try:
        done = store.mark_durable(
            pipeline, checkpoint_key, attempt=attempt, actor=actor, detail=report.describe()
        )
    except StaleAttemptError as e:  # a newer attempt started meanwhile: check that one next time
        return not_yet(str(e), attempt)
    return DurabilityStatus(True, done.state.value, f"{name} attempt {attempt}: {report.describe()}", attempt)


def evaluate_with_hook(
    hook: Any,
    staging_root: str | None,
    pipeline: str,
    checkpoint_key: str,
    *,
    actor: Actor,
    verify_checksums: bool = False,
) -> DurabilityStatus:
    """:func:`evaluate_durability` through a :class:`~airflow_provider_walsink.hooks.walsink.WalsinkHook`.

    The staging root is the checkpoint's recorded one (else ``staging_root``, else
    the connection's). A local root is read through the file system; an object
    store (``s3://``...) through :meth:`WalsinkHook.get_staging_store`, which opens
    it with the credentials of the connection the walsink connection names, here
    (in the worker or the triggerer), so no secret is ever passed around.
    """
    store = hook.get_store()
    record = store.get(pipeline, checkpoint_key)
    layout = staging_for(record, lambda: staging_root or hook.staging_root, hook.get_staging_store)
    return evaluate_durability(
        store, layout, pipeline, checkpoint_key, actor=actor, verify_checksums=verify_checksums, record=record
    )


def checkpoint_states(
    walsink_conn_id: str, keys: list[tuple[str, str]]
) -> dict[tuple[str, str], tuple[tuple[Any, ...], bool]]:
    """The rows of ``keys`` through the triggers' shared hook of ``walsink_conn_id``, for the
    triggers' watch (``triggers/watch.py``): per registered checkpoint its fingerprint (state,
    attempt, sealed attempt) and whether a check could find it durable (SEALED, or verified
    durable already); a checkpoint not registered is left out."""
    from airflow_provider_walsink.triggers.shared import hook_for

    states = hook_for(walsink_conn_id).get_store().checkpoint_states(keys)
    return {key: (row, row[0] in _CHECKABLE) for key, row in states.items()}
