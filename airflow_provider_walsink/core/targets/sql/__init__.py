"""The SQL table target (PostgreSQL, MySQL/MariaDB): ``sql://<conn_id>/<schema>.<table>``.

One module per concern, as ``core/targets/files/``:

* :mod:`.publisher`: :class:`SqlPublisher`, the target contract (rows and marker in one
  transaction); its docstring is the design;
* :mod:`.plan`: the load plan (what is loaded, what is replaced);
* :mod:`.load`: the bulk load (``COPY`` / ``LOAD DATA`` / batched inserts);
* :mod:`.markers`: the marker and order tables;
* :mod:`.schema`: identifiers, column types, and the target's errors.
"""

from __future__ import annotations

from airflow_provider_walsink.core.targets.sql.publisher import SqlPublisher
from airflow_provider_walsink.core.targets.sql.schema import SchemaMismatchError, SqlTargetError

__all__ = ["SchemaMismatchError", "SqlPublisher", "SqlTargetError"]
