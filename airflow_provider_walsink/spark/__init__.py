"""Code that runs inside the PySpark job of a write phase (see :mod:`.job`).

:mod:`.args` is importable without Spark (the operator uses it); :mod:`.job`
imports PySpark lazily.
"""

from .args import FLAG, ProtocolArgs, ProtocolArgumentError
from .job import CheckpointJob, StagedWrite, StagingError, hadoop_uri

__all__ = [
    "FLAG",
    "CheckpointJob",
    "ProtocolArgs",
    "ProtocolArgumentError",
    "StagedWrite",
    "StagingError",
    "hadoop_uri",
]
