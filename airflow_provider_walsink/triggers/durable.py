"""The durability gate in the triggerer: :class:`CheckpointDurableTrigger`.

It runs :func:`~airflow_provider_walsink.triggers.durability_check.evaluate_durability` (the one
check the sensor shares) in the triggerer, and fires when the checkpoint is durable, or when its
own deadline passes with a message naming what is still missing. Started by the sensor's
``execute`` (``defer``), it hands the event back to the sensor on a worker; started by the
scheduler (the sensor's ``start_from_trigger``), it ends the task itself (``TaskSuccessEvent`` /
``TaskFailedEvent``), so the sensor never occupies a worker.

It checks when its checkpoint's row changes and every ``poke_interval`` seconds while the row
is SEALED (the staged files checked again): the triggers of one triggerer watch their rows
together, one query per walsink connection every half second (:class:`~.watch.CommitterWatch`,
in a thread, which also runs the check of a trigger whose row changed and hands it the status),
so a seal is seen within about half a second whatever the number of triggers and however busy
the loop, and a trigger whose checkpoint is still being written costs nothing more.

Nothing it does blocks the triggerer's event loop, which every deferred task of the deployment
shares (issue 46). Airflow imports this module on the loop, so it imports only the standard
library and Airflow's trigger base; the check, with every import it needs (SQLAlchemy, Alembic,
pyarrow, walsink's core), the connection lookups, the committer-table queries, the staging
listings and the checksum reads, runs in a thread pool of ``CHECK_THREADS`` threads shared
by every walsink trigger of the triggerer process (:mod:`.watch`). That bounds what hundreds of
triggers do at once, and leaves the default executor, which Airflow's own ``sync_to_async`` and
other triggers use, to them. What the checks open is shared by the process's triggers too
(:mod:`.shared`): one connection lookup per connection and minute, one committer engine per
database URL (its pool never larger than the pool of threads, kept between checks), one staging client per
root and credentials.

Off the loop is not all: a thread running Python holds the interpreter lock, and every time the
loop gives it up (a write, a wait for another thread) it must take it back from the checks
running beside it. So on the loop a trigger writes no log line (its check's thread does), starts
no thread (the pool starts all of its threads at once, :func:`~.watch.off_loop`), and never waits
for a lock a working thread holds (:class:`~.watch.CommitterWatch`). A pool thread started on the
loop while 500 triggers loaded waited 0.37 s for the lock: the blocks of 0.34 to 0.43 s that
benchmark 10 saw now and then (bench/README.md); a line written or a lock waited for on the loop
waits the same way.
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

try:
    from airflow.triggers.base import BaseTrigger, TaskFailedEvent, TaskSuccessEvent, TriggerEvent
except ImportError:  # pragma: no cover
    from airflow.sdk.bases.trigger import (  # type: ignore[no-redef]
        BaseTrigger,
        TaskFailedEvent,
        TaskSuccessEvent,
        TriggerEvent,
    )

from airflow_provider_walsink.triggers.watch import CommitterWatch, Waiter, off_loop, settle_heap, watch_for

if TYPE_CHECKING:
    from airflow_provider_walsink.core.store.records import Actor
    from airflow_provider_walsink.triggers.durability_check import DurabilityStatus

#: Names this module served before the check moved to :mod:`.durability_check`; imported from
#: there when asked for (never on the triggerer's loop).
_MOVED = {"DURABLE_OR_LATER", "DurabilityStatus", "evaluate_durability", "evaluate_with_hook"}


def __getattr__(name: str) -> Any:
    if name in _MOVED:
        from airflow_provider_walsink.triggers import durability_check

        return getattr(durability_check, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


class CheckpointDurableTrigger(BaseTrigger):
    """Fires when a checkpoint is durable (see
    :func:`~airflow_provider_walsink.triggers.durability_check.evaluate_durability`).

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
    :param poke_interval: seconds between checks while the checkpoint's row is SEALED (its staged
        files checked again) or the watch cannot read the committer table; a change of the row
        wakes the trigger at once (:class:`~.watch.CommitterWatch`).
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
        from airflow_provider_walsink.core.store.records import Actor
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
        """One check (in the pool's thread); a failure is a "not yet" naming it."""
        from airflow_provider_walsink.triggers import shared
        from airflow_provider_walsink.triggers.durability_check import DurabilityStatus, evaluate_with_hook

        try:
            # Credentials of an object-store root are read here, in the triggerer, from the
            # connections: the trigger's kwargs (stored in Airflow's database) hold only ids. The
            # hook, its lookups, engine and staging client are shared by the process's triggers.
            status = evaluate_with_hook(
                shared.hook_for(self.walsink_conn_id),
                self.staging_root or None,  # "" when rendered from a write task that pushed no root
                self.pipeline,
                key,
                actor=actor,
                verify_checksums=self.verify_checksums,
            )
        except Exception as e:  # noqa: BLE001 - e.g. database down: report, and try again
            shared.expire(self.walsink_conn_id)  # e.g. rotated credentials: look them up again
            status = DurabilityStatus(False, None, f"durability check failed: {e}")
            self.log.warning("%s", status.message)
            return status
        finally:
            settle_heap()
        # Logged here, in the check's thread, not on the loop: writing the trigger's log gives up
        # the interpreter lock, and the loop, taking it back from the checks running beside it,
        # waited for each line (issue 46: hundreds of such lines in one turn blocked it).
        self.log.info("%s%s", "" if status.durable else "not durable yet: ", status.message)
        return status

    async def run(self) -> AsyncIterator[TriggerEvent]:
        try:
            key, actor = await off_loop(self._resolve)
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
        watch = watch_for(self.walsink_conn_id)
        with watch.watching(self.pipeline, key, check=functools.partial(self._check, key, actor)) as waiter:
            checked = time.monotonic()
            status = await off_loop(self._check, key, actor)
            while not status.durable:
                due = await self._check_due(watch, key, waiter, checked, deadline)
                if due is None:
                    break
                checked = time.monotonic()
                # The watch checked when the row changed, or a check of the trigger's own is due.
                status = due if due is not True else await off_loop(self._check, key, actor)
        if status.durable:
            yield (
                TaskSuccessEvent()
                if self.end_from_trigger
                else TriggerEvent({"status": "durable", **status.to_dict()})
            )
        elif self.end_from_trigger:
            self.log.error("checkpoint not durable after %.0fs: %s", self.timeout or 0, status.message)
            yield TaskFailedEvent()
        else:
            yield TriggerEvent({"status": "timeout", **status.to_dict()})

    async def _check_due(
        self, watch: CommitterWatch, key: str, waiter: Waiter, checked: float, deadline: float | None
    ) -> DurabilityStatus | bool | None:
        """Wait until the watch hands over the status of the check it ran when the checkpoint's row
        changed (returned), or ``poke_interval`` has passed (``True``: a check is due); unless the
        watch read the row after the last check (``checked``, monotonic) and no check could pass on
        it, or a check the watch started is still running: then wait again. ``None`` once the
        deadline has passed."""
        while deadline is None or time.time() < deadline:
            wait = self.poke_interval if deadline is None else min(self.poke_interval, deadline - time.time())
            try:
                await asyncio.wait_for(waiter.event.wait(), max(0.0, wait))
            except TimeoutError:
                if waiter.pending or watch.rules_out(self.pipeline, key, since=checked):
                    continue
            waiter.event.clear()
            status = waiter.take()
            return status if status is not None else True
        return None
