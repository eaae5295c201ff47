"""The durability gate as a sensor: poke, reschedule, deferrable, or started in the triggerer."""

from __future__ import annotations

import time
from collections.abc import Sequence
from datetime import timedelta
from typing import Any

from airflow.sdk import BaseSensorOperator

from airflow_provider_walsink.hooks.context import actor_from_context, checkpoint_key_from_context
from airflow_provider_walsink.hooks.walsink import WalsinkHook
from airflow_provider_walsink.triggers.durability_check import DurabilityStatus, evaluate_with_hook
from airflow_provider_walsink.triggers.durable import CheckpointDurableTrigger
from airflow_provider_walsink.ui.links import WalsinkCheckpointLink

try:
    from airflow.sdk.exceptions import AirflowException, AirflowSensorTimeout
except ImportError:  # Airflow 3.1 (task-sdk 1.1): still in airflow.exceptions
    from airflow.exceptions import AirflowException, AirflowSensorTimeout  # type: ignore[no-redef]
try:  # Airflow 2.10+/3: a task can start in the triggerer
    from airflow.triggers.base import StartTriggerArgs
except ImportError:  # pragma: no cover
    StartTriggerArgs = None  # type: ignore[assignment,misc]

#: The trigger's class path, as the scheduler records it for a task started from the trigger.
TRIGGER_CLASSPATH = f"{CheckpointDurableTrigger.__module__}.{CheckpointDurableTrigger.__qualname__}"


class CheckpointDurableSensor(BaseSensorOperator):
    """Wait until a checkpoint's sealed attempt is durable, then mark it DURABLE.

    Durable means (one implementation for every mode,
    :func:`~airflow_provider_walsink.triggers.durability_check.evaluate_durability`):
    the manifest is sealed (the committer table holds its digest and the file
    matches it), every committable exists with its recorded size (and
    checksum when ``verify_checksums``), and the totals match the counts
    recorded at sealing. A checkpoint already DURABLE, AUDITED, REJECTED,
    COMMITTING or COMMITTED passes at once (a re-run after the commit deleted
    the staging area; an audit verdict is the audit task's to report).

    With ``deferrable=True`` the wait happens in the triggerer
    (:class:`~airflow_provider_walsink.triggers.durable.CheckpointDurableTrigger`).
    With ``start_from_trigger=True`` it also **starts there**: the scheduler hands the task
    straight to the triggerer, which renders the templated fields, waits, and
    ends the task itself, so the sensor never takes a worker slot, not even to
    defer or to finish. That needs what the trigger is built from to be known
    when the DAG is parsed: ``pipeline``, ``checkpoint_key`` and
    ``staging_root`` plain strings or Jinja templates (``None`` for the key: the
    run's data interval, taken in the triggerer by the same rule); a template
    that pulls an XCom must say ``map_indexes=-1`` (Airflow 3.3's triggerer
    answers one XCom read, not the sequence an ``xcom_pull`` without it asks
    for, and would never finish rendering). Otherwise (an ``XComArg`` or other
    object in one of them, an ``xcom_pull`` without ``map_indexes``,
    ``start_from_trigger=False``, or an Airflow without ``StartTriggerArgs``) the
    deferrable sensor behaves as
    before: it starts on a worker, checks once there (``check_before_defer``)
    and defers.

    ``start_from_trigger`` is **on by default** (it matters only with ``deferrable``).
    Sensors ending in the triggerer end together, so the commit tasks of a parallel
    backfill start and finish together; the commit task serializes a new pipeline's
    first asset event, which Airflow 3.3 would otherwise fail one of on a unique key
    (:meth:`~airflow_provider_walsink.operators.commit.WalCommitOperator._await_first_event`).
    ``deferrable=False`` pokes on a worker (``mode="poke"`` or
    ``"reschedule"``). On timeout the error names what is missing (started from
    the trigger: in the triggerer's part of the task log).

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
    :param start_from_trigger: with ``deferrable``, start in the triggerer when the fields allow it
        (above; the default); ``False``: start on a worker and defer from there.
    :param check_before_defer: when the sensor starts on a worker and defers, check once there first and
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
        start_from_trigger: bool = True,
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
        self.start_from_trigger = bool(start_from_trigger and self._can_start_from_trigger())
        if self.start_from_trigger:
            # Set on the instance: start_trigger_args is a class attribute of BaseOperator.
            self.start_trigger_args = StartTriggerArgs(
                trigger_cls=TRIGGER_CLASSPATH,
                next_method="execute_complete",
                trigger_kwargs=self._start_trigger_kwargs(),
                # A backstop: the trigger ends the task at its own timeout first, with the reason.
                timeout=timedelta(seconds=self.timeout + max(60.0, 3 * float(self.poke_interval))),
            )

    def _can_start_from_trigger(self) -> bool:
        """Whether this sensor can start in the triggerer (class docstring): deferrable, an Airflow
        that supports it, and templated fields that are strings (rendered there) or ``None``."""
        if not self.deferrable or StartTriggerArgs is None:
            return False
        fields = (self.pipeline, self.checkpoint_key, self.staging_root)
        if not isinstance(self.pipeline, str) or not all(v is None or isinstance(v, str) for v in fields):
            return False
        # Airflow 3.3's triggerer answers one XCom read (GetXCom) but not the sequence slice an
        # xcom_pull without map_indexes asks for: rendering such a template there never returns.
        return not any(v and "xcom_pull" in v and "map_indexes" not in v for v in fields)

    def _start_trigger_kwargs(self) -> dict[str, Any]:
        """The trigger's kwargs as the scheduler stores them: the templated fields unrendered (the
        triggerer renders them), the rest plain values; actor and key come from the task instance."""
        return {
            "pipeline": self.pipeline,
            "checkpoint_key": self.checkpoint_key,
            "walsink_conn_id": self.walsink_conn_id,
            "staging_root": self.staging_root,
            "verify_checksums": self.verify_checksums,
            "poke_interval": float(self.poke_interval),
            "timeout": float(self.timeout),
            "end_from_trigger": True,
        }

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
