"""The commit sequence: writer (start, seal), committer (lease, publish, record), abort, audit, GC.

Airflow-free; the committer table it records into is :mod:`airflow_provider_walsink.core.store`.
"""

from airflow_provider_walsink.core.commit.commit import CheckpointCommitter, CommitSummary
from airflow_provider_walsink.core.commit.writer import CheckpointWriter

__all__ = ["CheckpointCommitter", "CheckpointWriter", "CommitSummary"]
