"""The Apache Iceberg target (pyiceberg): ``iceberg://<catalog>/<namespace>.<table>``.

One module per concern, as ``core/targets/files/``:

* :mod:`.publisher`: :class:`IcebergPublisher`, the target contract (publish one attempt,
  the marker rule, clean-up); its docstring is the design;
* :mod:`.group`: several checkpoints in one snapshot (a group commit);
* :mod:`.tombstone`: an abort's tombstone in the table;
* :mod:`.commit`: one commit try (snapshot + marker in one transaction, library retries off);
* :mod:`.retract`: what a commit removes (replaced partitions, an older attempt's files);
* :mod:`.catalog`: where the catalog comes from (a connection, ``target_options``, pyiceberg's
  own configuration, or walsink's embedded SQL catalog), configured, never guessed;
* :mod:`.markers`: what a commit records in the table (markers, partition holders, tombstones);
* :mod:`.files`: staged Parquet files as Iceberg data files, and a new table's schema;
* :mod:`.outcome`: a commit whose outcome the catalog did not report (a REST catalog's
  5xx after applying, a dropped connection, a time-out), decided from the table's marker.
"""

from __future__ import annotations

from airflow_provider_walsink.core.targets.iceberg.commit import (
    GROUP_COMMIT_ATTEMPTS,
    MAX_COMMIT_ATTEMPTS,
    without_library_retries,
)
from airflow_provider_walsink.core.targets.iceberg.files import IcebergTargetError
from airflow_provider_walsink.core.targets.iceberg.markers import MARKER_PREFIX, marker_property
from airflow_provider_walsink.core.targets.iceberg.publisher import IcebergPublisher

__all__ = [
    "GROUP_COMMIT_ATTEMPTS",
    "MARKER_PREFIX",
    "MAX_COMMIT_ATTEMPTS",
    "IcebergPublisher",
    "IcebergTargetError",
    "marker_property",
    "without_library_retries",
]
