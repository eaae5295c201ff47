"""The audit task: check a durable checkpoint's staged data before it is published."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from airflow.sdk import BaseOperator

try:
    from airflow.sdk.exceptions import AirflowFailException, AirflowSkipException
except ImportError:  # Airflow 3.1 (task-sdk 1.1): still in airflow.exceptions
    from airflow.exceptions import AirflowFailException, AirflowSkipException  # type: ignore[no-redef]

from airflow_provider_walsink.core.commit.audit import AuditCheck, AuditError, as_checks, audit_checkpoint
from airflow_provider_walsink.hooks.context import actor_from_context, checkpoint_key_from_context
from airflow_provider_walsink.hooks.walsink import WalsinkHook
from airflow_provider_walsink.operators.commit import validate_static_identifier
from airflow_provider_walsink.ui.links import WalsinkCheckpointLink


class WalAuditOperator(BaseOperator):
    """Audit the sealed attempt of a durable checkpoint; record AUDITED or REJECTED.

    Reads the sealed manifest from the staging layout (as the commit task
    does), runs every check on the staged files (see
    :mod:`airflow_provider_walsink.core.commit.audit`) and records the verdict in the
    committer table. Put it between the durability sensor and a commit task
    built with ``require_audit=True`` (``walsink_pipeline(..., audit=[...])``
    does both).

    * All checks pass: AUDITED; returns the results (pushed to XCom).
    * A check fails: REJECTED with the failed checks as the checkpoint's
      error (the UI shows them), then the task fails without retrying
      (``AirflowFailException``: the data must be written again); nothing is
      published.
    * A check cannot run (unsupported format, missing row counts, a checkpoint
      staged on an object store, which the audit cannot read yet): the task
      fails without retrying and records nothing (the checkpoint stays
      DURABLE, unaudited). Other errors (a callable's bug, I/O) fail the try
      as usual, and retries apply.
    * Already AUDITED: a no-op that says so. Already REJECTED: fails again
      with the recorded reason. COMMITTING or COMMITTED: skipped.

    :param pipeline: pipeline id (templated).
    :param checks: the audit: :class:`~airflow_provider_walsink.core.commit.audit.AuditCheck`
        objects (``RowCountCheck``, ``NotNullCheck``, ``SqlPredicateCheck``,
        ``CallableCheck``) or plain callables ``fn(staged)``.
    :param checkpoint_key: templated; defaults to the run's data interval start.
    :param walsink_conn_id: connection to the committer database.
    :param staging_root: templated; where to look for a checkpoint whose row records no
        staging root (written before walsink recorded it); defaults to the connection's
        ``staging_root``. A root recorded by the write task always wins.
    :param fail_on_reject: ``True`` (default): a REJECTED verdict fails the task, as above.
        ``False``: the task succeeds and returns the verdict, for a step after it that lets a
        person decide (``walsink_pipeline(..., audit_approval=True)``,
        :class:`~airflow_provider_walsink.operators.approval.WalAuditApprovalOperator`); the
        checkpoint is REJECTED either way and the commit refuses it until someone approves it.
    """

    operator_extra_links = (WalsinkCheckpointLink(),)
    template_fields: Sequence[str] = ("pipeline", "checkpoint_key", "staging_root")
    ui_color = "#d9e8f5"

    def __init__(
        self,
        *,
        pipeline: str,
        checks: Sequence[AuditCheck | Callable[..., Any]],
        checkpoint_key: str | None = None,
        walsink_conn_id: str = WalsinkHook.default_conn_name,
        staging_root: str | None = None,
        fail_on_reject: bool = True,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.fail_on_reject = fail_on_reject
        validate_static_identifier(pipeline, "pipeline id")
        validate_static_identifier(checkpoint_key, "checkpoint key")
        self.pipeline = pipeline
        self.checks = as_checks(checks)
        self.checkpoint_key = checkpoint_key
        self.walsink_conn_id = walsink_conn_id
        self.staging_root = staging_root

    def execute(self, context: Any) -> dict[str, Any]:
        key = checkpoint_key_from_context(context, self.checkpoint_key)
        hook = WalsinkHook(self.walsink_conn_id)
        store = hook.get_store()
        actor = actor_from_context(context)
        try:
            # The layout only for a row that records no staging root (written before walsink did).
            layout = lambda: hook.get_layout(self.staging_root)  # noqa: E731
            outcome = audit_checkpoint(
                store, layout, self.pipeline, key, self.checks, actor=actor, stores=hook.get_staging_store
            )
        except AuditError as exc:
            store.record_event(self.pipeline, key, actor=actor, detail=f"audit could not run: {exc}")
            raise AirflowFailException(f"the audit of {self.pipeline}/{key} could not run: {exc}") from None
        for check in outcome.checks:
            self.log.info("%s %s: %s", "PASS" if check["passed"] else "FAIL", check["check"], check["reason"])
        if outcome.verdict is None:
            raise AirflowSkipException(outcome.message)
        if outcome.rejected and not self.fail_on_reject:
            self.log.error("%s; a person decides in the approval step", outcome.message)
            return outcome.to_dict()
        if outcome.rejected:
            self.log.error("%s", outcome.message)
            raise AirflowFailException(
                f"checkpoint {self.pipeline}/{key} is REJECTED; nothing is published: "
                f"{store.require(self.pipeline, key).error}"
            )
        self.log.info("%s", outcome.message)
        return outcome.to_dict()
