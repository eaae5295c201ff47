"""The file target's names on disk and option values, its errors, and the refusal of object-store
roots (a ``Path`` of ``s3://...`` would quietly become a local directory).
"""

from __future__ import annotations

import os
from typing import Any
from urllib.parse import urlsplit

from airflow_provider_walsink.core.protocol.errors import LayoutError, PreflightError

BOOKKEEPING_DIR = "_walsink"
MARKER_NAME = "_walsink_checkpoint"
#: What the target holds: the Arrow schema of its data columns, kept by every publish.
SCHEMA_RECORD = "schema.json"
#: ``schema_evolution`` values: what a publish may change of the target's schema on purpose.
SCHEMA_EVOLUTION = ("none", "union", "any")


class TargetSchemaError(LayoutError):
    """The staged data's schema does not fit what the target holds; the message names the columns."""


#: A committable's own suffix (``.snappy.parquet``) is kept in its target name up to this length.
MAX_SUFFIX = 24


class TargetNotWritableError(LayoutError, PreflightError):
    """The file target's root cannot take new files here; raised before the write phase runs."""


class ObjectStoreFileTargetError(LayoutError):
    """A file target, or its staging root, on an object store: refused before anything is written.

    The file target's publish is a rename (``append``) or a directory swap
    (``overwrite``) on one POSIX file system; object stores have neither, and
    a copy-then-delete publish would be visible half done to readers and could
    not be fenced. Publishing to object storage is what the table targets are
    for: their commit is one atomic write of table metadata.
    """


#: What to use instead of a file target on an object store (every refusal says it).
OBJECT_STORE_ALTERNATIVE = (
    "publish to object storage with a table target, whose commit is atomic there: Iceberg "
    "(iceberg://<catalog>/<namespace>.<table>) or Delta (delta+s3://<bucket>/<path>); or give the file "
    "target and its staging root as local or mounted paths (docs/targets.md)"
)


def _object_store_uri(value: Any) -> str | None:
    """``value`` as text if it names a place on an object store (``s3://``, ``gs://``...), else None."""
    if not isinstance(value, str | os.PathLike):
        return None
    text = os.fspath(value)
    if "://" in text and urlsplit(text).scheme.lower() not in ("", "file"):
        return text
    return None


def refuse_object_store(target_root: Any = None, staging_root: Any = None) -> None:
    """Raise :class:`ObjectStoreFileTargetError` if the file target or its staging root is on an object store.

    For the pre-flight checks (before any Spark job runs): ``staging_root`` is a
    path or URI, or a staging store/layout (its ``root_uri``, if it has one).
    """
    if (uri := _object_store_uri(target_root)) is not None:
        raise ObjectStoreFileTargetError(
            f"file target {uri!r} is on an object store, where a file target cannot publish atomically "
            f"(it renames files and swaps directories); {OBJECT_STORE_ALTERNATIVE}. Nothing was written"
        )
    root = getattr(staging_root, "root_uri", staging_root)
    if (uri := _object_store_uri(root)) is not None:
        raise ObjectStoreFileTargetError(
            f"staging root {uri!r} is on an object store: a file target publishes by renaming staged files "
            f"into the target, which needs both on one file system; {OBJECT_STORE_ALTERNATIVE}. Nothing was "
            "written"
        )
