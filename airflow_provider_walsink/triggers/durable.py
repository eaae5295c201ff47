"""The durability gate, shared by the poke sensor and the deferrable trigger.

:func:`evaluate_durability` is the one implementation: it reads the
checkpoint's row, and for a SEALED checkpoint reads the sealed manifest
(digest-checked against the committer table), checks every committable with
:func:`~airflow_provider_walsink.core.staging.durability.check_attempt` (size, and
checksum when asked), checks the manifest's totals against the counts
recorded at sealing, and then marks the checkpoint DURABLE.

:class:`CheckpointDurableTrigger` runs it in a thread (``asyncio.to_thread``:
it does blocking file and database I/O) every ``poke_interval`` seconds in the
triggerer, and fires when the checkpoint is durable, or when its own deadline
passes with a message naming what is still missing. Started by the sensor's
``execute`` (``defer``), it hands the event back to the sensor on a worker;
started by the scheduler (the sensor's ``start_from_trigger``), it ends the
task itself (``TaskSuccessEvent`` / ``TaskFailedEvent``), so the sensor never
occupies a worker.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
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
from airflow_provider_walsink.core.store.store import Actor, CommitterStore, StaleAttemptError

try:
    from airflow.triggers.base import BaseTrigger, TaskFailedEvent, TaskSuccessEvent, TriggerEvent
except ImportError:  # pragma: no cover
    from airflow.sdk.bases.trigger import (  # type: ignore[no-redef]
        BaseTrigger,
        TaskFailedEvent,
        TaskSuccessEvent,
        TriggerEvent,
    )

S = CheckpointState
#: States in which the checkpoint was verified durable already (audited or rejected included).
DURABLE_OR_LATER = VERIFIED_DURABLE


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
    """
    name = f"checkpoint {pipeline}/{checkpoint_key}"
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
        store, layout, pipeline, checkpoint_key, actor=actor, verify_checksums=verify_checksums
    )


