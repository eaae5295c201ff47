"""Code that runs inside the PySpark job of a write phase (see :mod:`.job`).

:mod:`.args` is importable without Spark (the operator uses it); :mod:`.job`
imports PySpark lazily.
"""

from airflow_provider_walsink.core.spark.args import FLAG, ProtocolArgs, ProtocolArgumentError
from airflow_provider_walsink.core.spark.job import CheckpointJob, StagedWrite, StagingError, hadoop_uri

__all__ = [
    "FLAG",
    "CheckpointJob",
    "ProtocolArgs",
    "ProtocolArgumentError",
    "StagedWrite",
    "StagingError",
    "hadoop_uri",
]
