"""The Delta Lake target (deltalake): ``delta:///abs/path``, ``delta+s3://bucket/path``,
``delta+gs://bucket/path``, ``delta+abfss://container@account.dfs.core.windows.net/path``.

One module per concern, as ``core/targets/files/``:

* :mod:`.publisher`: :class:`DeltaPublisher`, the target contract (publish one attempt in one
  table version, the marker rule through application transactions, clean-up); its docstring
  is the design;
* :mod:`.group`: several checkpoints in one table version (a group commit);
* :mod:`.tombstone`: an abort's tombstone in the table;
* :mod:`.actions`: the add and remove actions a commit writes, and the ordering rule;
* :mod:`.log`: what a commit writes to the Delta log (application transactions, commit info,
  partition holders, file statistics);
* :mod:`.stores`: a table on Google Cloud Storage or Azure: deltalake's options from its connection.
"""

from __future__ import annotations

from airflow_provider_walsink.core.targets.delta.log import app_id, delta_stats, delta_stats_columns
from airflow_provider_walsink.core.targets.delta.publisher import DeltaPublisher, DeltaTargetError

__all__ = ["DeltaPublisher", "DeltaTargetError", "app_id", "delta_stats", "delta_stats_columns"]
