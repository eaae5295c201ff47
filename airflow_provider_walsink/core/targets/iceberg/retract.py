"""What an Iceberg commit removes: the partitions an ``overwrite`` replaces, and the files of an
older attempt of the checkpoint (a retry's leftovers, or the version a reprocess supersedes).
"""

from __future__ import annotations

from pyiceberg.expressions import AlwaysTrue, And, EqualTo, IsNull, Or
from pyiceberg.manifest import DataFile
from pyiceberg.table import Table
from pyiceberg.transforms import IdentityTransform

from airflow_provider_walsink.core.protocol.errors import LayoutError
from airflow_provider_walsink.core.protocol.manifest import Manifest
from airflow_provider_walsink.core.targets._tables import Marker, as_uri, check_retractable, partition_of_path
from airflow_provider_walsink.core.targets.archive import WalsinkProperties
from airflow_provider_walsink.core.targets.iceberg.files import from_path
from airflow_provider_walsink.core.targets.iceberg.markers import partitions_held


def files_to_delete(
    table: Table,
    manifest: Manifest,
    marker: Marker | None,
    base: str,
    supersedes: str | None,
    *,
    mode: str,
    identifier: str,
    props: WalsinkProperties,
) -> tuple[list[DataFile], list[str]]:
    """Files this commit removes, and the partitions it replaces (``overwrite``).

    ``overwrite`` replaces the interval's partitions and, for a reprocess, every partition
    the checkpoint holds (its holder property): whatever files maintenance put there, they
    hold only this checkpoint's rows. An older attempt's files of this checkpoint (a retry,
    or the committed version a reprocess supersedes) are removed too; for a reprocess with
    no partition to replace (``append``), :func:`check_retractable` first makes sure all of
    the superseded version's files are still live (identity by file survives no rewrite).
    """
    found: dict[str, DataFile] = {}
    replaced: list[str] = []
    held: list[str] = []
    if mode == "overwrite":
        replaced = list(manifest.replaced_partitions())
        if any(not p for p in replaced):
            raise LayoutError(
                f"overwrite needs a partitioned table: {manifest.pipeline}/{manifest.checkpoint_key} has "
                "files outside any partition directory"
            )
    if table.current_snapshot() is None:
        return [], replaced
    if mode == "overwrite":
        if supersedes:
            held = [p for p in partitions_held(props, manifest) if p not in replaced]
            replaced += held
        schema = table.schema()
        spec = table.spec()
        names = {schema.find_column_name(pf.source_id): pf for pf in spec.fields}
        records = set()
        predicates = []
        for partition in replaced:
            pairs = partition_of_path(partition + "/x")
            if [c for c, _ in pairs] != list(names) or not all(
                isinstance(names[c].transform, IdentityTransform) for c, _ in pairs
            ):
                raise LayoutError(
                    f"partition {partition!r} does not name the identity partition columns "
                    f"{list(names)} of Iceberg table {identifier}; table unchanged"
                )
            typed = [from_path(v, schema.find_field(c).field_type, partition) for c, v in pairs]
            records.add(tuple(typed))
            # The NULL partition is replaced by IS NULL: "= NULL" matches nothing.
            terms = [
                IsNull(c) if v is None else EqualTo(c, v) for (c, _), v in zip(pairs, typed, strict=True)
            ]
            predicates.append(terms[0] if len(terms) == 1 else And(*terms))
        if predicates:
            row_filter = predicates[0] if len(predicates) == 1 else Or(*predicates)
            for task in table.scan(row_filter=row_filter).plan_files():
                df = task.file
                if tuple(df.partition) in records:
                    found[df.file_path] = df
    if supersedes or (marker is not None and marker.attempt_id != manifest.attempt_id):
        # Retract what an older attempt of this checkpoint published (rare: a full scan). Its
        # files are the live ones staged under this checkpoint's directory by another attempt
        # (files are added by path, never copied), plus, for a reprocess, those the snapshot
        # that committed the superseded version added, wherever they were staged.
        prefix = as_uri(base.rsplit("/", 1)[0]) + "/"  # <root>/<pipeline>/<key>/
        ours = as_uri(base) + "/"
        added = added_by(table, marker, manifest) if supersedes and marker else set()
        older: dict[str, DataFile] = {}
        for task in table.scan(row_filter=AlwaysTrue()).plan_files():
            df = task.file
            path = df.file_path
            if (path.startswith(prefix) and not path.startswith(ours)) or path in added:
                older[path] = df
        if supersedes and marker is not None and marker.attempt_id == supersedes:
            recorded = marker.files
            live = len(older)
            if recorded is None and added:
                # A marker from before the file count: the committing snapshot still lists its files.
                recorded, live = len(added), len(added & older.keys())
            if mode == "append" or recorded is None:
                check_retractable(manifest, supersedes, recorded, live, f"Iceberg table {identifier}")
        found.update(older)
    return list(found.values()), replaced


def added_by(table: Table, marker: Marker, manifest: Manifest) -> set[str]:
    """Data files the snapshot that committed ``marker``'s attempt added (empty once it is expired)."""
    if marker.snapshot is None or not marker.snapshot.isdigit():
        return set()
    snapshot = table.snapshot_by_id(int(marker.snapshot))
    if snapshot is None or (snapshot.summary or {}).get("walsink.attempt-id") != marker.attempt_id:
        return set()
    added = set()
    for listed in snapshot.manifests(table.io):
        if listed.added_snapshot_id != snapshot.snapshot_id:
            continue
        for entry in listed.fetch_manifest_entry(table.io, discard_deleted=True):
            if entry.snapshot_id == snapshot.snapshot_id and entry.status.name == "ADDED":
                added.add(entry.data_file.file_path)
    return added
