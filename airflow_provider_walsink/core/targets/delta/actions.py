"""What a Delta commit writes: add actions for the staged files (checked against the table's schema
and partitioning), remove actions for what it replaces, and the ordering rule (invariant 10), for
:class:`.DeltaPublisher` (a mixin: it uses the publisher's table settings).
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any
from urllib.parse import unquote

from deltalake import DeltaTable
from deltalake import Schema as DeltaSchema
from deltalake.transaction import AddAction, RemoveAction

from airflow_provider_walsink.core.protocol.errors import LayoutError, OrderError, WalsinkError
from airflow_provider_walsink.core.protocol.manifest import Manifest
from airflow_provider_walsink.core.protocol.partitions import (
    parse_partition_dir,
    partition_dir,
    partition_string,
    partition_values,
)
from airflow_provider_walsink.core.targets._tables import (
    Marker,
    StagedFile,
    check_retractable,
    partition_of_path,
    schema_problems,
)
from airflow_provider_walsink.core.targets.base import (
    check_partition_order,
)
from airflow_provider_walsink.core.targets.delta.log import (
    commit_holders,
    commit_info,
    delta_stats,
    delta_stats_columns,
    files_app_id,
    partition_app_id,
)


class DeltaTargetError(WalsinkError):
    """The Delta target cannot be used as configured; the message says why (table unchanged)."""


class DeltaActions:
    """The add/remove actions and the order check of :class:`.DeltaPublisher`."""

    table_uri: str
    mode: str
    storage: Any
    create_table: bool
    allow_older_overwrite: bool
    partition_by: Sequence[str]

    # ------------------------------------------------------------------ actions

    def _relative(self, location: str) -> str:
        """The path of a staged file relative to the table, as it is (not URI-encoded).

        deltalake URI-encodes an action's path in the log itself (and ``get_add_actions`` answers
        the encoded form): an add or remove action takes the path as it is, so a partition
        directory Spark escaped (``k=a%3Ab``, ``k=a b``) is named once, never encoded twice."""
        root = self.table_uri + "/"
        if location.startswith(root):
            return location[len(root) :]
        raise LayoutError(
            f"staged file {location} is outside the Delta table {self.table_uri}: stage into "
            f"{self.staging_root()} (files are added by path, never copied)"
        )

    def _check(
        self,
        columns: Mapping[str, Any],
        partition_by: Sequence[str],
        manifest: Manifest,
        staged: list[StagedFile],
    ) -> None:
        """Raise naming the first staged file whose columns (file + path) or partitioning do not fit.

        Files sharing one schema and one set of partition columns (all of them, when the
        manifest records the schema) are checked once.
        """
        checked: set[tuple[int, tuple[str, ...], tuple[str, ...]]] = set()
        for c, f in zip(manifest.committables, staged, strict=True):
            pairs = dict(c.partition)
            key = (id(f.schema), f.int96, tuple(pairs))
            if key in checked:
                continue
            checked.add(key)
            problems = schema_problems(columns, f.schema, pairs, int96=f.int96)
            if tuple(pairs) != tuple(partition_by):
                problems.append(
                    f"partition directories {list(pairs)}, the table is partitioned by {list(partition_by)}"
                )
            if problems:
                raise DeltaTargetError(
                    f"staged file {c.path} does not match Delta table {self.table_uri}: {'; '.join(problems)}; "
                    "table unchanged"
                )
        self._check_partition_values(columns, partition_by, manifest)

    def _check_partition_values(
        self, columns: Mapping[str, Any], partition_by: Sequence[str], manifest: Manifest
    ) -> None:
        """Raise naming the first partition value its (typed) partition column cannot hold.

        deltalake commits a partition value as text and parses it only when the table is read:
        a value its column's type cannot take (a timestamp in a ``date`` column) would be
        committed and then make every read of the table fail. Each distinct value is parsed
        once, as Arrow casts text to the column's type."""
        import pyarrow as pa

        typed = {c: columns[c] for c in partition_by if c in columns and not pa.types.is_string(columns[c])}
        if not typed:
            return
        seen: set[tuple[str, str | None]] = set()
        for c in manifest.committables:
            for column, value in partition_values(c.partition).items():
                if column not in typed or value is None or (column, value) in seen:
                    continue
                seen.add((column, value))
                want = typed[column]
                if pa.types.is_timestamp(want) and want.tz:  # the log's text is UTC, without an offset
                    want = pa.timestamp(want.unit)
                try:
                    pa.array([value], pa.string()).cast(want)
                except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
                    raise DeltaTargetError(
                        f"staged file {c.path}: partition value {value!r} is not a valid {typed[column]} "
                        f"(column {column!r} of Delta table {self.table_uri}); table unchanged"
                    ) from None

    def _add_actions(
        self, manifest: Manifest, base: str, staged: list[StagedFile], stats_columns: Mapping[str, str]
    ) -> list[AddAction]:
        """One add action per staged file: its path relative to the table, size, partition values
        and ``stats``: ``numRecords`` plus, where the file's column statistics are known, each
        of ``stats_columns``' ``nullCount``, ``minValues`` and ``maxValues`` (:func:`delta_stats`)."""
        now = int(time.time() * 1000)
        prefix = self._relative(base) + "/"
        adds = []
        for c, f in zip(manifest.committables, staged, strict=True):
            values = partition_values(c.partition)  # the values, not the escaped directory text
            if f.stats is None or not stats_columns:
                stats = '{"numRecords": %d}' % f.rows  # noqa: UP031 (json.dumps per file costs more)
            else:
                stats = delta_stats(f.rows, f.stats, stats_columns)
            adds.append(AddAction(prefix + c.path, c.size, values, now, True, stats))
        return adds

    def _adds(
        self, dt: DeltaTable, manifest: Manifest, base: str, staged: list[StagedFile]
    ) -> list[AddAction]:
        import pyarrow as pa

        columns = {f.name: f.type for f in pa.schema(dt.schema().to_arrow())}
        metadata = dt.metadata()
        self._check(columns, metadata.partition_columns, manifest, staged)
        stats_columns = delta_stats_columns(columns, metadata.partition_columns, metadata.configuration)
        return self._add_actions(manifest, base, staged, stats_columns)

    def _adds_for_new_table(
        self, manifest: Manifest, base: str, staged: list[StagedFile]
    ) -> tuple[list[AddAction], DeltaSchema, Sequence[str]]:
        if not self.create_table:
            raise DeltaTargetError(
                f"Delta table {self.table_uri} does not exist; create it, or set "
                'extra={"create_table": True} to create it from the staged files on the first commit'
            )
        if not staged:
            raise DeltaTargetError(
                f"Delta table {self.table_uri} does not exist and {manifest.pipeline}/{manifest.checkpoint_key} "
                "staged no file to take its schema from"
            )
        import pyarrow as pa

        partition_by = tuple(self.partition_by or manifest.partition_columns)
        file_schema = staged[0].schema
        fields = list(file_schema) + [
            pa.field(c, pa.string()) for c in partition_by if c not in file_schema.names
        ]
        schema = pa.schema(fields)
        columns = {f.name: f.type for f in schema}
        self._check(columns, partition_by, manifest, staged)
        adds = self._add_actions(manifest, base, staged, delta_stats_columns(columns, partition_by, {}))
        return adds, DeltaSchema.from_arrow(schema), partition_by

    def _removes(
        self, dt: DeltaTable, manifest: Manifest, marker: Marker | None, base: str, supersedes: str | None
    ) -> tuple[list[RemoveAction], list[str]]:
        """The files this commit removes, and the partitions it replaces (``overwrite``).

        ``overwrite`` replaces the interval's partitions and, for a reprocess, every partition
        the checkpoint holds (:meth:`_holder_is`): whatever files maintenance put there, they
        hold only this checkpoint's rows. An older attempt's files of this checkpoint (a retry,
        or the committed version a reprocess supersedes) are the live ones staged under this
        checkpoint's directory by another attempt (Delta adds files by path, never copied or
        moved); for a reprocess with no partition to replace (``append``),
        :func:`check_retractable` first makes sure all of them are still live.
        """
        import pyarrow as pa

        retract = bool(supersedes) or (marker is not None and marker.attempt_id != manifest.attempt_id)
        if self.mode != "overwrite" and not retract:
            return [], []
        # Through the Arrow C stream, not pa.table(): that asks pandas first whether it was given
        # a DataFrame, importing pandas (about 0.2 s) into every commit process.
        files = pa.RecordBatchReader.from_stream(dt.get_add_actions(flatten=True)).read_all()
        partition_by = dt.metadata().partition_columns
        columns = (
            {name: files.column(f"partition.{name}").to_pylist() for name in partition_by}
            if files.num_rows
            else {}
        )
        paths = files.column("path").to_pylist() if files.num_rows else []
        # As the strings Spark names them by (a timestamp column's 2026-01-02 12:30:45.5, not its
        # str() with +00:00), so a typed partition compares with the directories' values.
        values_of = [tuple(partition_string(columns[c][i]) for c in partition_by) for i in range(len(paths))]
        replaced_paths: list[str] = []
        if self.mode == "overwrite":
            replaced_paths = list(manifest.replaced_partitions())
            for partition in replaced_paths:
                pairs = partition_of_path(partition + "/x")
                if [c for c, _ in pairs] != list(partition_by):
                    raise LayoutError(
                        f"partition {partition!r} does not name the partition columns {list(partition_by)} of "
                        f"Delta table {self.table_uri}; table unchanged"
                    )
            if supersedes:
                for values in sorted(set(values_of), key=str):
                    partition = partition_dir(partition_by, values)
                    if partition not in replaced_paths and self._holder_is(dt, manifest, partition):
                        replaced_paths.append(partition)
        replaced = {tuple(v for _, v in parse_partition_dir(p)) for p in replaced_paths}
        checkpoint_prefix = self._relative(base.rsplit("/", 1)[0]) + "/"
        ours = self._relative(base) + "/"
        sizes = files.column("size_bytes").to_pylist() if paths else []
        now = int(time.time() * 1000)
        removes = []
        older = 0
        for i, path in enumerate(paths):
            values = values_of[i]
            path = unquote(path)  # the log's (URI-encoded) path as it is, as a remove action takes it
            old = retract and path.startswith(checkpoint_prefix) and not path.startswith(ours)
            older += old
            if values in replaced or old:
                removes.append(
                    RemoveAction(path, True, now, sizes[i], dict(zip(partition_by, values, strict=True)))
                )
        if supersedes and marker is not None and marker.attempt_id == supersedes:
            recorded = dt.transaction_version(files_app_id(manifest, supersedes))
            # overwrite: the partitions the checkpoint holds are replaced whole (above), so only a
            # version committed before walsink recorded holders and file counts needs the check.
            if self.mode == "append" or recorded is None:
                check_retractable(manifest, supersedes, recorded, older, f"Delta table {self.table_uri}")
        return removes, replaced_paths

    # ------------------------------------------------------------------ order

    @staticmethod
    def _holder_is(dt: DeltaTable, manifest: Manifest, partition: str) -> bool:
        """Whether the commit that last replaced ``partition`` was one of the manifest's checkpoint."""
        version = dt.transaction_version(partition_app_id(manifest.pipeline, partition))
        return version is not None and version == dt.transaction_version(
            partition_app_id(manifest.pipeline, partition, manifest.checkpoint_key)
        )

    def _check_order(self, dt: DeltaTable, manifest: Manifest) -> None:
        """Invariant 10 on the table version the commit is based on (``OrderError``).

        Each ``overwrite`` commit carries, per partition it replaces, an application transaction
        at its own table version: two racing commits of one partition carry the same app id and
        the log's conflict check refuses the second, which reloads and checks again. The holder's
        key is read from that version's commit record; if log cleanup removed it, the holder cannot
        be told and the commit is refused (unless rolling back is allowed).
        """
        if self.mode != "overwrite":
            return
        target = f"Delta table {self.table_uri}"
        for partition in manifest.replaced_partitions():
            version = dt.transaction_version(partition_app_id(manifest.pipeline, partition))
            if version is None or self._holder_is(dt, manifest, partition) or self.allow_older_overwrite:
                continue
            info = commit_info(self.storage, self.table_uri, version)
            if info is None:
                raise OrderError(
                    f"checkpoint {manifest.pipeline}/{manifest.checkpoint_key} would replace partition "
                    f"{partition!r} of {target}, last replaced by another checkpoint in table version {version}, "
                    "whose commit record log cleanup removed: walsink cannot tell whether it is newer, so the "
                    "commit is refused (pass allow_older_overwrite=True to the commit task to replace it on "
                    "purpose); target left unchanged"
                )
            holders = commit_holders(info)
            # A group commit names the member that replaced this partition; a single commit, itself.
            holder = next(
                (h for h in holders if h.get("partitions") is None or partition in h["partitions"]), {}
            )
            check_partition_order(
                manifest,
                partition,
                holder.get("pipeline"),
                holder.get("checkpoint"),
                allow_older=False,
                target=target,
            )
