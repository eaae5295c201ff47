"""The file target's schema check (Parquet): the staged schema against the one the target holds
(its ``_walsink/schema.json`` record, else a footer), under the pipeline's ``schema_evolution``.
"""

from __future__ import annotations

import base64
import json
import logging
import os
from pathlib import Path
from typing import Any

from airflow_provider_walsink.core.protocol.manifest import FileSchema, Manifest
from airflow_provider_walsink.core.targets._tables import normalise_type
from airflow_provider_walsink.core.targets.files.fsops import _DirFds, write_atomic_at
from airflow_provider_walsink.core.targets.files.spec import (
    BOOKKEEPING_DIR,
    SCHEMA_RECORD,
    TargetSchemaError,
)

log = logging.getLogger(__package__)  # the package's logger, as before the split

#: Files tried for a footer when a target has no schema record (written before it existed).
_FOOTER_CANDIDATES = 8


def schema_changes(
    held: Any, staged: Any
) -> tuple[list[tuple[str, str, str]], list[str], list[str], list[str]]:
    """How ``staged`` differs from ``held`` (Arrow schemas), by column name: order never matters.

    Returns ``(changed, added, missing, added_not_null)``: columns whose type
    differs as ``(name, held type, staged type)``, columns only ``staged`` has,
    columns only ``held`` has, and the added ones that are not nullable.
    Why: readers bind Parquet columns by name (pyarrow datasets, DuckDB), so
    another order is safe; a changed type breaks them (pyarrow refuses the
    dataset, DuckDB casts silently: ``"12.50"`` read as 13); an added or missing
    column is read right only by readers that union the files' schemas by
    name (DuckDB ``union_by_name``, ``pyarrow.unify_schemas``).
    """
    held_types = {f.name: f.type for f in held}
    staged_names = set(staged.names)
    changed = [
        (f.name, normalise_type(held_types[f.name]), normalise_type(f.type))
        for f in staged
        if f.name in held_types and normalise_type(held_types[f.name]) != normalise_type(f.type)
    ]
    added = [f.name for f in staged if f.name not in held_types]
    missing = [name for name in held.names if name not in staged_names]
    not_null = [f.name for f in staged if f.name not in held_types and not f.nullable]
    return changed, added, missing, not_null


