"""The write task: run a PySpark job that stages one checkpoint, then record its seal."""

from __future__ import annotations

import os
import re
import shutil
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from airflow.providers.apache.spark.hooks.spark_submit import DEFAULT_SPARK_BINARY, SparkSubmitHook

from airflow_provider_walsink.core.protocol.errors import ManifestError
from airflow_provider_walsink.core.protocol.manifest import (
    MANIFEST_NAME,
    MAX_MANIFEST_BYTES,
    digest_of,
    parse_manifest,
)
from airflow_provider_walsink.core.spark.args import S3_OPTION_ENV, SECRET_OPTIONS, ProtocolArgs, storage_env
from airflow_provider_walsink.core.staging.layout import StagingLayout
from airflow_provider_walsink.core.staging.object_store import StagingStore
from airflow_provider_walsink.core.store.store import CheckpointRecord, OrderingError, TransitionError
from airflow_provider_walsink.core.targets.registry import target_scheme
from airflow_provider_walsink.hooks.context import (
    REPROCESS_CONF_KEY,
    REPROCESS_POLICIES,
    actor_from_context,
    reprocess_decision,
    run_interval,
    version_token,
)
from airflow_provider_walsink.hooks.staging import is_object_store_root
from airflow_provider_walsink.hooks.walsink import WalsinkHook
from airflow_provider_walsink.operators.commit import target_staging_root, validate_static_identifier
from airflow_provider_walsink.operators.lineage import operator_lineage, target_uri
from airflow_provider_walsink.operators.placement import check_operator_placement
from airflow_provider_walsink.ui.links import WalsinkCheckpointLink

try:
    from airflow.sdk import BaseHook, BaseOperator
    from airflow.sdk.exceptions import AirflowSkipException
except ImportError:  # pragma: no cover
    from airflow.exceptions import AirflowSkipException  # type: ignore[no-redef]
    from airflow.hooks.base import BaseHook  # type: ignore[no-redef]
    from airflow.models import BaseOperator  # type: ignore[no-redef]

#: Master used when the operator names no Spark connection.
DEFAULT_MASTER = "local[*]"
#: Spark settings applied under the default local master unless the user sets them:
#: keep the driver on loopback and skip the web UI (it binds every interface).
LOCAL_DEFAULT_CONF = {
    "spark.driver.host": "127.0.0.1",
    "spark.driver.bindAddress": "127.0.0.1",
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",  # progress bars garble the task log
}


def default_spark_binary() -> str:
    """``spark-submit`` beside this interpreter (a virtualenv's ``bin/``), else on ``PATH``."""
    candidate = os.path.join(os.path.dirname(sys.executable), DEFAULT_SPARK_BINARY)
    if os.access(candidate, os.X_OK):
        return candidate
    return shutil.which(DEFAULT_SPARK_BINARY) or DEFAULT_SPARK_BINARY


def same_root(a: str, b: str) -> bool:
    """Whether two staging roots name the same place (local paths resolved, URIs as written)."""
    if is_object_store_root(a) or is_object_store_root(b):
        return a.rstrip("/") == b.rstrip("/")
    return StagingLayout(a).root == StagingLayout(b).root


#: The environment variables that carry secrets to the job (:data:`S3_OPTION_ENV`, and a Kafka
#: source's client configuration, ``WALSINK_KAFKA_CONFIG``).
SECRET_ENV = frozenset(name for option in SECRET_OPTIONS for name in S3_OPTION_ENV[option]) | {
    "WALSINK_KAFKA_CONFIG"
}


_EXIT_CODE = re.compile(r"Error code is: (-?\d+)")


def describe_failure(exc: BaseException) -> str:
    """One line for the committer table's history: what failed, without the whole command line.

    The Spark hook's error starts with the full spark-submit command and ends
    with the tail of its log; the job's own exception is the last line of it.
    """
    text = str(exc).strip()
    if not text:
        return type(exc).__name__
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    code = _EXIT_CODE.search(lines[0])
    if lines[0].startswith("Cannot execute:") and code:
        tail = next((ln for ln in reversed(lines[1:]) if "Error" in ln or "Exception" in ln), None)
        tail = tail or (lines[-1] if len(lines) > 1 else "no log output")
        return f"spark-submit exited with code {code.group(1)}: {tail}"[:1000]
    return lines[0][:1000]