class CheckpointDurableTrigger(BaseTrigger):
    """Fires when a checkpoint is durable (see :func:`evaluate_durability`).

    Events: ``{"status": "durable", ...}`` or, once ``timeout_at`` (epoch
    seconds) has passed, ``{"status": "timeout", "message": <what is missing>}``.
    With ``end_from_trigger``, a ``TaskSuccessEvent`` or ``TaskFailedEvent``
    instead, which ends the task in the triggerer (the timeout's reason is in
    the trigger's log, which the task's log shows).

    :param pipeline: pipeline id.
    :param checkpoint_key: the checkpoint; ``None``: the run's, from the task instance the
        triggerer attaches (started from the trigger: :func:`checkpoint_key_from_context`, the
        one rule the other tasks use).
    :param walsink_conn_id: connection to the committer database.
    :param staging_root: staging root of a checkpoint whose row records none (written before
        walsink recorded roots), or ``None`` for the connection's; a recorded root always wins.
        An object-store root is opened in the triggerer with the credentials of the connection
        the walsink connection names (:meth:`WalsinkHook.get_staging_store`): the trigger's
        kwargs, stored in Airflow's database, never hold a secret.
    :param verify_checksums: also recompute every committable's checksum.
    :param poke_interval: seconds between checks.
    :param timeout_at: epoch seconds after which the trigger gives up, or ``None``.
    :param timeout: seconds after its first check after which the trigger gives up (when
        ``timeout_at`` is not known: started from the trigger), or ``None``.
    :param actor: who marks the checkpoint DURABLE (``Actor`` fields); ``None``: the task
        instance the triggerer attaches (its dag, run, task and try), else ``walsink-triggerer``.
    :param end_from_trigger: end the task from the triggerer instead of resuming it on a worker.
    """

    def __init__(
        self,
        *,
        pipeline: str,
        checkpoint_key: str,
        walsink_conn_id: str = "walsink_default",
        staging_root: str | None = None,
        verify_checksums: bool = False,
        poke_interval: float = 5.0,
        timeout_at: float | None = None,
        actor: dict[str, Any] | None = None,
        timeout: float | None = None,
        end_from_trigger: bool = False,
    ) -> None:
        super().__init__()
        self.pipeline = pipeline
        self.checkpoint_key = checkpoint_key
        self.walsink_conn_id = walsink_conn_id
        self.staging_root = staging_root
        self.verify_checksums = verify_checksums
        self.poke_interval = poke_interval
        self.timeout_at = timeout_at
        self.actor = dict(actor) if actor else None
        self.timeout = timeout
        self.end_from_trigger = end_from_trigger

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (
            f"{type(self).__module__}.{type(self).__qualname__}",
            {
                "pipeline": self.pipeline,
                "checkpoint_key": self.checkpoint_key,
                "walsink_conn_id": self.walsink_conn_id,
                "staging_root": self.staging_root,
                "verify_checksums": self.verify_checksums,
                "poke_interval": self.poke_interval,
                "timeout_at": self.timeout_at,
                "actor": self.actor,
                "timeout": self.timeout,
                "end_from_trigger": self.end_from_trigger,
            },
        )

    def _resolve(self) -> tuple[str, Actor]:
        """The checkpoint key and the actor: given, else from the task instance the triggerer attached.

        Raises ``RunIntervalError`` (the run has no interval walsink can take as its own).
        """
        from airflow_provider_walsink.hooks.context import actor_from_context, checkpoint_key_from_context

        ti = self.task_instance
        key = self.checkpoint_key
        if not key:
            get_context = getattr(ti, "get_template_context", None)
            if get_context is None:
                raise ValueError(
                    "the durability trigger has no checkpoint key and no task instance to take it from"
                )
            key = checkpoint_key_from_context(get_context())
        if self.actor:
            actor = Actor(**self.actor)
        elif ti is not None and getattr(ti, "run_id", None):
            actor = actor_from_context({"ti": ti})
        else:
            actor = Actor(name="walsink-triggerer")
        return key, actor

    def _check(self, key: str, actor: Actor) -> DurabilityStatus:
        from airflow_provider_walsink.hooks.walsink import WalsinkHook

        # Credentials of an object-store root are read here, in the triggerer, from the
        # connections: the trigger's kwargs (stored in Airflow's database) hold only ids.
        return evaluate_with_hook(
            WalsinkHook(self.walsink_conn_id),
            self.staging_root or None,  # "" when rendered from a write task that pushed no root
            self.pipeline,
            key,
            actor=actor,
            verify_checksums=self.verify_checksums,
        )

    async def run(self) -> AsyncIterator[TriggerEvent]:
        try:
            key, actor = await asyncio.to_thread(self._resolve)
        except Exception as e:  # noqa: BLE001 - no interval walsink can take: nothing to wait for
            self.log.error("cannot tell which checkpoint to wait for: %s", e)
            yield (
                TaskFailedEvent()
                if self.end_from_trigger
                else TriggerEvent({"status": "error", "message": str(e)})
            )
            return
        deadline = self.timeout_at
        if deadline is None and self.timeout is not None:
            deadline = time.time() + self.timeout
        while True:
            try:
                status = await asyncio.to_thread(self._check, key, actor)
            except Exception as e:  # noqa: BLE001 - e.g. database down: report, and try again
                status = DurabilityStatus(False, None, f"durability check failed: {e}")
                self.log.warning("%s", status.message)
            if status.durable:
                self.log.info("%s", status.message)
                yield (
                    TaskSuccessEvent()
                    if self.end_from_trigger
                    else TriggerEvent({"status": "durable", **status.to_dict()})
                )
                return
            self.log.info("not durable yet: %s", status.message)
            if deadline is not None and time.time() >= deadline:
                if self.end_from_trigger:
                    self.log.error(
                        "checkpoint not durable after %.0fs: %s", self.timeout or 0, status.message
                    )
                    yield TaskFailedEvent()
                else:
                    yield TriggerEvent({"status": "timeout", **status.to_dict()})
                return
            await asyncio.sleep(self.poke_interval)
