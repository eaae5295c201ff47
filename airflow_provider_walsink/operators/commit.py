"""The commit task: publish a durable checkpoint exactly once."""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from datetime import UTC, timedelta
from typing import Any

from airflow.sdk import AssetAlias, BaseOperator

try:
    from airflow.sdk.exceptions import AirflowFailException
except ImportError:  # Airflow 3.1 (task-sdk 1.1): still in airflow.exceptions
    from airflow.exceptions import AirflowFailException  # type: ignore[no-redef]

from airflow_provider_walsink.core.commit.aftercommit import commit_then_follow
from airflow_provider_walsink.core.commit.commit import CheckpointCommitter, CommitSummary
from airflow_provider_walsink.core.commit.group import commit_waiting_for_group
from airflow_provider_walsink.core.protocol.identifiers import validate_identifier
from airflow_provider_walsink.core.protocol.modes import FencingMode, WriteMode
from airflow_provider_walsink.core.staging.layout import StagingLayout
from airflow_provider_walsink.core.staging.resolve import as_store, staging_for
from airflow_provider_walsink.core.store.errors import (
    AuditRejectedError,
    ConsumerGroupMovedError,
    OffsetsError,
    OrderingError,
)
from airflow_provider_walsink.core.store.records import Actor
from airflow_provider_walsink.core.targets.base import Publisher
from airflow_provider_walsink.core.targets.registry import (
    TargetOptions,
    resolve_target,
)
from airflow_provider_walsink.hooks import versions
from airflow_provider_walsink.hooks.connections import airflow_connection_fields
from airflow_provider_walsink.hooks.context import (
    actor_from_context,
    checkpoint_key_from_context,
    run_partition_key,
)
from airflow_provider_walsink.hooks.walsink import WalsinkHook
from airflow_provider_walsink.operators.announce import (
    Announcement,
    announces,
    decide_announcement,
    event_extra,
)
from airflow_provider_walsink.operators.deprecations import source_argument
from airflow_provider_walsink.operators.lineage import (
    asset_alias_name,
    operator_lineage,
    target_asset,
    target_uri,
)
from airflow_provider_walsink.ui.links import WalsinkCheckpointLink


def validate_static_identifier(value: str | None, what: str) -> None:
    """Check a pipeline id or key at DAG parse time unless it is a template (checked when rendered)."""
    if value is not None and "{{" not in value and "{%" not in value:
        validate_identifier(value, what)


def target_staging_root(
    target: str | Publisher | None,
    *,
    mode: str,
    layout: StagingLayout,
    partition_by: Sequence[str] = (),
    extra: Mapping[str, Any] | None = None,
) -> str | None:
    """Where ``target`` wants its attempts staged (table targets: inside the table location), or None.

    Resolves the target first, so a target naming something that is not
    configured is refused here; a target kind that defines ``check_writable()``
    (a directory of files) refuses here a target it could not publish into. A
    target kind may define ``staging_root()``;
    directories of files and SQL tables do not (they stage under the
    connection's staging root).

    Raises:
        TargetError: the target cannot be resolved (``TargetNotConfiguredError``:
            a catalog or connection it names is not configured).
        TargetNotWritableError: a file target whose root this worker cannot create files in.
    """
    if target is None:
        return None
    publisher = resolve_target(
        target,
        TargetOptions(
            mode=mode,
            layout=layout,
            partition_by=tuple(partition_by),
            connections=airflow_connection_fields,
            extra=dict(extra or {}),
        ),
    )
    if publisher.check_writable is not None:
        publisher.check_writable()  # before the write phase: a commit that cannot publish fails now, not after Spark
    return publisher.staging_root() if publisher.staging_root is not None else None


