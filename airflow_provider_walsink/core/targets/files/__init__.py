"""A publisher for partitioned file tables (Parquet, ORC, JSON, CSV, ... as Spark writes them).

``append``: each committable is renamed into its partition under a name that
carries the attempt's globally unique id (``<key>-<attempt id>-<index>``), so
a re-publish recognises its own files by identity, never a same-sized file of
another attempt or of an earlier life of the checkpoint.

``overwrite``: each partition the checkpoint covers is assembled complete in
a hidden pending directory and then swapped with the live partition in one
``renameat2(RENAME_EXCHANGE)`` (two renames where the kernel lacks it); the
old files are deleted only after the new ones are in place. A marker file in
the partition names the pipeline, checkpoint key and attempt id that wrote
it: a re-publish of that attempt skips it, and a commit of an *older*
checkpoint key over it is refused (invariant 10) unless the pipeline allows
it explicitly.

Schema (Parquet): before anything changes, the staged schema (the
manifest's ``file_schema``, else the staged footers) is checked against what
the target holds, recorded in ``_walsink/schema.json`` (else, for a target
written before the record existed, the footer of one of its files). By
default the columns must match by name and type (any order: readers bind by
name); ``schema_evolution`` (a target option) allows more on purpose:
``"union"`` adds or leaves out nullable columns, ``"any"`` also changes a
type. See :func:`schema_changes` and docs/targets.md.

Bookkeeping lives under ``<target>/_walsink/``, which Spark and Hive readers
ignore (leading underscore): a *publish journal* per checkpoint names the
attempt being published and the files it creates, so a later attempt of the
same checkpoint can roll them back first.

Fencing: every side effect (a rename, a swap, a delete, a journal write) is
preceded by ``ctx.fence()``. On a POSIX file system a window remains between
that check and the side effect: a process paused right there for longer than
the lease TTL can still rename once after another committer took over
(docs/guarantees.md). Layout: the target is never followed through a
symlink; directories are opened with ``O_NOFOLLOW`` and renames are made
relative to those descriptors, so a link swapped in after planning cannot
redirect a rename or a delete.

The package, one module per concern (each imports only those before it in this list):
``spec`` (names on disk, option values, errors, the object-store refusal), ``fsops`` (moves,
atomic writes and the partition swap relative to directory descriptors), ``schema`` (the schema
check), ``retract`` (roll-back and retraction from the publish journals), ``publisher``
(:class:`FilePublisher`). Every name is re-exported here: import from
``airflow_provider_walsink.core.targets.files``.
"""

from __future__ import annotations

from airflow_provider_walsink.core.protocol.manifest import fsync_dir
from airflow_provider_walsink.core.targets.files.fsops import _suffixes as _suffixes  # tests/test_confiner.py
from airflow_provider_walsink.core.targets.files.fsops import write_atomic_at
from airflow_provider_walsink.core.targets.files.publisher import FilePublisher
from airflow_provider_walsink.core.targets.files.schema import schema_changes
from airflow_provider_walsink.core.targets.files.spec import (
    BOOKKEEPING_DIR,
    MARKER_NAME,
    MAX_SUFFIX,
    OBJECT_STORE_ALTERNATIVE,
    SCHEMA_EVOLUTION,
    SCHEMA_RECORD,
    ObjectStoreFileTargetError,
    TargetNotWritableError,
    TargetSchemaError,
    refuse_object_store,
)

__all__ = [
    "BOOKKEEPING_DIR",
    "FilePublisher",
    "MARKER_NAME",
    "MAX_SUFFIX",
    "OBJECT_STORE_ALTERNATIVE",
    "ObjectStoreFileTargetError",
    "SCHEMA_EVOLUTION",
    "SCHEMA_RECORD",
    "TargetNotWritableError",
    "TargetSchemaError",
    "fsync_dir",
    "refuse_object_store",
    "schema_changes",
    "write_atomic_at",
]
