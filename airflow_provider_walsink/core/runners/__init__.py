"""Job runners: where the write phase's PySpark job runs (contract: :class:`.base.JobRunner`).

One line per runner, ``name -> "module:Class"``, imported only when asked for: a runner
that needs Airflow lives under ``airflow_provider_walsink.hooks``, which the core never
imports.
"""

from __future__ import annotations

from airflow_provider_walsink.core.registry import load_registered
from airflow_provider_walsink.core.runners.base import JobRunner, describe_job_ref

#: Runner name (the Airflow connection type of where the job runs) -> ``"module:Class"``.
RUNNERS: dict[str, str] = {
    "spark": "airflow_provider_walsink.hooks.spark_submit_runner:SparkSubmitRunner",
    "spark_connect": "airflow_provider_walsink.hooks.spark_connect_runner:SparkConnectRunner",
}
#: The runner of no connection, and of a connection type no runner is registered for: spark-submit
#: reads any connection as a master (``yarn://``, ``spark://host:7077``...), as before runners
#: were chosen by connection type.
DEFAULT_RUNNER = "spark"


def runner_name(conn_type: str | None) -> str:
    """The runner a connection of ``conn_type`` runs its job through (``None``: no connection)."""
    return conn_type if conn_type in RUNNERS else DEFAULT_RUNNER


def runner_class(name: str) -> type[JobRunner]:
    """The runner registered as ``name`` (imported now)."""
    return load_registered(RUNNERS, name, JobRunner, "job runner")


__all__ = ["DEFAULT_RUNNER", "RUNNERS", "JobRunner", "describe_job_ref", "runner_class", "runner_name"]
