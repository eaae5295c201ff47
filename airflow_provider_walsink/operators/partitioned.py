"""Asset partitions (Airflow 3.2+) in a pipeline, degrading to data-interval keys on older Airflow.

On Airflow 3.2 and newer a run may carry a partition key (``CronPartitionTimetable``, a
partitioned backfill, a run triggered with ``partition_key``) and walsink keys the run's
checkpoint by it (``core/protocol/partition_keys.py``; docs/backfill.md, "Partitioned runs").
On an older Airflow no run has one, so every pipeline keeps its data-interval keys; a pipeline
that declares partition settings there says so in one log line instead of failing to import.
"""

from __future__ import annotations

import logging
from typing import Any

from airflow_provider_walsink.hooks import versions

log = logging.getLogger(__name__)

#: The oldest Airflow whose runs carry a partition key (AIP-76).
PARTITIONS_SINCE = "3.2"


def airflow_has_partitions() -> bool:
    """Does the installed Airflow give runs partition keys (``hooks/versions.py``: asset_partitions)?"""
    return versions.missing("asset_partitions") is None


def partition_arguments(column: str | None, key_format: str | None) -> dict[str, Any]:
    """The write task's partition arguments; none, with one log line, on an Airflow without partitions."""
    if column is None and key_format is None:
        return {}
    if not airflow_has_partitions():
        log.warning(
            "walsink: this Airflow has no asset partitions (they need Airflow %s+): partition_column=%r "
            "and partition_key_format=%r are ignored, and the pipeline keys its checkpoints by the "
            "run's data interval as before",
            PARTITIONS_SINCE,
            column,
            key_format,
        )
        return {}
    return {"partition_column": column, "partition_key_format": key_format}
