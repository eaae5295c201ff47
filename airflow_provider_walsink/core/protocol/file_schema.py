"""The staged Parquet files' schema as a manifest records it (:class:`~.manifest.FileSchema`).

The write job reads every staged file's footer for its row count; this module
turns that footer's schema into the manifest's ``file_schema`` (one Arrow IPC
schema message, base64, metadata stripped, plus the INT96 columns), and back.
pyarrow is imported only when a function is called: the rest of the protocol
does not need it.
"""

from __future__ import annotations

import base64
from collections.abc import Iterable
from typing import Any

from airflow_provider_walsink.core.protocol.errors import ManifestError
from airflow_provider_walsink.core.protocol.manifest import FileSchema


def file_schema_of(parquet_metadata: Any) -> FileSchema:
    """The :class:`FileSchema` of one Parquet file, from its footer (``pyarrow.parquet.FileMetaData``)."""
    import pyarrow as pa

    arrow = parquet_metadata.schema.to_arrow_schema()
    stripped = pa.schema([f.remove_metadata() for f in arrow])
    schema = parquet_metadata.schema
    int96 = tuple(
        schema.column(i).path for i in range(len(schema)) if schema.column(i).physical_type == "INT96"
    )
    return FileSchema(base64.b64encode(stripped.serialize().to_pybytes()).decode("ascii"), int96)


def common_file_schema(schemas: Iterable[FileSchema | None]) -> FileSchema | None:
    """The one schema all files have, or ``None`` (no file, a file not described, or two schemas)."""
    found: FileSchema | None = None
    for schema in schemas:
        if schema is None or (found is not None and schema != found):
            return None
        found = schema
    return found


def arrow_schema(file_schema: FileSchema) -> Any:
    """The ``pyarrow.Schema`` a :class:`FileSchema` records; :class:`ManifestError` if it cannot be read."""
    import pyarrow as pa

    try:
        return pa.ipc.read_schema(pa.py_buffer(base64.b64decode(file_schema.arrow)))
    except (pa.ArrowException, ValueError) as e:
        raise ManifestError(f"manifest: file_schema.arrow is not an Arrow schema ({e})") from None