class ExplicitMasterSparkSubmitHook(SparkSubmitHook):
    """A ``SparkSubmitHook`` whose master is given, not looked up in a connection.

    The provider's hook falls back to ``yarn`` when its connection is missing;
    walsink's default is chosen explicitly instead (``local[*]``), and nothing
    is looked up.
    """

    def __init__(self, *, master: str, **kwargs: Any) -> None:
        self._walsink_master = master
        super().__init__(**kwargs)

    def _resolve_connection(self) -> dict[str, Any]:
        return {
            "master": self._walsink_master,
            "queue": None,
            "deploy_mode": self._deploy_mode,
            "spark_binary": self.spark_binary or DEFAULT_SPARK_BINARY,
            "namespace": self._conf.get("spark.kubernetes.namespace"),
            "principal": self._principal,
            "keytab": self._keytab,
            "rest_scheme": "http",
            "rest_port": 6066,
            "rest_endpoint": None,
        }


class WalWriteOperator(BaseOperator):
    """Stage one checkpoint with a PySpark job (the write phase of the protocol).

    1. Registers the checkpoint in the committer table (idempotent) and starts
       a new write attempt. In ``append`` mode the attempt starts from the
       pipeline's last committed end offsets, and an earlier uncommitted
       checkpoint of the pipeline makes the task fail (retry it later): reading
       from the committed offsets while an earlier checkpoint is still open
       would read its input a second time.
    2. Submits ``application`` through the Spark provider's ``SparkSubmitHook``
       with the protocol arguments (``--walsink-protocol <json>``, see
       :class:`~airflow_provider_walsink.core.spark.args.ProtocolArgs`) ahead of
       ``application_args``. The job stages its output with
       :class:`~airflow_provider_walsink.core.spark.job.CheckpointJob` and writes
       the manifest.
    3. Reads and validates the manifest and records the seal (digest, counts,
       offsets) in the committer table. Pushes ``manifest_uri`` and
       ``manifest_digest`` to XCom and returns a summary.

    A retry starts a new attempt; only the newest sealed attempt ever counts.
    A failed job records the error on the checkpoint (FAILED, retryable).

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
    :param spark_conn_id: a Spark connection (master, deploy mode...). ``None``
        (the default) means master ``local[*]``, chosen explicitly; a named
        connection that does not exist is an error, never a silent ``yarn``.
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
    :param kafka_source: an ``append`` pipeline reading Kafka (docs/kafka.md): a
        :class:`~airflow_provider_walsink.core.sources.kafka.KafkaSourceSpec` or its dict. The task
        plans the checkpoint's ranges before it submits the job (start: the last committed end
        offsets; end: the high watermarks), records them on the first attempt and reuses them
        on every retry; the job reads them with ``KafkaSource.from_job(job)``.
    :param kafka_conn_id: the ``kafka`` connection (client configuration as JSON in its extra),
        passed to the job in spark-submit's environment, never on its command line.
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
        kafka_source: Any = None,
        kafka_conn_id: str = "kafka_default",
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.target_options = dict(target_options or {})
        if kafka_source is not None and mode != "append":
            raise ValueError(
                "a Kafka source needs mode='append' (its offsets advance only when a checkpoint commits)"
            )
        self.kafka_source = kafka_source
        self.kafka_conn_id = kafka_conn_id
        if mode not in ("append", "overwrite"):
            raise ValueError(f"mode must be 'append' or 'overwrite', got {mode!r}")
        if reprocess not in REPROCESS_POLICIES:
            raise ValueError(f"reprocess must be one of {REPROCESS_POLICIES}, got {reprocess!r}")
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
        self._spark_hook: SparkSubmitHook | None = None
        #: The staging root's credentials as spark-submit's environment (set by ``execute``).
        self._staging_env: dict[str, str] = {}

    # ------------------------------------------------------------------ Spark

    def build_spark_hook(self, application_args: list[str]) -> SparkSubmitHook:
        """The provider's hook, with the master chosen explicitly when no connection is named.

        The staging root's credentials (set by :meth:`execute`) join ``env_vars``: the
        environment of the spark-submit process, which a local or client-mode driver
        inherits. They are never on the command line; a master that would put them there
        (YARN and Kubernetes turn ``env_vars`` into ``--conf`` arguments) or cannot take
        them (standalone cluster mode) is refused.
        """
        kwargs: dict[str, Any] = dict(
            name=f"walsink-{self.pipeline}",
            application_args=application_args,
            spark_binary=self.spark_binary,
            **self.spark_submit_kwargs,
        )
        staging_env = dict(self._staging_env)
        if self.spark_conn_id is None:
            self.log.info(
                "No spark_conn_id: submitting to master %s (walsink's explicit default)", self.master
            )
            conf = {**LOCAL_DEFAULT_CONF, **self.conf} if self.master.startswith("local") else self.conf
            env = self._spark_env(staging_env)
            if self.master.startswith("local"):
                env.setdefault("PYSPARK_PYTHON", sys.executable)
                env.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
            kwargs["spark_binary"] = self.spark_binary or default_spark_binary()
            hook: SparkSubmitHook = ExplicitMasterSparkSubmitHook(
                master=self.master, conf=conf, env_vars=env, **kwargs
            )
        else:
            # Fail on a missing connection here: the provider would fall back to yarn.
            BaseHook.get_connection(self.spark_conn_id)
            hook = SparkSubmitHook(
                conn_id=self.spark_conn_id,
                conf=self.conf,
                env_vars=self._spark_env(staging_env) or None,
                **kwargs,
            )
        self._check_credentials_stay_off_the_command_line(hook, staging_env)
        return hook

    def _spark_env(self, staging_env: Mapping[str, str]) -> dict[str, str]:
        """``env_vars`` plus the staging credentials; the same variable set twice differently is an error."""
        env = dict(self.env_vars)
        clash = sorted(k for k, v in staging_env.items() if k in env and str(env[k]) != v)
        if clash:
            raise ValueError(
                f"env_vars sets {clash}, which the staging root's connection sets too: give the staging "
                "credentials in one place (the walsink connection's staging_conn_id)"
            )
        env.update(staging_env)
        return env

    def _check_credentials_stay_off_the_command_line(
        self, hook: SparkSubmitHook, staging_env: Mapping[str, str]
    ) -> None:
        secrets = sorted(k for k in SECRET_ENV if staging_env.get(k))
        if not secrets:
            return
        master = hook._connection["master"]
        if hook._is_yarn or hook._is_kubernetes:
            raise ValueError(
                f"staging credentials cannot reach a job on master {master}: the Spark provider passes "
                f"env_vars to YARN and Kubernetes as --conf arguments, which would put {', '.join(secrets)} "
                "on the spark-submit command line. Let the cluster's own identity reach the bucket (instance "
                'profile, IRSA) and set the walsink connection extra "staging_conn_id": "" (the default '
                "credential chain)"
            )
        if hook._connection["deploy_mode"] == "cluster":
            raise ValueError(
                f"staging credentials cannot reach a job in cluster deploy mode on {master}: its driver does "
                "not inherit spark-submit's environment. Use client deploy mode, or the hosts' default "
                'credential chain (walsink connection extra "staging_conn_id": "")'
            )

    # ------------------------------------------------------------------ execute

    def execute(self, context: Any) -> dict[str, Any]:
        # First: a run walsink cannot place is refused before anything is recorded or submitted.
        interval = run_interval(context, self.checkpoint_key)
        key = interval.key
        hook = WalsinkHook(self.walsink_conn_id)
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
        store = hook.get_store()
        existing = store.get(self.pipeline, key)
        # A Kafka plan the source refuses is refused here, before anything is recorded.
        kafka_config, kafka_planner = self._check_kafka_source(store, existing, context)
        # A checkpoint staged before keeps its recorded root (docs/protocol.md, "Staging root").
        root = self._recorded_root(existing, root)
        self._staging_root = root
        # Before anything is recorded: a cluster master needs a staging root every node sees.
        self.log.info("Staging placement: %s", check_operator_placement(self, hook, root))
        actor = actor_from_context(context)

        record = store.register(
            self.pipeline,
            key,
            mode=self.mode,
            actor=actor,
            target=self.target,
            staging_root=self._staging_root,
        )
        if record.is_committed:
            record = self._reprocess_or_skip(context, store, record, actor)

        start_offsets: dict[str, Any] | None = None
        until_offsets: dict[str, Any] | None = None
        if record.supersedes_attempt_id is not None and self.mode == "append":
            # A new version re-reads exactly the input of the version it replaces.
            start_offsets = record.start_offsets
            until_offsets = store.versions(self.pipeline, key)[-1].end_offsets
        elif self.mode == "append":
            earlier = [r for r in store.pending(self.pipeline) if r.sequence < record.sequence]
            if earlier:
                first = earlier[0]
                # Recorded on the checkpoint (its error, its history): the UI and the CLI show why it waits.
                reason = store.record_blocked(self.pipeline, key, actor=actor)
                raise OrderingError(
                    reason
                    or f"append checkpoint {self.pipeline}/{key} (sequence {record.sequence}) cannot start: "
                    f"earlier checkpoint {first.checkpoint_key} (sequence {first.sequence}) is {first.state}; "
                    "it must commit (or be aborted with `walsink`) first, or its input would be read twice"
                )
            start_offsets = store.last_committed_offsets(self.pipeline)
            if start_offsets is None:
                start_offsets = self.initial_offsets
        source_extra: dict[str, Any] = {}
        if kafka_config is not None:
            from airflow_provider_walsink.hooks.kafka import as_spec, plan_attempt

            # Fixed once per version and reused by every retry (docs/kafka.md, "The offset rule").
            start_offsets, until_offsets, source_extra = plan_attempt(
                store,
                record,
                as_spec(self.kafka_source),
                kafka_config,
                start_offsets=start_offsets,
                until_offsets=until_offsets,
                actor=actor,
                planner=kafka_planner,
            )
        try:
            record = store.start_attempt(
                self.pipeline, key, actor=actor, start_offsets=start_offsets, staging_root=self._staging_root
            )
        except TransitionError as e:
            raise TransitionError(f"{e}; the write task cannot start a new attempt now") from None
        if record.staging_root and not same_root(record.staging_root, root):
            # Another writer recorded a root between our read and this attempt: it wins.
            root = self._recorded_root(record, root)
            self._staging_root = root
            self.log.info("Staging placement: %s", check_operator_placement(self, hook, root))
        attempt = record.attempt
        staging = hook.get_staging_store(root)
        location = staging.attempt(self.pipeline, key, attempt, record.attempt_id)
        if staging.is_local:
            attempt_dir = Path(location.path)
            if attempt_dir.exists():  # left by a crash with the same attempt number: never reuse its files
                staging.remove_attempt(location)
            attempt_dir.mkdir(parents=True)
        elif staging.list_attempt(location):
            # An object store has no directories to create; objects left under this attempt's
            # prefix (a crash with the same attempt id) would mix with the job's.
            staging.remove_attempt(location)
        # Credentials reach the job in spark-submit's environment, never on its command line.
        self._staging_env = storage_env(root, hook.get_staging_credentials(root).options)
        if kafka_config is not None:
            from airflow_provider_walsink.hooks.kafka import kafka_env

            self._staging_env.update(kafka_env(kafka_config))

        protocol = ProtocolArgs(
            pipeline=self.pipeline,
            checkpoint_key=key,
            sequence=record.sequence,
            attempt=attempt,
            staging_root=root,
            mode=self.mode,
            file_format=self.file_format,
            partition_by=tuple(self.partition_by),
            start_offsets=start_offsets,
            interval_start=interval.start.isoformat() if interval.start else None,
            interval_end=interval.end.isoformat() if interval.end else None,
            checksum=self.checksum,
            attempt_id=record.attempt_id or "",
            until_offsets=until_offsets,
            extra=source_extra,
        )
        self.log.info(
            "Checkpoint %s/%s sequence %d: attempt %d stages into %s (start offsets %s)",
            self.pipeline,
            key,
            record.sequence,
            attempt,
            location.uri,
            start_offsets,
        )
        try:
            self._spark_hook = self.build_spark_hook([*protocol.to_argv(), *map(str, self.application_args)])
            self._spark_hook.submit(self.application)
            record = self._record_seal(store, staging, protocol, actor)
        except BaseException as exc:
            detail = describe_failure(exc)
            try:
                # Owned: fails this attempt only, never a checkpoint a newer try or a committer holds.
                store.fail(
                    self.pipeline,
                    key,
                    error=f"write attempt {attempt}: {detail}",
                    actor=actor,
                    attempt=attempt,
                )
            except Exception as fail_exc:  # noqa: BLE001 - keep the original error
                self.log.warning("could not record the failure: %s", fail_exc)
            raise
        return self._result(context, record, skipped=False)

    def _check_kafka_source(
        self, store: Any, existing: CheckpointRecord | None, context: Any
    ) -> tuple[Any, Any]:
        """``(client configuration, planner)`` of the Kafka source (``(None, None)``: none), once the
        checkpoint's next attempt is planned as it will be after the checkpoint is registered: a
        missing topic or partition, offsets gone backwards or a retention gap not accepted fail
        here, with the committer table unchanged (docs/kafka.md, "The offset rule")."""
        if self.kafka_source is None:
            return None, None
        from airflow_provider_walsink.hooks.kafka import (
            OffsetPlanner,
            as_spec,
            attempt_range,
            check_before_recording,
            kafka_client_config,
        )

        config = kafka_client_config(self.kafka_conn_id)
        spec = as_spec(self.kafka_source)
        replacing = False
        if existing is not None and existing.is_committed:
            decision, _ = reprocess_decision(context, self.reprocess)
            replacing = decision == "replace" and existing.version_token != version_token(context)
        planner = OffsetPlanner(config)
        try:
            for topic in spec.topics:
                planner.meta.partitions(topic)
            offsets = attempt_range(
                store, self.pipeline, existing, initial_offsets=self.initial_offsets, replacing=replacing
            )
            if offsets is not None:
                check_before_recording(
                    store,
                    self.pipeline,
                    existing,
                    spec,
                    planner,
                    start_offsets=offsets[0],
                    until_offsets=offsets[1],
                )
        finally:
            planner.close()  # the memo stays: the plan recorded later is the one checked here
        return config, planner

    def _recorded_root(self, record: CheckpointRecord | None, configured: str) -> str:
        """The staging root this attempt stages under: the checkpoint's recorded root, if it has one.

        A checkpoint's attempts (and its later versions) never split across
        staging roots: the sensor, the commit, the UI, GC and abort all read
        the recorded root. So when the connection, the target or
        ``staging_root`` now name another place, the recorded root wins, and
        the task log says so.
        """
        if record is None or not record.staging_root:
            return configured
        recorded = record.staging_root
        if not same_root(recorded, configured):
            self.log.warning(
                "Checkpoint %s/%s is staged under %s (recorded when it was first written); this attempt "
                "stages there too, not under the configured %s: a checkpoint's attempts never split "
                'across staging roots (docs/protocol.md, "Staging root")',
                record.pipeline,
                record.checkpoint_key,
                recorded,
                configured,
            )
        return recorded

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

    def _record_seal(
        self, store: Any, layout: StagingLayout | StagingStore, protocol: ProtocolArgs, actor: Any
    ) -> CheckpointRecord:
        if isinstance(layout, StagingStore) and not layout.is_local:
            location = layout.attempt(
                protocol.pipeline, protocol.checkpoint_key, protocol.attempt, protocol.attempt_id or None
            )
            path: Any = f"{location.uri}/{MANIFEST_NAME}"
            manifest_uri = path
            try:
                with layout.filesystem.open_input_stream(location.manifest_path) as stream:
                    data = stream.read(MAX_MANIFEST_BYTES + 1)
            except FileNotFoundError:
                raise ManifestError(
                    f"the Spark job finished but sealed no manifest at {path}: does it stage through "
                    "CheckpointJob and leave its `with` block (or call job.seal())?"
                ) from None
        else:
            if isinstance(layout, StagingStore):
                assert layout.layout is not None
                layout = layout.layout
            path = layout.manifest_path(
                protocol.pipeline, protocol.checkpoint_key, protocol.attempt, protocol.attempt_id or None
            )
            manifest_uri = path.as_uri()
            try:
                fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
            except FileNotFoundError:
                raise ManifestError(
                    f"the Spark job finished but sealed no manifest at {path}: does it stage through "
                    "CheckpointJob and leave its `with` block (or call job.seal())?"
                ) from None
            with os.fdopen(fd, "rb") as f:
                data = f.read()
        manifest = parse_manifest(data, source=f"manifest {path}")
        expected = (
            protocol.pipeline,
            protocol.checkpoint_key,
            protocol.sequence,
            protocol.attempt,
            protocol.attempt_id,
        )
        found = (
            manifest.pipeline,
            manifest.checkpoint_key,
            manifest.sequence,
            manifest.attempt,
            manifest.attempt_id,
        )
        if found != expected:
            raise ManifestError(f"manifest {path} describes {found}, not {expected}")
        if manifest.start_offsets != protocol.start_offsets:
            raise ManifestError(
                f"manifest {path} starts at offsets {manifest.start_offsets}, but the attempt was "
                f"started at {protocol.start_offsets}"
            )
        if protocol.until_offsets is not None and manifest.end_offsets != protocol.until_offsets:
            raise ManifestError(
                f"manifest {path} ends at offsets {manifest.end_offsets}, but this reprocess must end "
                f"where the version it replaces ended, {protocol.until_offsets} (read job.until_offsets): "
                "otherwise later checkpoints would be read twice or skipped"
            )
        digest = digest_of(data)
        record = store.seal_manifest(manifest, manifest_uri=manifest_uri, manifest_digest=digest, actor=actor)
        self.log.info(
            "Sealed %s/%s attempt %d: %d committables, %d rows, %d bytes, end offsets %s, digest %s",
            protocol.pipeline,
            protocol.checkpoint_key,
            protocol.attempt,
            manifest.expected_count,
            manifest.total_rows,
            manifest.total_bytes,
            manifest.end_offsets,
            digest,
        )
        return record

    def _reprocess_or_skip(
        self, context: Any, store: Any, record: CheckpointRecord, actor: Any
    ) -> CheckpointRecord:
        """A COMMITTED checkpoint: start a new version (reprocess ``replace``) or skip, loudly."""
        name = f"{self.pipeline}/{record.checkpoint_key}"
        decision, why = reprocess_decision(context, self.reprocess)
        if decision == "replace":
            token = version_token(context)
            new = store.begin_version(
                self.pipeline, record.checkpoint_key, token=token, actor=actor, reason=why
            )
            if new is not None:
                self.log.warning(
                    "Checkpoint %s is COMMITTED (version %d, attempt %s); REPROCESS: writing version %d, "
                    "which will supersede it when it commits (%s)",
                    name,
                    record.version,
                    record.sealed_attempt_id,
                    new.version,
                    why,
                )
                return new
            why = f"this run ({token}) already wrote version {record.version}"
        message = (
            f"Checkpoint {name} is already COMMITTED (version {record.version}, attempt "
            f"{record.sealed_attempt_id}, at {record.committed_at}): SKIPPED, nothing is rewritten ({why}). "
            f"To rewrite it, reprocess with reprocess='replace' or the run conf "
            f'{{"{REPROCESS_CONF_KEY}": "replace"}} (docs/backfill.md)'
        )
        self.log.warning("%s", message)
        store.record_event(
            self.pipeline,
            record.checkpoint_key,
            actor=actor,
            detail=f"write skipped: the checkpoint is already COMMITTED ({why})",
        )
        # The task ends skipped (no return value): the outcome is pushed as XCom "reprocess".
        context["ti"].xcom_push(
            key="reprocess",
            value={**self._result(context, record, skipped=True), "decision": "skip", "why": why},
        )
        raise AirflowSkipException(message)

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
        if self._spark_hook is not None:
            self._spark_hook.on_kill()
