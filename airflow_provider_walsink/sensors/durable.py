"""The durability gate as a sensor: poke, reschedule or deferrable."""

from __future__ import annotations

import time
from collections.abc import Sequence
from datetime import timedelta
from typing import Any

from airflow_provider_walsink.context import actor_from_context, checkpoint_key_from_context
from airflow_provider_walsink.hooks.walsink import WalsinkHook
from airflow_provider_walsink.links import WalsinkCheckpointLink
from airflow_provider_walsink.triggers.durable import (
    CheckpointDurableTrigger,
    DurabilityStatus,
    evaluate_with_hook,
)

try:
    from airflow.sdk import BaseSensorOperator
    from airflow.sdk.exceptions import AirflowException, AirflowSensorTimeout
except ImportError:  # pragma: no cover
    from airflow.exceptions import AirflowException, AirflowSensorTimeout  # type: ignore[no-redef]
    from airflow.sensors.base import BaseSensorOperator  # type: ignore[no-redef]


class CheckpointDurableSensor(BaseSensorOperator):
    """Wait until a checkpoint's sealed attempt is durable, then mark it DURABLE.

    Durable means (one implementation for every mode,
    :func:`~airflow_provider_walsink.triggers.durable.evaluate_durability`):
    the manifest is sealed (the committer table holds its digest and the file
    matches it), every committable exists with its recorded size (and
    checksum when ``verify_checksums``), and the totals match the counts
    recorded at sealing. A checkpoint already DURABLE, AUDITED, REJECTED,
    COMMITTING or COMMITTED passes at once (a re-run after the commit deleted
    the staging area; an audit verdict is the audit task's to report).

    With ``deferrable=True`` the wait happens in the triggerer
    (:class:`~airflow_provider_walsink.triggers.durable.CheckpointDurableTrigger`)
    and frees the worker slot. On timeout the error names what is missing.

    :param pipeline: pipeline id (templated).
    :param checkpoint_key: templated; defaults to the run's data interval start.
    :param walsink_conn_id: connection to the committer database.
    :param staging_root: templated; where to look for a checkpoint whose row records no
        staging root (written before walsink recorded it); defaults to the connection's
        ``staging_root``. A root recorded by the write task always wins. An object-store root
        (``s3://``) is read with the credentials of the connection the walsink connection
        names (its extra ``staging_conn_id``), here or, deferred, in the triggerer.
    :param verify_checksums: recompute each committable's checksum too.
    :param deferrable: wait in the triggerer instead of a worker.
    :param check_before_defer: with ``deferrable``, check once in the worker first and
        finish at once when already durable (the common case), skipping the trip to the
        triggerer. A run's conf key ``walsink_check_before_defer`` (``true``/``false``)
        overrides it for that run, e.g. ``airflow backfill create ... --dag-run-conf
        '{"walsink_check_before_defer": false}'`` to hand every wait to the triggerer.
    """

    operator_extra_links = (WalsinkCheckpointLink(),)
    template_fields: Sequence[str] = ("pipeline", "checkpoint_key", "staging_root")
    ui_color = "#e8e4c5"

    def __init__(
        self,
        *,
        pipeline: str,
        checkpoint_key: str | None = None,
        walsink_conn_id: str = WalsinkHook.default_conn_name,
        staging_root: str | None = None,
        verify_checksums: bool = False,
        deferrable: bool = False,
        check_before_defer: bool = True,
        **kwargs: Any,
    ) -> None:
        kwargs.setdefault("poke_interval", 5)
        kwargs.setdefault("timeout", timedelta(hours=1))
        super().__init__(**kwargs)
        self.pipeline = pipeline
        self.checkpoint_key = checkpoint_key
        self.walsink_conn_id = walsink_conn_id
        self.staging_root = staging_root
        self.verify_checksums = verify_checksums
        self.deferrable = deferrable
        self.check_before_defer = check_before_defer
        self._last: DurabilityStatus | None = None

    def _key(self, context: Any) -> str:
        return checkpoint_key_from_context(context, self.checkpoint_key)

    def poke(self, context: Any) -> bool:
        self._last = evaluate_with_hook(
            WalsinkHook(self.walsink_conn_id),
            self.staging_root or None,  # "" when rendered from a write task that pushed no root
            self.pipeline,
            self._key(context),
            actor=actor_from_context(context),
            verify_checksums=self.verify_checksums,
        )
        self.log.info(
            "%s", self._last.message if self._last.durable else f"not durable: {self._last.message}"
        )
        return self._last.durable

    def execute(self, context: Any) -> Any:
        if not self.deferrable:
            try:
                return super().execute(context)
            except AirflowSensorTimeout as e:
                missing = self._last.message if self._last else "no check completed"
                raise AirflowSensorTimeout(f"{e} Not durable: {missing}") from None
        dag_run = context.get("dag_run")
        check_first = (getattr(dag_run, "conf", None) or {}).get(
            "walsink_check_before_defer", self.check_before_defer
        )
        if check_first and self.poke(context):  # often durable already: skip the trip to the triggerer
            return None
        actor = actor_from_context(context)
        self.defer(
            trigger=CheckpointDurableTrigger(
                pipeline=self.pipeline,
                checkpoint_key=self._key(context),
                walsink_conn_id=self.walsink_conn_id,
                staging_root=self.staging_root,
                verify_checksums=self.verify_checksums,
                poke_interval=float(self.poke_interval),
                timeout_at=time.time() + self.timeout,
                actor={
                    "name": actor.name,
                    "dag_id": actor.dag_id,
                    "run_id": actor.run_id,
                    "task_id": actor.task_id,
                    "try_number": actor.try_number,
                },
            ),
            method_name="execute_complete",
            # A backstop: the trigger reports its own timeout first, with the reason.
            timeout=timedelta(seconds=self.timeout + max(60.0, 3 * float(self.poke_interval))),
        )

    def execute_complete(self, context: Any, event: dict[str, Any] | None = None) -> None:
        if not event:
            raise AirflowException("the durability trigger returned no event")
        if event.get("status") == "durable":
            self.log.info("%s", event.get("message"))
            return None
        if event.get("status") == "timeout":
            raise AirflowSensorTimeout(
                f"checkpoint not durable after {self.timeout:.0f}s: {event.get('message')}"
            )
        raise AirflowException(f"unexpected durability event {event!r}")
