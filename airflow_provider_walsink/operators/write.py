"""The write task: run a PySpark job that stages one checkpoint, then record its seal."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from airflow.sdk import BaseOperator

from airflow_provider_walsink.core.commit.write_phase import (
    AttemptCancelledError,
    CheckpointSkipped,
    WritePhase,
)
from airflow_provider_walsink.core.protocol.errors import NOTHING_DONE, PreflightError
from airflow_provider_walsink.core.protocol.modes import Reprocess, WriteMode
from airflow_provider_walsink.core.protocol.partition_keys import PartitionSpec
from airflow_provider_walsink.core.runners import JobRunner, runner_class, runner_name
from airflow_provider_walsink.core.sources import source_from
from airflow_provider_walsink.core.staging.layout import StagingLayout
from airflow_provider_walsink.core.store.errors import PipelineOwnedError
from airflow_provider_walsink.core.store.store import CheckpointRecord
from airflow_provider_walsink.core.targets.registry import connection_references, target_scheme
from airflow_provider_walsink.hooks.connections import require_connection
from airflow_provider_walsink.hooks.context import (
    actor_from_context,
    reprocess_decision,
    run_interval,
    version_token,
)
from airflow_provider_walsink.hooks.spark_submit_runner import DEFAULT_MASTER
from airflow_provider_walsink.hooks.staging import is_object_store_root
from airflow_provider_walsink.hooks.walsink import WalsinkHook
from airflow_provider_walsink.operators.commit import target_staging_root, validate_static_identifier
from airflow_provider_walsink.operators.deprecations import source_argument
from airflow_provider_walsink.operators.lineage import operator_lineage, target_uri
from airflow_provider_walsink.operators.placement import check_operator_placement
from airflow_provider_walsink.ui.links import WalsinkCheckpointLink

try:
    from airflow.sdk.exceptions import AirflowFailException, AirflowSkipException
except ImportError:  # Airflow 3.1 (task-sdk 1.1): still in airflow.exceptions
    from airflow.exceptions import AirflowFailException, AirflowSkipException  # type: ignore[no-redef]


class WalWriteOperator(BaseOperator):
    """Stage one checkpoint with a PySpark job (the write phase of the protocol).

    1. Registers the checkpoint in the committer table (idempotent) and starts
       a new write attempt. In ``append`` mode the attempt starts from the
       pipeline's last committed end offsets, and an earlier uncommitted
       checkpoint of the pipeline makes the task fail (retry it later): reading
       from the committed offsets while an earlier checkpoint is still open
       would read its input a second time.
    2. Runs ``application`` through the job runner of ``spark_conn_id``'s connection type
       (:meth:`get_runner`): spark-submit (the Spark provider's ``SparkSubmitHook``,
       :mod:`~airflow_provider_walsink.hooks.spark_submit_runner`), or for a ``spark_connect``
       connection a Spark Connect client in this process
       (:mod:`~airflow_provider_walsink.hooks.spark_connect_runner`), with the protocol arguments (``--walsink-protocol <json>``, see
       :class:`~airflow_provider_walsink.core.spark.args.ProtocolArgs`) ahead of
       ``application_args``. The job stages its output with
       :class:`~airflow_provider_walsink.core.spark.job.CheckpointJob` and writes
       the manifest.
    3. Reads and validates the manifest and records the seal (digest, counts,
       offsets) in the committer table. Pushes ``manifest_uri`` and
       ``manifest_digest`` to XCom and returns a summary.

    A retry starts a new attempt; only the newest sealed attempt ever counts.
    A failed job records the error on the checkpoint (FAILED, retryable).
    These steps are the core's
    :class:`~airflow_provider_walsink.core.commit.write_phase.WritePhase`; this task only
    builds it (runner, source, staging) through :class:`WalsinkHook` and runs it.

    The staging root is a filesystem path that the Spark driver and executors
    and the Airflow workers all see at the same place (a local disk under the
    default ``local[*]`` master, a shared mount on a cluster), or an object
    store, ``s3://bucket/prefix``: then no local directory is made, the
    executors write to the store and the job seals there, with the credentials
    of the ``aws`` connection the walsink connection names
    (:meth:`WalsinkHook.get_staging_credentials`). They reach the job in the
    environment of spark-submit, never on its command line or in the log;
    masters that would put them on a command line (YARN, Kubernetes) or whose
    driver does not inherit that environment (cluster deploy mode) are refused
    (docs/production.md, "Staging on S3").

    **Re-runs of a committed interval** (``reprocess``, docs/backfill.md):
    under ``skip`` (the default) the Spark job is not submitted; the task
    logs it, records it in the checkpoint's history and ends **skipped** (so
    the durability and commit tasks are skipped too and no asset event is
    emitted). Under ``replace`` (or the run conf ``{"walsink_reprocess":
    "replace"}``), a backfill run writes a new *version* of the checkpoint
    (a new attempt id under the same key) that supersedes the committed one
    when it commits; in ``append`` mode it re-reads exactly the input of the
    version it replaces (``job.until_offsets``). A retry of the reprocessing
    run continues its version; it never starts another.

    :param application: the PySpark script (templated).
    :param pipeline: pipeline id (templated).
    :param mode: ``overwrite`` or ``append``; must match the commit task's.
    :param checkpoint_key: templated; defaults to the run's data interval start.
    :param application_args: the job's own arguments (templated).
    :param spark_conn_id: a Spark connection (master, deploy mode...), or a ``spark_connect``
        connection (the job then runs as a Spark Connect client: docs/production.md,
        "Choosing a runner"). ``None`` (the default) means master ``local[*]``, chosen
        explicitly; a named connection that does not exist is an error, never a silent ``yarn``.
    :param master: master to use when ``spark_conn_id`` is ``None``.
    :param conf: Spark configuration (templated). Under the default local
        master, :data:`LOCAL_DEFAULT_CONF` fills what is not given.
    :param env_vars: environment of spark-submit. ``PYSPARK_PYTHON`` and
        ``PYSPARK_DRIVER_PYTHON`` default to this interpreter under a local master.
    :param file_format: default Spark format of the job's :meth:`stage` calls.
    :param partition_by: default partition columns of the job's :meth:`stage` calls.
    :param checksum: committable checksum the job computes: ``crc32``
        (default, cheapest), ``sha256`` or ``None``.
    :param initial_offsets: start offsets of an ``append`` pipeline's first checkpoint.
    :param target: the pipeline's target, recorded with the pipeline (templated). It is
        resolved before anything is recorded or submitted: a target naming a catalog or
        connection that is not configured fails the task there (docs/targets.md).
    :param target_options: the target's kind-specific settings, as the commit task's
        (``walsink_pipeline(target_options=...)`` gives both the same).
    :param reprocess: ``skip`` (default) or ``replace``: what a backfill re-run of a
        COMMITTED interval does (see above).
    :param lineage_inputs: URIs (or paths) of the datasets the job reads (templated),
        reported as OpenLineage inputs beside the target and the checkpoint.
    :param walsink_conn_id: connection to the committer database.
    :param staging_root: templated; defaults to the target's own (table targets: inside
        the table location), else the connection's ``staging_root``. Recorded on the
        checkpoint's row; a checkpoint that already records a root keeps it for every
        later attempt and version (docs/protocol.md, "Staging root").
    :param spark_submit_kwargs: further ``SparkSubmitHook`` arguments
        (``py_files``, ``driver_memory``, ``packages``...).
    :param partition_column: for partitioned runs (a ``CronPartitionTimetable``, a run triggered
        with a ``partition_key``): the partition column a key names; the checkpoint of key ``K``
        replaces target partition ``<partition_column>=K`` and no other (docs/backfill.md,
        "Partitioned runs"). Must be one of ``partition_by``.
    :param partition_key_format: a ``strftime`` format every partition key must be exactly a
        rendering of (``%Y-%m-%d``); a run whose key is not is refused before anything is written.
    :param source: what the job reads (default: it finds its own input), as
        ``{"kind": <a name in core/sources SOURCES>, "conn_id": <its connection>, **its
        settings}`` or a :class:`~airflow_provider_walsink.core.sources.base.Source`. A source
        that plans its input (offsets) needs ``append``: the task plans the checkpoint's input
        before it submits the job, records it on the first attempt and reuses it on every
        retry; its client settings reach the job in spark-submit's environment, never on its
        command line. The last release's spelling still works, with a DeprecationWarning.
    """

    operator_extra_links = (WalsinkCheckpointLink(),)
    template_fields: Sequence[str] = (
        "application",
        "pipeline",
        "checkpoint_key",
        "application_args",
        "conf",
        "target",
        "staging_root",
        "lineage_inputs",
    )
    ui_color = "#f0e4ec"

    def __init__(
        self,
        *,
        application: str,
        pipeline: str,
        mode: str = "overwrite",
        checkpoint_key: str | None = None,
        application_args: Sequence[str] | None = None,
        spark_conn_id: str | None = None,
        master: str = DEFAULT_MASTER,
        conf: Mapping[str, Any] | None = None,
        env_vars: Mapping[str, str] | None = None,
        file_format: str = "parquet",
        partition_by: Sequence[str] = (),
        checksum: str | None = "crc32",
        initial_offsets: Mapping[str, Any] | None = None,
        target: str | None = None,
        walsink_conn_id: str = WalsinkHook.default_conn_name,
        staging_root: str | None = None,
        spark_binary: str | None = None,
        spark_submit_kwargs: Mapping[str, Any] | None = None,
        reprocess: str = "skip",
        lineage_inputs: Sequence[str] = (),
        target_options: Mapping[str, Any] | None = None,
        source: Any = None,
        partition_column: str | None = None,
        partition_key_format: str | None = None,
        **kwargs: Any,
    ) -> None:
        source = source_argument(type(self).__name__, source, kwargs)
        super().__init__(**kwargs)
        self.partitions = PartitionSpec(column=partition_column, key_format=partition_key_format)
        self.partitions.check_declaration(list(partition_by))
        self.target_options = dict(target_options or {})
        if source is not None and (planned := source_from(source)).plans_input and mode != "append":
            raise ValueError(
                f"a {planned.name} source needs mode='append' "
                "(its offsets advance only when a checkpoint commits)"
            )
        self.source = source
        WriteMode.parse(mode)
        Reprocess.parse(reprocess)
        self.reprocess = reprocess
        self.lineage_inputs = list(lineage_inputs)
        # Bad ids fail when the DAG is parsed, not at the first run (templates when rendered).
        validate_static_identifier(pipeline, "pipeline id")
        validate_static_identifier(checkpoint_key, "checkpoint key")
        self.application = application
        self.pipeline = pipeline
        self.mode = mode
        self.checkpoint_key = checkpoint_key
        self.application_args = list(application_args or [])
        self.spark_conn_id = spark_conn_id
        self.master = master
        self.conf = dict(conf or {})
        self.env_vars = dict(env_vars or {})
        self.file_format = file_format
        self.partition_by = list(partition_by)
        self.checksum = checksum
        self.initial_offsets = dict(initial_offsets) if initial_offsets is not None else None
        self.target = target
        self.walsink_conn_id = walsink_conn_id
        self.staging_root = staging_root
        self.spark_binary = spark_binary
        self.spark_submit_kwargs = dict(spark_submit_kwargs or {})
        self._runner: JobRunner | None = None

    def get_runner(self) -> JobRunner:
        """The job runner of ``spark_conn_id``'s connection type, with this task's Spark arguments:
        ``spark_connect`` runs the job as a Spark Connect client, any other (and no connection)
        through spark-submit (:data:`~airflow_provider_walsink.core.runners.RUNNERS`)."""
        conn_type = None
        if self.spark_conn_id is not None:
            # A missing connection is refused here: never spark-submit's silent fallback to yarn.
            conn_type = require_connection(
                self.spark_conn_id,
                named_by=f"spark_conn_id of write task {self.task_id!r}",
                create="create it as a 'spark' connection (spark-submit) or a 'spark_connect' one (Spark Connect)",
            ).conn_type
        name = runner_name(conn_type)
        # spark-submit's own arguments, passed only when set: a runner that does not take them refuses.
        options: dict[str, Any] = {}
        if self.master != DEFAULT_MASTER:
            options["master"] = self.master
        if self.spark_binary is not None:
            options["spark_binary"] = self.spark_binary
        if self.spark_submit_kwargs:
            options["spark_submit_kwargs"] = self.spark_submit_kwargs
        return runner_class(name).for_task(
            job_name=f"walsink-{self.pipeline}",
            spark_conn_id=self.spark_conn_id,
            conf=self.conf,
            env_vars=self.env_vars,
            options=options,
            log=self.log,
        )

    def execute(self, context: Any) -> dict[str, Any]:
        # First: a run walsink cannot place is refused before anything is recorded or submitted.
        interval = run_interval(context, self.checkpoint_key, self.partitions)
        hook = WalsinkHook(self.walsink_conn_id)
        try:
            phase = self._write_phase(context, hook, interval)  # resolves and checks the target
            record = phase.run(lambda: actor_from_context(context))
        except CheckpointSkipped as skipped:
            self._staging_root = phase.staging_root
            # The task ends skipped (no return value): the outcome is pushed as XCom "reprocess".
            result = self._result(context, skipped.record, skipped=True)
            context["ti"].xcom_push(key="reprocess", value={**result, "decision": "skip", "why": skipped.why})
            # The write phase logged the whole decision; Airflow logs this reason again ("Skipping task").
            raise AirflowSkipException(f"already COMMITTED: {skipped.why}") from None
        except PipelineOwnedError as exc:
            raise AirflowFailException(str(exc)) from None  # a retry meets the same owner
        except AttemptCancelledError as exc:
            # Aborted by a person, or another try writes it now: a retry must not undo either.
            raise AirflowFailException(str(exc)) from None
        except PreflightError as exc:
            # A retry meets the same configuration. Every refusal says that nothing was done.
            message = str(exc) if NOTHING_DONE in str(exc) else f"{exc}; {NOTHING_DONE}"
            raise AirflowFailException(message) from None
        self._staging_root = phase.staging_root
        return self._result(context, record, skipped=False)

    def _write_phase(self, context: Any, hook: WalsinkHook, interval: Any) -> WritePhase:
        """The core write phase of this run, built through the walsink hook."""
        root = self._configured_root(hook)
        self._runner = self.get_runner()
        return hook.get_write_phase(
            staging_root=root,
            runner=self._runner,
            source=hook.get_source(self.source),
            pipeline=self.pipeline,
            checkpoint_key=interval.key,
            mode=self.mode,
            application=self.application,
            application_args=self.application_args,
            check_placement=lambda r: check_operator_placement(self, hook, r),
            reprocess=lambda: reprocess_decision(context, self.reprocess),
            version_token=lambda: version_token(context),
            target=self.target,
            # Names only (a conn_id), never a secret: recorded for an abort (issue 35).
            target_connections=connection_references(self.target_options) if self.target else None,
            interval_start=interval.start.isoformat() if interval.start else None,
            interval_end=interval.end.isoformat() if interval.end else None,
            partition_key=interval.partition_key,
            partition_date=interval.partition_date.isoformat() if interval.partition_date else None,
            target_partition=interval.target_partition,
            file_format=self.file_format,
            partition_by=self.partition_by,
            checksum=self.checksum,
            initial_offsets=self.initial_offsets,
            log=self.log,
        )

    def _configured_root(self, hook: WalsinkHook) -> str:
        """The staging root the task is configured with: ``staging_root``, else the target's own,
        else the connection's; a target that cannot be published into is refused here."""
        root = self.staging_root or hook.staging_root
        if self.target is not None:
            self._refuse_unpublishable_staging(root)
            # Before anything is recorded or submitted: a target naming something that is not
            # configured (a catalog, a connection) is refused here, not after the job has run.
            own = target_staging_root(
                self.target,
                mode=self.mode,
                # Object-store roots have no local layout; only the file and SQL targets read one.
                layout=None if is_object_store_root(root) else hook.get_layout(root),  # type: ignore[arg-type]
                partition_by=self.partition_by,
                extra=self.target_options,
            )
            if own and not self.staging_root:
                # A table target stages inside its own location (never visible until committed).
                root = own
        if not is_object_store_root(root):
            root = str(StagingLayout(root).root)  # recorded as an absolute path, as every reader expects
        return root

    def _refuse_unpublishable_staging(self, root: str) -> None:
        """A file target publishes from a local or mounted staging root only: refuse an object-store
        root before the job runs, not at the commit (docs/production.md, "Staging on S3")."""
        if self.target is None or not is_object_store_root(root):
            return
        if isinstance(self.target, str) and target_scheme(self.target) == "file":
            raise ValueError(
                f"staging root {root!r} is on an object store, but target {self.target!r} is a directory of "
                "files, which publishes from a local or mounted staging root only: give the write and commit "
                "tasks a staging_root on a path every node mounts, or publish into a table target"
            )

    def _result(self, context: Any, record: CheckpointRecord, *, skipped: bool) -> dict[str, Any]:
        ti = context["ti"]
        # The durability and commit tasks of walsink_pipeline read where this attempt staged.
        ti.xcom_push(key="staging_root", value=getattr(self, "_staging_root", None))
        ti.xcom_push(key="manifest_uri", value=record.manifest_uri)
        ti.xcom_push(key="manifest_digest", value=record.manifest_digest)
        self._summary = {
            "pipeline": record.pipeline,
            "checkpoint_key": record.checkpoint_key,
            "sequence": record.sequence,
            "attempt": record.sealed_attempt,
            "state": record.state.value,
            "skipped_committed": skipped,
            "manifest_uri": record.manifest_uri,
            "manifest_digest": record.manifest_digest,
            "committables": record.committables,
            "rows": record.rows,
            "bytes": record.bytes,
            "start_offsets": record.start_offsets,
            "end_offsets": record.end_offsets,
            "attempt_id": record.sealed_attempt_id,
            "version": record.version,
        }
        return self._summary

    def get_openlineage_facets_on_complete(self, task_instance: Any) -> Any:
        """The declared inputs, the target as output (staged rows) and the checkpoint as a run facet."""
        return operator_lineage(
            summary=getattr(self, "_summary", None),
            pipeline=self.pipeline,
            checkpoint_key=self.checkpoint_key,
            output_uri=target_uri(self.target) if self.target else None,
            input_uris=[str(u) for u in self.lineage_inputs],
        )

    def on_kill(self) -> None:
        if self._runner is not None:
            self._runner.cancel()
