"""What walsink records in an Iceberg table's metadata, and how it reads it back (:mod:`.iceberg`).

Table properties, one lookup in the metadata a table load reads anyway: the checkpoint's
marker (``walsink.marker.<pipeline>/<key>``), the attempts an abort tombstoned
(``walsink.aborted.<pipeline>/<key>``) and the holder of each ``overwrite`` partition
(``walsink.partition.<pipeline>/<partition>``). A commit, alone or in a group, sets them with
:func:`marker_properties`; every check reads them with the functions here, through a
:class:`~..archive.WalsinkProperties` view of one table state: a pipeline's oldest markers and
holders may have been archived into the committer database (:mod:`..archive`).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from pyiceberg.table import Table

from airflow_provider_walsink.core.protocol.manifest import Manifest
from airflow_provider_walsink.core.targets._tables import CheckpointRef, Marker, offsets_of, offsets_value
from airflow_provider_walsink.core.targets.archive import PropertyArchive, WalsinkProperties, commit_time

MARKER_PREFIX = "walsink.marker."
#: Table property listing the attempt ids an abort tombstoned (``walsink.aborted.<pipeline>/<key>``).
ABORTED_PREFIX = "walsink.aborted."
#: Table property naming the checkpoint whose data an ``overwrite`` partition holds
#: (``walsink.partition.<pipeline>/<partition path>`` = ``{checkpoint, attempt_id}``): the
#: ordering rule (invariant 10) reads it in the metadata the commit is based on, and a
#: reprocess replaces the partitions its checkpoint holds, whatever files maintenance left.
PARTITION_PREFIX = "walsink.partition."


def walsink_properties(table: Table, archive: PropertyArchive | None, identifier: str) -> WalsinkProperties:
    """The walsink properties of this table state, archived ones behind them."""
    return WalsinkProperties(
        table.metadata.properties,
        str(table.metadata.table_uuid),
        archive,
        where=f"Iceberg table {identifier}",
    )


def marker_property(manifest: Manifest) -> str:
    # "/" cannot occur in a pipeline id or checkpoint key, so the key is unambiguous.
    return f"{MARKER_PREFIX}{manifest.pipeline}/{manifest.checkpoint_key}"


def partition_property(pipeline: str, partition: str) -> str:
    return f"{PARTITION_PREFIX}{pipeline}/{partition}"


def marker_properties(
    manifest: Manifest, epoch: int, snapshot: str, marker: Marker | None, files: int, replaced: Sequence[str]
) -> dict[str, str]:
    """The table properties one checkpoint's commit sets, alone or in a group: its marker (attempt
    id, fencing token, snapshot, the attempts it replaced, file count, offsets) and the holder of
    each partition it replaces."""
    previous = list(marker.previous) if marker else []
    if marker and marker.attempt_id != manifest.attempt_id:
        previous.append(marker.attempt_id)
    value: dict[str, Any] = {
        "attempt_id": manifest.attempt_id,
        "epoch": epoch,
        "snapshot": snapshot,
        "previous": previous[-20:],
        "files": files,
        "t": commit_time(),
    }
    offsets = offsets_value(manifest)
    if offsets is not None:
        value["offsets"] = offsets
    props = {marker_property(manifest): json.dumps(value, sort_keys=True)}
    holder = json.dumps(
        {"checkpoint": manifest.checkpoint_key, "attempt_id": manifest.attempt_id, "t": commit_time()}
    )
    for partition in replaced:
        props[partition_property(manifest.pipeline, partition)] = holder
    return props


def marker_of(props: WalsinkProperties, manifest: Manifest | CheckpointRef) -> Marker | None:
    """The checkpoint's marker in this table state (the attempt that holds it), or ``None``."""
    raw = props.get("marker", manifest.pipeline, manifest.checkpoint_key)
    if not raw:
        return None
    data = json.loads(raw)
    files = data.get("files")
    return Marker(
        data["attempt_id"],
        int(data["epoch"]),
        data.get("snapshot"),
        tuple(data.get("previous", ())),
        files=int(files) if files is not None else None,
        offsets=offsets_of(data.get("offsets")),
    )


def partition_holder(props: WalsinkProperties, pipeline: str, partition: str) -> dict[str, str] | None:
    """``{checkpoint, attempt_id}`` of the checkpoint whose data ``partition`` holds (``overwrite``), or ``None``."""
    raw = props.get("partition", pipeline, partition)
    return json.loads(raw) if raw else None


def partitions_held(props: WalsinkProperties, manifest: Manifest) -> list[str]:
    """The partitions whose data is the manifest's checkpoint's (any attempt of it), per the holder
    properties, archived ones included."""
    prefix = partition_property(manifest.pipeline, "")
    held = set(props.archived_partitions_of(manifest.pipeline, manifest.checkpoint_key))
    for name, raw in props.properties.items():
        if name.startswith(prefix) and json.loads(raw).get("checkpoint") == manifest.checkpoint_key:
            held.add(name[len(prefix) :])
    return sorted(held)


def aborted_of(props: WalsinkProperties, manifest: Manifest | CheckpointRef) -> frozenset[str]:
    """Attempt ids of the checkpoint that an abort tombstoned in this table state (never archived)."""
    raw = props.properties.get(f"{ABORTED_PREFIX}{manifest.pipeline}/{manifest.checkpoint_key}")
    return frozenset(json.loads(raw)) if raw else frozenset()
