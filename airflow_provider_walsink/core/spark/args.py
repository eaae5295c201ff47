"""The protocol arguments the write operator passes to a PySpark job.

Airflow-free and Spark-free: the operator builds them, the job parses them.
They travel as one JSON command-line argument, ``--walsink-protocol <json>``,
ahead of the user's own application arguments, so the job needs neither an
Airflow installation nor the committer database's credentials: the operator
records every state change; the job only stages files and writes the
manifest.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from airflow_provider_walsink.core.protocol.errors import WalsinkError
from airflow_provider_walsink.core.protocol.identifiers import validate_identifier
from airflow_provider_walsink.core.protocol.manifest import CHECKSUM_ALGORITHMS, FILE_FORMATS
from airflow_provider_walsink.core.protocol.modes import WriteMode

FLAG = "--walsink-protocol"


class ProtocolArgumentError(WalsinkError):
    """The job was started without valid walsink protocol arguments."""


@dataclass(frozen=True)
class ProtocolArgs:
    """Everything a job needs to stage one attempt of one checkpoint.

    :param pipeline: pipeline id.
    :param checkpoint_key: the checkpoint (one data interval).
    :param sequence: the checkpoint's sequence number in the pipeline.
    :param attempt: the write attempt the operator started (the job stages into
        ``<staging_root>/<pipeline>/<checkpoint_key>/attempt-<attempt>-<attempt id>/``).
    :param staging_root: the staging root: a local or shared-filesystem path, or an
        object store (``s3://bucket/prefix``; :class:`~airflow_provider_walsink.core.staging.object_store.StagingStore`).
    :param mode: ``overwrite`` or ``append`` (informational for the job).
    :param file_format: default Spark format for :meth:`CheckpointJob.stage`.
    :param partition_by: default partition columns for :meth:`CheckpointJob.stage`.
    :param start_offsets: the last committed end offsets (``append`` pipelines);
        the job reads its source from here.
    :param interval_start: ISO timestamp of the run's data interval start, if any.
    :param interval_end: ISO timestamp of the run's data interval end, if any.
    :param checksum: algorithm for committable checksums (``crc32``, ``sha256``)
        or ``None`` for sizes only.
    :param until_offsets: set when the attempt reprocesses a committed
        ``append`` checkpoint as a new version: the job must read exactly up
        to these offsets (the end of the version it replaces) and end there,
        or the checkpoints after it would be read twice or skipped.
    :param partition_key: the run's partition key (a partitioned run: ``CronPartitionTimetable``,
        a partitioned backfill, a run triggered with one), else ``None``; the checkpoint key is
        derived from it (docs/backfill.md, "Partitioned runs").
    :param partition_date: ISO timestamp of the run's partition date, if Airflow gave one.
    :param target_partition: the one target partition (``dt=2026-01-05``) this checkpoint
        replaces (the pipeline declares ``partition_column``); an ``overwrite`` job names it
        replaced even if it writes no row to it, and stages nothing outside it.
    """

    pipeline: str
    checkpoint_key: str
    sequence: int
    attempt: int
    staging_root: str
    mode: str = "overwrite"
    file_format: str = "parquet"
    partition_by: tuple[str, ...] = ()
    start_offsets: dict[str, Any] | None = None
    interval_start: str | None = None
    interval_end: str | None = None
    checksum: str | None = "crc32"
    extra: dict[str, Any] = field(default_factory=dict)
    #: The attempt's globally unique id (from the committer table); the manifest carries it.
    attempt_id: str = ""
    until_offsets: dict[str, Any] | None = None
    partition_key: str | None = None
    partition_date: str | None = None
    target_partition: str | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "partition_by", tuple(self.partition_by))
        try:
            validate_identifier(self.pipeline, "pipeline id")
            validate_identifier(self.checkpoint_key, "checkpoint key")
        except WalsinkError as e:
            raise ProtocolArgumentError(str(e)) from None
        for name in ("sequence", "attempt"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ProtocolArgumentError(f"{name} must be a positive integer, got {value!r}")
        WriteMode.parse(self.mode, error=ProtocolArgumentError)
        if self.file_format not in FILE_FORMATS:
            raise ProtocolArgumentError(
                f"file format {self.file_format!r} is not one of {', '.join(FILE_FORMATS)}"
            )
        if self.checksum is not None and self.checksum not in CHECKSUM_ALGORITHMS:
            raise ProtocolArgumentError(
                f"checksum must be one of {', '.join(CHECKSUM_ALGORITHMS)} or null, got {self.checksum!r}"
            )
        if not self.staging_root:
            raise ProtocolArgumentError("staging_root is empty")

    def to_json(self) -> str:
        data = asdict(self)
        data["partition_by"] = list(self.partition_by)
        return json.dumps(data, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> ProtocolArgs:
        try:
            data = json.loads(text)
        except ValueError as e:
            raise ProtocolArgumentError(f"{FLAG} is not valid JSON ({e})") from None
        if not isinstance(data, dict):
            raise ProtocolArgumentError(f"{FLAG} must be a JSON object")
        known = set(cls.__dataclass_fields__)
        unknown = sorted(set(data) - known)
        if unknown:
            raise ProtocolArgumentError(f"{FLAG} has unknown fields {unknown}")
        try:
            return cls(**data)
        except TypeError as e:
            raise ProtocolArgumentError(f"{FLAG} is incomplete ({e})") from None

    def to_argv(self) -> list[str]:
        return [FLAG, self.to_json()]

    @classmethod
    def from_argv(cls, argv: Sequence[str]) -> tuple[ProtocolArgs, list[str]]:
        """Split ``argv`` into the protocol arguments and the user's own arguments."""
        argv = list(argv)
        for i, arg in enumerate(argv):
            if arg == FLAG:
                if i + 1 >= len(argv):
                    raise ProtocolArgumentError(f"{FLAG} needs a value")
                return cls.from_json(argv[i + 1]), argv[:i] + argv[i + 2 :]
            if arg.startswith(FLAG + "="):
                return cls.from_json(arg[len(FLAG) + 1 :]), argv[:i] + argv[i + 1 :]
        raise ProtocolArgumentError(
            f"no {FLAG} argument: this job must be started by WalWriteOperator (or given the "
            "protocol arguments by hand)"
        )