class SchemaChecks:
    """The schema half of :class:`~airflow_provider_walsink.core.targets.files.FilePublisher` (a mixin:
    it uses the publisher's ``target_root``, ``schema_evolution`` and bookkeeping paths)."""

    def _check_schema(self, manifest: Manifest, plan: list) -> tuple[Any, bool] | None:
        """Check the staged schema against the target's; return what to record (``None``: unchanged).

        What to record: the schema, and whether the target had no record yet
        (then it is created only if still absent, :meth:`_record_schema`).

        Parquet only (other formats carry no schema to read cheaply). What the
        target holds is its schema record, or, for a target written before the
        record existed, the footer of one of its Parquet files; a target with
        neither takes the staged schema. Raises :class:`TargetSchemaError`
        naming every column that does not fit (see :func:`schema_changes`).
        """
        if manifest.file_format != "parquet" or not plan:
            return None
        import pyarrow as pa

        staged = self._staged_schema(manifest, plan)
        if staged is None:
            return None
        recorded = os.path.lexists(self.target_root / BOOKKEEPING_DIR / SCHEMA_RECORD)
        held = self._held_schema()
        if held is None:
            return staged, not recorded
        changed, added, missing, not_null = schema_changes(held, staged)
        problems = []
        if missing and self.schema_evolution == "none":
            problems.append(f"missing columns {missing}")
        if added and self.schema_evolution == "none":
            problems.append(f"columns not in the target {added}")
        if not_null and self.schema_evolution == "union":
            problems.append(f"new columns {not_null} are not nullable (the target's other rows hold none)")
        if self.schema_evolution != "any":
            problems += [f"column {name!r} is {new}, the target has {old}" for name, old, new in changed]
        if problems:
            hint = (
                "to change the schema on purpose, set the target option schema_evolution="
                + ("'any'" if changed else "'union'")
                + ", docs/targets.md"
            )
            raise TargetSchemaError(
                f"checkpoint {manifest.pipeline}/{manifest.checkpoint_key} does not match file target "
                f"{self.target_root}: {'; '.join(problems)}; target left unchanged ({hint})"
            )
        if not (changed or added):
            return None if recorded else (held, True)
        by_name = {f.name: f for f in staged}
        fields = [by_name.get(f.name, f) for f in held] + [by_name[n] for n in added]
        return pa.schema(fields), not recorded

    def _staged_schema(self, manifest: Manifest, plan: list) -> Any | None:
        """The data columns of the staged files: the manifest's ``file_schema``, else sampled footers.

        ``None``: the sampled files are not readable as Parquet (nothing to check against).
        Files that disagree on a column's type are refused (a reader could not read them together).
        """
        import pyarrow as pa
        import pyarrow.parquet as pq

        from airflow_provider_walsink.core.protocol.file_schema import arrow_schema

        partition_columns = set(manifest.partition_columns) | set(self.partition_by)
        if manifest.file_schema is not None:
            schemas = [arrow_schema(manifest.file_schema)]
        else:
            # No schema sealed (a writer other than the Spark job): a constant sample of footers, the
            # first and the last file, as the table targets confirm a recorded one. A file already
            # moved into the target (a re-publish) is read where it is now.
            sample = [plan[i] for i in sorted({0, len(plan) - 1})]
            try:
                schemas = [pq.read_schema(dest if there else staged) for _c, staged, dest, there in sample]
            except (OSError, pa.ArrowException) as exc:
                log.warning(
                    "checkpoint %s/%s: staged files are not readable as Parquet (%s); schema not checked",
                    manifest.pipeline,
                    manifest.checkpoint_key,
                    exc,
                )
                return None
        merged: dict[str, Any] = {}
        for schema in schemas:
            for f in schema:
                if f.name in partition_columns:
                    continue
                seen = merged.setdefault(f.name, f)
                if normalise_type(seen.type) != normalise_type(f.type):
                    raise TargetSchemaError(
                        f"checkpoint {manifest.pipeline}/{manifest.checkpoint_key}: staged files disagree "
                        f"on column {f.name!r} ({normalise_type(seen.type)} / {normalise_type(f.type)}); "
                        "target left unchanged"
                    )
        return pa.schema(list(merged.values()))

    def _held_schema(self) -> Any | None:
        """What the target holds: its schema record, else one existing file's footer, else ``None``."""
        from airflow_provider_walsink.core.protocol.file_schema import arrow_schema

        try:
            with _DirFds(self.target_root) as dirs:
                fd = os.open(SCHEMA_RECORD, os.O_RDONLY | os.O_NOFOLLOW, dir_fd=dirs.open(BOOKKEEPING_DIR))
                with os.fdopen(fd, encoding="utf-8") as f:
                    record = json.loads(f.read())
        except (FileNotFoundError, NotADirectoryError):
            return self._footer_schema()
        except (OSError, json.JSONDecodeError) as exc:
            raise TargetSchemaError(
                f"schema record {self.target_root}/{BOOKKEEPING_DIR}/{SCHEMA_RECORD} cannot be read ({exc}); "
                "target left unchanged (remove it to take the schema from a data file again)"
            ) from None
        if not isinstance(record, dict) or not isinstance(record.get("arrow"), str):
            raise TargetSchemaError(
                f"schema record {self.target_root}/{BOOKKEEPING_DIR}/{SCHEMA_RECORD} is not a walsink schema "
                "record; target left unchanged"
            )
        return arrow_schema(FileSchema(record["arrow"], ()))

    def _footer_schema(self) -> Any | None:
        """The data columns of the first readable Parquet file found in the target (``None``: no file).

        A walk that stops at the first file: one directory per level, not a
        listing of the target. Hidden and ``_`` names (bookkeeping) are
        skipped, as readers skip them; no link is followed.
        """
        import pyarrow as pa
        import pyarrow.parquet as pq

        tried = 0
        pending = [self.target_root]
        while pending and tried < _FOOTER_CANDIDATES:
            directory = pending.pop()
            try:
                entries = os.scandir(directory)
            except (FileNotFoundError, NotADirectoryError):
                continue
            subdirs = []
            with entries:
                for e in entries:
                    if e.name.startswith(("_", ".")):
                        continue
                    if e.is_dir(follow_symlinks=False):
                        subdirs.append(e.path)
                    elif e.is_file(follow_symlinks=False) and e.name.endswith(".parquet"):
                        tried += 1
                        try:
                            schema = pq.read_schema(e.path)
                        except (OSError, pa.ArrowException):
                            continue  # not readable as Parquet: readers fail on it anyway; try another
                        # Columns the partition directories give are not data columns.
                        in_path = {
                            p.partition("=")[0] for p in Path(e.path).relative_to(self.target_root).parts
                        }
                        return pa.schema([f for f in schema if f.name not in in_path])
            pending.extend(sorted(subdirs, reverse=True))
        return None

    def _record_schema(self, schema: Any, first: bool) -> bool:
        """Write the target's schema record (atomically: readers of it see the old or the new one).

        ``first``: create it only if there is none (``False`` returned: another publish did first).
        """
        import pyarrow as pa

        # The encoding of the manifest's file_schema (protocol.file_schema): base64 of an Arrow IPC message.
        stripped = pa.schema([f.remove_metadata() for f in schema])
        record = {
            "arrow": base64.b64encode(stripped.serialize().to_pybytes()).decode("ascii"),
            "columns": {f.name: normalise_type(f.type) for f in stripped},
        }
        text = json.dumps(record, sort_keys=True)
        with _DirFds(self.target_root) as dirs:
            fd = dirs.open(BOOKKEEPING_DIR, create=True)
            if not first:
                write_atomic_at(fd, SCHEMA_RECORD, text)
                return True
            tmp = f".{SCHEMA_RECORD}.{os.getpid()}.{os.urandom(4).hex()}.tmp"
            write_atomic_at(fd, tmp, text)
            try:
                os.link(tmp, SCHEMA_RECORD, src_dir_fd=fd, dst_dir_fd=fd, follow_symlinks=False)
            except FileExistsError:
                return False
            finally:
                os.unlink(tmp, dir_fd=fd)
            os.fsync(fd)
            return True