class WalCommitOperator(BaseOperator):
    """Publish a checkpoint's sealed manifest into the target, idempotently.

    Takes the checkpoint's lease in the committer table (its fencing token),
    reads the sealed manifest, publishes every committable through the
    target's publisher (skipping what is already in place, by the attempt's
    identity), records COMMITTED with the end offsets, cleans the staging and
    returns a summary (pushed to XCom).

    * Already COMMITTED: logs it and succeeds without touching anything, so a
      retry, a cleared task or a backfill re-run is safe.
    * Not durable yet: fails with a message that says what is missing.
    * Bad manifest, staged data or layout, an OS error: fails naming the
      problem; the checkpoint stays uncommitted (FAILED) with the error
      recorded and the lease released.
    * Lease lost mid-publish (this try was a zombie): stops before its next
      change and fails; the try that took over finishes.

    :param pipeline: pipeline id (templated).
    :param target: where to publish (templated): a directory (``/data/t`` or
        ``file:///data/t``), an ``iceberg://``, ``delta://`` or ``sql://``
        URI, or a publisher object (see docs/targets.md).
    :param mode: ``overwrite`` (each checkpoint replaces its partitions) or
        ``append`` (files are added, in checkpoint order).
    :param checkpoint_key: templated; defaults to the run's data interval start
        (``20260101T000000Z``).
    :param partition_by: the pipeline's declared partition columns: a
        committable partitioned otherwise fails before the target changes.
    :param walsink_conn_id: connection to the committer database.
    :param staging_root: templated; only for a checkpoint whose row records no staging
        root (written before walsink recorded it): defaults to where the target stages
        (table targets: inside the table location), else the connection's
        ``staging_root``. A root recorded by the write task always wins.
    :param lease_ttl: how long the lease lasts without renewal; a crashed
        committer's checkpoint can be taken over after it. Size it well above
        the longest pause between two publish steps (docs/production.md).
    :param verify_checksums: before anything is published, recompute every staged committable's
        checksum and compare it with the sealed manifest's (every target kind, local and object
        staging; the file target also re-checks a file a crashed try already moved into the
        target). A mismatch fails the task naming the committable, the checksum found and the one
        recorded; the checkpoint stays uncommitted (FAILED) with that error recorded and the target
        unchanged. Off: sizes only, as the target checks them.
    :param allow_older_overwrite: let an ``overwrite`` commit replace a
        partition that a newer checkpoint key wrote (off: refused, so a late
        retry of an old interval never rolls newer data back).
    :param target_options: kind-specific target settings (catalog properties...).
    :param emit_asset_events: declare the ``walsink-<pipeline>`` asset alias and
        add an event for the target's asset only when this try recorded
        COMMITTED (never on a no-op re-run), or when a try of this task recorded
        it and none delivered the event (an earlier try killed before its
        success, or this try reconciling a dead try's table commit; the alias,
        also an inlet, shows no event for the attempt): schedule downstream
        DAGs on it.
    :param require_audit: the pipeline declares an audit (``WalAuditOperator``):
        publish only a sealed attempt that passed it. A checkpoint REJECTED by
        an audit is never published, whatever this says (the task fails
        without retrying, naming the failed checks).
    :param fencing: ``"lease"`` (default: lease transaction, publish under
        fence checks, COMMITTED transaction) or ``"table"`` (Iceberg and Delta
        only: no lease; the table's atomic commit is the fence and the
        committer table gets one transaction per commit, reconciled from the
        table after a crash; docs/protocol.md, "Table fencing"). Other targets
        refuse ``"table"`` when the task runs.
    :param source: the pipeline's source (as given to the write task): its after-commit step
        runs once the checkpoint is COMMITTED, from the committer table (say, a consumer
        group's offsets, for lag tools: never ahead of the table, caught up by the next commit
        or a re-run). The last release's spelling still works, with a DeprecationWarning.
    :param group_commit: publish up to this many (default 16) other durable checkpoints of
        the pipeline with this one, in one table transaction, each with its own marker (Iceberg
        and Delta, ``overwrite``, lease fencing; other targets and modes commit alone; 0: always
        alone). While another task leads the pipeline's group commit, this task leaves its
        checkpoint to that leader's group and waits for the answer (poll every
        ``group_poll``) instead of racing it at the table; one it committed is an answered
        no-op whose asset event this task adds, once (docs/backfill.md).
    :param group_poll: how often a commit task waiting for a group commit looks again (one
        indexed read of its checkpoint's row and the pipeline's lead per look, no write;
        default 0.5 s).
    """

    operator_extra_links = (WalsinkCheckpointLink(),)
    template_fields: Sequence[str] = ("pipeline", "checkpoint_key", "target", "staging_root")
    ui_color = "#c5e8c5"

    def __init__(
        self,
        *,
        pipeline: str,
        target: str | Publisher,
        mode: str = "overwrite",
        checkpoint_key: str | None = None,
        partition_by: Sequence[str] = (),
        walsink_conn_id: str = WalsinkHook.default_conn_name,
        staging_root: str | None = None,
        lease_ttl: timedelta = timedelta(minutes=10),
        verify_checksums: bool = False,
        allow_older_overwrite: bool = False,
        target_options: Mapping[str, Any] | None = None,
        emit_asset_events: bool = True,
        require_audit: bool = False,
        fencing: str = "lease",
        source: Any = None,
        group_commit: int = 16,
        group_poll: timedelta = timedelta(seconds=0.5),
        **kwargs: Any,
    ) -> None:
        self.source = source_argument(type(self).__name__, source, kwargs)
        self.asset_alias: AssetAlias | None = None
        if emit_asset_events and "{{" not in pipeline:
            self.asset_alias = AssetAlias(name=asset_alias_name(pipeline))
            kwargs["outlets"] = [*(kwargs.get("outlets") or []), self.asset_alias]
            # Also an inlet, to read back the events added through it: a retry of a try killed
            # between COMMITTED and its success adds the event that try never delivered.
            kwargs["inlets"] = [*(kwargs.get("inlets") or []), self.asset_alias]
            if isinstance(target, str) and "{{" not in target and "{%" not in target:
                # Registered when the DAG is parsed (an inlet emits no event): otherwise the
                # first events of two commits finishing together both make Airflow create the
                # asset, and one task fails on the unique key (docs/backfill.md, Assets).
                kwargs["inlets"] = [*(kwargs.get("inlets") or []), target_asset(pipeline, target)]
        super().__init__(**kwargs)
        WriteMode.parse(mode)
        validate_static_identifier(pipeline, "pipeline id")
        validate_static_identifier(checkpoint_key, "checkpoint key")
        self.pipeline = pipeline
        self.target = target
        self.mode = mode
        self.checkpoint_key = checkpoint_key
        self.partition_by = list(partition_by)
        self.walsink_conn_id = walsink_conn_id
        self.staging_root = staging_root
        self.lease_ttl = lease_ttl
        self.verify_checksums = verify_checksums
        self.allow_older_overwrite = allow_older_overwrite
        self.target_options = dict(target_options or {})
        self.require_audit = require_audit
        FencingMode.parse(fencing)
        self.fencing = fencing
        if group_commit < 0:
            raise ValueError(
                f"group_commit must be 0 (off) or the most checkpoints to add, got {group_commit}"
            )
        self.group_commit = group_commit
        self.group_poll = group_poll

    def get_publisher(self, layout: StagingLayout | None, archive: Any = None) -> Publisher:
        """The target's publisher: the object given, or one built from the target URI.

        ``layout``: the local staging layout (file and SQL targets read it); ``None`` for a
        checkpoint staged on an object store (table targets read the attempt through the store).
        ``archive``: the committer store, where a table target archives its oldest markers."""
        return resolve_target(
            self.target,
            TargetOptions(
                mode=self.mode,
                layout=layout,  # type: ignore[arg-type]
                partition_by=tuple(self.partition_by),
                verify_checksums=self.verify_checksums,
                allow_older_overwrite=self.allow_older_overwrite,
                connections=airflow_connection_fields,
                extra=self.target_options,
                property_archive=archive,
            ),
        )

    def execute(self, context: Any) -> dict[str, Any]:
        key = checkpoint_key_from_context(context, self.checkpoint_key)
        hook = WalsinkHook(self.walsink_conn_id)
        store = hook.get_store()
        committer = self.get_committer(hook, store, key)
        actor = actor_from_context(context)
        refused: list[str] = []
        # The source's step after COMMITTED (a consumer group's offsets follow the table): the one
        # order, in the core, that the model checker runs too.
        summary, extra = commit_then_follow(
            lambda: self._commit(committer, key, actor),
            (lambda: self._after_commit(hook, store, refused)) if self.source is not None else None,
        )
        self._summary = summary.to_dict() | extra
        if self.asset_alias is not None:
            self._announce(context, store, committer, summary, actor)
        if refused:
            # After the asset event: the commit stands; only the group's offsets were not sent.
            raise AirflowFailException(refused[0])  # retrying cannot help: the group is another's
        return self._summary

    def get_committer(self, hook: WalsinkHook, store: Any, key: str) -> CheckpointCommitter:
        """The commit sequence for ``key``: its staging where the write phase recorded it (whatever
        the connection or the target say now), and the target's publisher."""
        record = store.get(self.pipeline, key)
        staging = as_store(staging_for(record, lambda: self._derived_root(hook), hook.get_staging_store))
        if staging.layout is None:
            # Staged on an object store: table targets publish the staged objects by reference.
            publisher = self._object_store_publisher(staging.root_uri, store)
        else:
            publisher = self.get_publisher(staging.layout, store)
        return CheckpointCommitter(
            store,
            staging,
            publisher,
            mode=self.mode,
            lease_ttl=self.lease_ttl,
            require_audit=self.require_audit,
            fencing=self.fencing,
            group_commit=self.group_commit,
            verify_checksums=self.verify_checksums,
        )

    def _commit(self, committer: CheckpointCommitter, key: str, actor: Actor) -> CommitSummary:
        try:
            summary = self._commit_waiting_for_group(committer, key, actor)
        except AuditRejectedError as exc:
            raise AirflowFailException(str(exc)) from None  # retrying cannot help
        except OrderingError as exc:
            # A wait (not an offsets refusal, recorded by the committer): say on the checkpoint why.
            if not isinstance(exc, OffsetsError):
                committer.store.record_blocked(self.pipeline, key, actor=actor, waiting_to="commit")
            raise
        if summary.group:
            self.log.info(
                "Checkpoint %s/%s led a group commit: %d checkpoints in one table commit (%s)",
                self.pipeline,
                key,
                len(summary.group),
                ", ".join(summary.group),
            )
        return summary

    def _announce(
        self, context: Any, store: Any, committer: CheckpointCommitter, summary: CommitSummary, actor: Actor
    ) -> None:
        """Add the commit's asset event when :func:`~.announce.decide_announcement` says so."""
        key = summary.checkpoint_key
        decision = decide_announcement(
            summary,
            self._committed(committer, key) if summary.already_committed else None,
            actor,
            lambda committed: self._unannounced(context, summary, committed),
        )
        (self.log.warning if decision.case is Announcement.RECONCILED else self.log.info)(
            "%s", decision.message
        )
        if decision.announce:
            publication = store.require(self.pipeline, key).publication
            extra = event_extra(
                summary, decision.case, publication=publication, partition_key=run_partition_key(context)
            )
            self._add_asset_event(context, store, extra)

    def _add_asset_event(self, context: Any, store: Any, extra: Mapping[str, Any]) -> None:
        """Add one event of the target's asset through the pipeline's alias (its first one waits
        for its turn: :meth:`_await_first_event`)."""
        assert self.asset_alias is not None
        self._await_first_event(context, store)
        context["outlet_events"][self.asset_alias].add(
            target_asset(self.pipeline, self.target), extra=dict(extra)
        )

    def _commit_waiting_for_group(
        self, committer: CheckpointCommitter, key: str, actor: Actor
    ) -> CommitSummary:
        """Commit; while another task's group commit leads the pipeline or holds the checkpoint,
        wait for it instead of failing (:func:`~...core.commit.group.commit_waiting_for_group`)."""
        return commit_waiting_for_group(
            committer, self.pipeline, key, actor=actor, poll=self.group_poll.total_seconds()
        )

    def _committed(self, committer: CheckpointCommitter, key: str) -> Any:
        """The transition that recorded the version committed now (a reprocess commits a later one
        than the first), or ``None``."""
        committed = [
            h
            for h in committer.store.history(self.pipeline, key)
            if h.to_state == "COMMITTED" and h.from_state != "COMMITTED"
        ]
        return committed[-1] if committed else None

    def _after_commit(self, hook: WalsinkHook, store: Any, refused: list[str]) -> Mapping[str, Any] | None:
        """The source's step after COMMITTED (a consumer group's offsets follow the table): its summary
        entries; a consumer group moved by someone else is reported once the asset event is done."""
        try:
            return hook.get_source(self.source).after_commit(store, self.pipeline)
        except ConsumerGroupMovedError as exc:
            self.log.error("%s", exc)
            refused.append(str(exc))
            return None

    def _object_store_publisher(self, root: str, store: Any) -> Publisher:
        """The publisher of a checkpoint staged on an object store; only a target that publishes a
        staged attempt by reference (Iceberg, Delta) can, so any other fails here, before the lease."""
        publisher = self.get_publisher(None, store)
        if not publisher.takes_staged_attempt:
            raise AirflowFailException(
                f"checkpoint of pipeline {self.pipeline} is staged on an object store ({root}), but target "
                f"{target_uri(self.target)!r} publishes from a local or mounted staging root only; publish "
                "into an Iceberg or Delta table target (it references the staged objects in place), or "
                "stage on a path every node mounts"
            )
        return publisher

    def _derived_root(self, hook: WalsinkHook) -> str:
        """The staging root of a checkpoint whose row records none (written before walsink
        recorded it, or not registered at all): derived as the write task did then,
        ``staging_root``, else the target's own (table targets), else the connection's."""
        if self.staging_root:
            return self.staging_root
        publisher = self.get_publisher(hook.get_layout())
        own = publisher.staging_root() if publisher.staging_root is not None else None
        return own or hook.staging_root

    #: How long a first-event claim holds before another commit task takes it over: its holder
    #: returns right after claiming, so only a holder that died before its success lets it age.
    first_event_stale_after = timedelta(minutes=2)
    #: How often a commit task waiting for the pipeline's first event looks for it.
    first_event_poll = 1.0

    def _await_first_event(self, context: Any, store: Any) -> None:
        """Return when this task may add an event through the pipeline's alias.

        Airflow 3.3 links the alias to the target's asset with the first event through
        the alias, and when two such first events are recorded at once, one task fails
        on the link's unique key ("Error updating Task Instance state"), its commit done
        but its run failed. So while no event of the target has gone through the alias,
        one commit task at a time claims the first event in the committer table
        (:mod:`~airflow_provider_walsink.core.store.first_event`) and the others wait
        until an event shows up. Once one has, this costs one read of the alias's
        newest event. Events that cannot be read do not hold the commit back.
        """
        if self._target_announced(context):
            return
        ti = context["ti"]
        holder = f"{ti.dag_id}/{ti.run_id}/{ti.task_id}/{getattr(ti, 'map_index', -1)}"
        # A claim taken over is how a dead holder is skipped; past twice that, something
        # else keeps the event from showing (say, events not readable here): go on.
        deadline = time.monotonic() + 2 * self.first_event_stale_after.total_seconds()
        waited = False
        while True:
            if store.claim_first_event(self.pipeline, holder, stale_after=self.first_event_stale_after):
                if waited:
                    self.log.info("Adding the first asset event of pipeline %s (claim taken)", self.pipeline)
                return
            if not waited:
                self.log.info(
                    "Another commit task of pipeline %s is adding its first asset event; waiting for it "
                    "(Airflow fails one of two first events through an alias recorded at once)",
                    self.pipeline,
                )
                waited = True
            time.sleep(self.first_event_poll)
            if self._target_announced(context):
                self.log.info(
                    "The first asset event of pipeline %s is recorded; adding this one", self.pipeline
                )
                return
            if time.monotonic() > deadline:
                self.log.warning(
                    "No asset event of pipeline %s showed up within %s and the claim was not released; "
                    "adding this one anyway",
                    self.pipeline,
                    2 * self.first_event_stale_after,
                )
                return

    def _target_announced(self, context: Any) -> bool:
        """Has an event of the target's asset gone through the alias (so Airflow linked them)?
        ``True`` also when the events cannot be read: then nothing here can serialize them."""
        if not versions.available("asset_event_queries"):  # Airflow 3.1: one log line says so
            return True
        try:
            newest = list(context["inlet_events"][self.asset_alias].ascending(False).limit(1))
        except Exception as exc:  # noqa: BLE001 - unreadable: add the event as before (see above)
            self.log.warning("Could not read the asset events of %s (%s)", self.asset_alias, exc)
            return True
        if not newest:
            return False
        asset = target_asset(self.pipeline, self.target)
        event_asset = newest[0].asset
        return (event_asset.name, event_asset.uri) == (asset.name, asset.uri)

    def _unannounced(self, context: Any, summary: CommitSummary, committed: Any) -> bool:
        """No event of the alias since the COMMITTED transition ``committed`` names this commit
        (:func:`~.announce.announces`); ``False`` when the events cannot be read (see :mod:`.announce`)."""
        if not versions.available("asset_event_queries"):  # Airflow 3.1: one log line says so
            return False
        try:
            # The events were added at or after COMMITTED; an hour covers the clocks' skew.
            since = committed.at.replace(tzinfo=UTC) - timedelta(hours=1)
            events = list(context["inlet_events"][self.asset_alias].after(since.isoformat()))
        except Exception as exc:  # noqa: BLE001 - any failure to read: add nothing (see above)
            self.log.warning("Could not read the asset events of %s (%s); adding none", self.asset_alias, exc)
            return False
        return not any(announces(event.extra or {}, summary) for event in events)

    def get_openlineage_facets_on_complete(self, task_instance: Any) -> Any:
        """The target as output (with its rows) and the checkpoint as a run facet."""
        return operator_lineage(
            summary=getattr(self, "_summary", None),
            pipeline=self.pipeline,
            checkpoint_key=self.checkpoint_key,
            output_uri=target_uri(self.target),
        )