# ---------------------------------------------------------------------- object-store credentials

#: How an ``s3://`` staging root's storage options travel from the write task to the job: in
#: the environment of spark-submit (inherited by a local or client-mode driver), never on the
#: command line, where ``ps`` and the task log would show them. The names are the AWS SDKs'
#: own, so boto3 and pyarrow in the job agree with what walsink reads.
S3_OPTION_ENV: dict[str, tuple[str, ...]] = {
    "access_key": ("AWS_ACCESS_KEY_ID",),
    "secret_key": ("AWS_SECRET_ACCESS_KEY",),
    "session_token": ("AWS_SESSION_TOKEN",),
    "region": ("AWS_REGION", "AWS_DEFAULT_REGION"),
    "endpoint_url": ("AWS_ENDPOINT_URL",),
}
#: The same for a ``gs://`` root's options (``core/staging/gcs.py``), from its ``google_cloud_platform``
#: connection. walsink's own names: the job reads exactly what the write task's connection gave.
GCS_OPTION_ENV: dict[str, tuple[str, ...]] = {
    "keyfile_dict": ("WALSINK_GCS_KEYFILE_DICT",),
    "project": ("WALSINK_GCS_PROJECT",),
    "anonymous": ("WALSINK_GCS_ANONYMOUS",),
    "endpoint_url": ("WALSINK_GCS_ENDPOINT_URL",),
}
#: The same for an ``abfss://`` root's options (``core/staging/adls.py``), from its ``wasb`` or
#: ``adls`` connection.
AZURE_OPTION_ENV: dict[str, tuple[str, ...]] = {
    "account_key": ("WALSINK_AZURE_ACCOUNT_KEY",),
    "endpoint_url": ("WALSINK_AZURE_ENDPOINT_URL",),
}
#: The options that are secrets (never logged, never on a command line).
SECRET_OPTIONS = frozenset({"access_key", "secret_key", "session_token", "keyfile_dict", "account_key"})


def _is_s3(root: str) -> bool:
    return root.split("://", 1)[0].lower() in ("s3", "s3a") if "://" in root else False


def _option_env(root: str) -> dict[str, tuple[str, ...]] | None:
    """Which variables carry a root's options: S3's, GCS's, Azure's, or ``None`` (the root takes none)."""
    if _is_s3(root):
        return S3_OPTION_ENV
    scheme = root.split("://", 1)[0].lower() if "://" in root else ""
    if scheme in ("gs", "gcs"):
        return GCS_OPTION_ENV
    if scheme in ("abfs", "abfss"):
        return AZURE_OPTION_ENV
    return None


def storage_env(staging_root: str, options: Mapping[str, Any]) -> dict[str, str]:
    """The environment variables that carry ``options`` of an ``s3://``, ``gs://`` or ``abfss://``
    root to the job.

    ``{}`` for any other root (local roots take no options). Raises :class:`ProtocolArgumentError`
    for an option that cannot travel this way.
    """
    if not options:
        return {}
    table = _option_env(staging_root)
    if table is None:
        raise ProtocolArgumentError(
            f"storage options ({', '.join(sorted(options))}) can reach the job only for an s3://, gs:// or "
            f"abfss:// staging root, not {staging_root!r}"
        )
    unknown = sorted(set(options) - set(table))
    if unknown:
        raise ProtocolArgumentError(
            f"storage options {unknown} cannot be passed to the job (it reads {sorted(table)})"
        )
    env: dict[str, str] = {}
    if options.get("access_key") and not options.get("session_token"):
        # Keys without a token: a token the worker's own environment holds belongs to other keys.
        env["AWS_SESSION_TOKEN"] = ""
    for option, value in options.items():
        if value:
            for name in table[option]:
                env[name] = str(value)
    return env


def storage_options_from_env(staging_root: str, environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The job's side of :func:`storage_env`: an ``s3://``, ``gs://`` or ``abfss://`` root's options
    from the environment the write task gave the job.

    ``{}`` for another root, and when none of the variables is set (then
    :class:`~airflow_provider_walsink.core.staging.object_store.StagingStore` uses the
    default credential chain). The values go into the job's ``pyarrow`` file system,
    which Spark ships to the executors inside their tasks.
    """
    table = _option_env(staging_root)
    if table is None:
        return {}
    import os

    environ = os.environ if environ is None else environ
    options: dict[str, str] = {}
    for option, names in table.items():
        value = next((environ[n] for n in names if environ.get(n)), None)
        if value:
            options[option] = value
    return options
