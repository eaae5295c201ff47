"""The commit sequence: writer (start, seal), committer (check, fence, publish, record), abort, audit, GC.

Airflow-free; the committer table it records into is :mod:`airflow_provider_walsink.core.store`.
:class:`CheckpointCommitter` (:mod:`.commit`) holds the sequence; its fencing
steps are a strategy (:mod:`.fencing`: :mod:`.lease` or :mod:`.tablefence`),
group commit is :mod:`.group`, and the steps every path shares live in
:mod:`.sealed`, :mod:`.refusals`, :mod:`.summary` and :mod:`.aftercommit`.
"""

from airflow_provider_walsink.core.commit.commit import CheckpointCommitter, CommitSummary
from airflow_provider_walsink.core.commit.writer import CheckpointWriter

__all__ = ["CheckpointCommitter", "CheckpointWriter", "CommitSummary"]
