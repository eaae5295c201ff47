"""A person decides about a REJECTED checkpoint in Airflow: publish it anyway, or abort it.

``walsink_pipeline(..., audit=[...], audit_approval=True)`` puts this task
between the audit and the commit (``write >> durable >> audit >> approval >>
commit``). It is the standard provider's human-in-the-loop operator
(:class:`~airflow.providers.standard.operators.hitl.HITLOperator`): on Airflow
3.3 the task parks in ``awaiting_input`` (no worker slot, no trigger) until a
person answers in Airflow's *Required actions* page or through the REST API
(``PATCH /api/v2/dags/{dag}/dagRuns/{run}/taskInstances/{task}/-1/hitlDetails``
with ``{"chosen_options": ["Publish anyway"], "params_input": {"reason": "..."}}``);
the scheduler then resumes it in :meth:`WalAuditApprovalOperator.execute_complete`.

* The audit passed (AUDITED), or there is nothing to decide (COMMITTING,
  COMMITTED, or any state but REJECTED): the task is skipped and the commit
  task decides as it does without this step (it publishes only AUDITED).
  ABORTED: the commit task is skipped as well (nothing can be published).
* REJECTED: the question is recorded in the checkpoint's history first
  (:meth:`~airflow_provider_walsink.core.store.verdicts.AuditVerdicts.ask_decision`), so the
  UI's checkpoint page says a person is asked, and links the run's *Required actions*, for as
  long as Airflow has this task waiting. The person sees the failed checks and chooses

  - **Publish anyway**: the rejected attempt becomes AUDITED, the history row
    naming who decided and their reason
    (:meth:`~airflow_provider_walsink.core.store.verdicts.AuditVerdicts.approve_rejected`);
    the commit task then publishes it once, as any audited attempt;
  - **Abort**: the checkpoint is aborted exactly as ``walsink abort`` and the
    UI's Abort button do (:func:`~airflow_provider_walsink.hooks.aborts.aborter_for`;
    its staging removed, the reason and who in the history), and the commit
    task is skipped: nothing is published.

  The decision holds only for the attempt the person was shown: if the
  interval was written again meanwhile, nothing is recorded and the task fails
  (the new attempt needs its own audit). A response without a reason fails the
  task and records nothing (clear the task to ask again).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from airflow.providers.standard.operators.hitl import HITLOperator
from airflow.sdk import Param

try:
    from airflow.sdk.bases.skipmixin import SkipMixin
    from airflow.sdk.exceptions import AirflowFailException, AirflowSkipException
except ImportError:  # Airflow 3.1 (task-sdk 1.1): the standard provider's SkipMixin, airflow.exceptions
    from airflow.exceptions import AirflowFailException, AirflowSkipException  # type: ignore[no-redef]
    from airflow.providers.standard.utils.skipmixin import SkipMixin  # type: ignore[no-redef]

from airflow_provider_walsink.core.protocol.states import CheckpointState
from airflow_provider_walsink.core.store.errors import StaleAttemptError
from airflow_provider_walsink.hooks.aborts import aborter_for
from airflow_provider_walsink.hooks.context import actor_from_context, checkpoint_key_from_context
from airflow_provider_walsink.hooks.walsink import WalsinkHook
from airflow_provider_walsink.operators.commit import validate_static_identifier
from airflow_provider_walsink.ui.links import WalsinkCheckpointLink

S = CheckpointState
#: The XCom key under which the task keeps the attempt the person is shown (read on resume).
SHOWN_ATTEMPT_KEY = "walsink_rejected_attempt_id"


class WalAuditApprovalOperator(HITLOperator, SkipMixin):
    """Ask a person whether a REJECTED checkpoint is published anyway or aborted (module docstring).

    :param pipeline: pipeline id (templated).
    :param checkpoint_key: templated; defaults to the run's data interval start.
    :param walsink_conn_id: connection to the committer database.
    :param staging_root: templated; where an abort looks for a checkpoint whose row records no
        staging root (default: the connection's). A root recorded by the write task always wins.
    :param subject: the question's headline (templated; default names the checkpoint).
    :param kwargs: any other argument of :class:`HITLOperator` (``assigned_users``,
        ``notifiers``, ``response_timeout``, ``defaults``...). ``options``, ``multiple`` and
        ``params`` are fixed; the only default allowed on a response timeout is ``"Abort"``
        (publishing data that failed its audit is a person's decision, never a timeout's).
    """

    PUBLISH = "Publish anyway"
    ABORT = "Abort"
    FIXED_ARGS = ("options", "multiple", "params")

    inherits_from_skipmixin = True
    operator_extra_links = (WalsinkCheckpointLink(),)
    template_fields: Sequence[str] = (
        *HITLOperator.template_fields,
        "pipeline",
        "checkpoint_key",
        "staging_root",
    )
    ui_color = "#f5e6d9"

    def __init__(
        self,
        *,
        pipeline: str,
        checkpoint_key: str | None = None,
        walsink_conn_id: str = WalsinkHook.default_conn_name,
        staging_root: str | None = None,
        subject: str | None = None,
        **kwargs: Any,
    ) -> None:
        fixed = [arg for arg in self.FIXED_ARGS if arg in kwargs]
        if fixed:
            raise ValueError(f"WalAuditApprovalOperator: {', '.join(fixed)} cannot be given; they are fixed")
        defaults = kwargs.get("defaults")
        if defaults is not None and set([defaults] if isinstance(defaults, str) else defaults) != {
            self.ABORT
        }:
            raise ValueError(
                f"WalAuditApprovalOperator: defaults={defaults!r}: only {self.ABORT!r} may be taken without "
                "a person's answer; publishing a rejected checkpoint needs someone to decide it"
            )
        validate_static_identifier(pipeline, "pipeline id")
        validate_static_identifier(checkpoint_key, "checkpoint key")
        super().__init__(
            subject=subject or f"walsink: checkpoint {pipeline} was REJECTED by its audit",
            options=[self.PUBLISH, self.ABORT],
            multiple=False,
            params={
                "reason": Param(
                    "",
                    type="string",
                    title="Reason",
                    description="Why: recorded in the checkpoint's history with your name",
                )
            },
            **kwargs,
        )
        self.pipeline = pipeline
        self.checkpoint_key = checkpoint_key
        self.walsink_conn_id = walsink_conn_id
        self.staging_root = staging_root

    def execute(self, context: Any) -> Any:
        """Skip unless the checkpoint is REJECTED; else ask (the task parks until answered)."""
        key = checkpoint_key_from_context(context, self.checkpoint_key)
        store = WalsinkHook(self.walsink_conn_id).get_store()
        record = store.require(self.pipeline, key)
        name = f"checkpoint {self.pipeline}/{key}"
        if record.state is S.ABORTED:
            # Aborted (by this step's earlier try, whose report Airflow lost, or by a person in the
            # UI or CLI): nothing is left to decide or publish, so the commit is skipped too.
            self.log.info("%s is ABORTED: nothing to approve or publish", name)
            self.skip(ti=context["ti"], tasks=self.get_direct_relatives(upstream=False))
        if record.state is not S.REJECTED:
            # AUDITED: the audit passed (or an earlier try recorded the approval). Anything else:
            # the commit task decides, as without this step.
            raise AirflowSkipException(f"{name} is {record.state}: no approval needed")
        context["ti"].xcom_push(key=SHOWN_ATTEMPT_KEY, value=record.sealed_attempt_id)
        # In the checkpoint's history, so its page says a person is asked, and where to answer.
        store.ask_decision(
            self.pipeline, key, attempt_id=record.sealed_attempt_id, actor=actor_from_context(context)
        )
        self.body = "\n\n".join(
            part
            for part in (
                self.body,
                f"Attempt {record.sealed_attempt} ({record.sealed_attempt_id}) of **{name}** failed its audit:",
                "\n".join(f"- {line}" for line in (record.error or "").splitlines()),
                f"**{self.PUBLISH}** publishes it as it is; **{self.ABORT}** aborts the checkpoint "
                "(nothing is published). Give a reason: it is recorded with your name in the "
                "checkpoint's history.",
            )
            if part
        )
        return super().execute(context)

    def execute_complete(self, context: Any, event: dict[str, Any]) -> Any:
        """Record the person's decision: approve (the commit follows) or abort (the commit is skipped)."""
        answer = super().execute_complete(context=context, event=event)
        choice = answer["chosen_options"][0]
        user = answer["responded_by_user"]
        reason = str((answer["params_input"] or {}).get("reason") or "").strip()
        if user is None:  # the response timeout's default (only Abort is allowed)
            approver = "nobody (no answer within the response timeout)"
            reason = reason or f"no answer within the response timeout: {choice}"
        else:
            approver = f"{user.get('name')} (id {user.get('id')})"
        key = checkpoint_key_from_context(context, self.checkpoint_key)
        name = f"checkpoint {self.pipeline}/{key}"
        if not reason:
            raise AirflowFailException(
                f"{approver} chose {choice!r} for {name} without a reason; nothing is recorded "
                "(clear this task to ask again)"
            )
        task_actor = actor_from_context(context)
        actor = dataclasses.replace(task_actor, name=f"{approver} via {task_actor.name}"[:255])
        hook = WalsinkHook(self.walsink_conn_id)
        store = hook.get_store()
        shown = context["ti"].xcom_pull(task_ids=self.task_id, key=SHOWN_ATTEMPT_KEY)
        if choice == self.PUBLISH:
            done = store.approve_rejected(
                self.pipeline, key, attempt_id=shown, approver=approver, reason=reason, actor=actor
            )
            self.log.info("%s approved by %s: %s; now %s", name, approver, reason, done.state)
            return {**answer, "state": done.state.value}
        aborter = aborter_for(
            store,
            self.pipeline,
            staging_root=self.staging_root or hook.staging_root,
            checkpoint_key=key,
            stores=hook.get_staging_store,
        )
        try:
            # The person decided about the attempt shown: a newer one has its own audit.
            outcome = aborter.abort(
                self.pipeline, key, reason=f"{reason} (decided by {approver})", actor=actor, attempt_id=shown
            )
        except StaleAttemptError as exc:
            raise AirflowFailException(str(exc)) from exc
        self.log.info("%s aborted by %s: %s; %s", name, approver, reason, outcome.to_dict())
        # Nothing to publish: the commit task (and what follows it) ends skipped.
        self.skip(ti=context["ti"], tasks=self.get_direct_relatives(upstream=False))
        return None
