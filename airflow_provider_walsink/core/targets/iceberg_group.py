"""Group commit into an Iceberg table: several checkpoints' files in one snapshot, each with its own marker.

The one snapshot adds every member's staged files (and, in ``overwrite``, deletes the files of
each member's partitions) and sets, per member, exactly the properties a single commit sets
(``walsink.marker.<pipeline>/<key>`` with the member's own attempt id, fencing token, file count,
and ``walsink.partition.<pipeline>/<partition>`` for each partition it replaces). Every later
check reads the markers, so a member committed in a group is indistinguishable from one
committed alone. The snapshot summary names each member
(``walsink.group.<pipeline>/<key>`` = ``{attempt_id, epoch, sequence}``) but carries no single
``walsink.attempt-id``: that key tells a reprocess which files one attempt's snapshot added, and a
group snapshot added several attempts' files.
"""

from __future__ import annotations

import json
import logging
import time
from typing import TYPE_CHECKING, Any

from pyiceberg.exceptions import CommitFailedException, ValidationException
from pyiceberg.table import TableProperties

from airflow_provider_walsink.core.protocol.errors import WalsinkError
from airflow_provider_walsink.core.targets._tables import (
    TableCommitConflict,
    decide,
    offsets_value,
    staged_locations,
    staging_storage,
)
from airflow_provider_walsink.core.targets.base import (
    GroupMember,
    PublishOutcome,
    PublishResult,
    check_group,
    conflict_backoff,
)

if TYPE_CHECKING:
    from airflow_provider_walsink.core.targets.iceberg import IcebergPublisher

log = logging.getLogger(__name__)

#: Check + commit attempts of one group before giving up on a table that keeps changing.
GROUP_COMMIT_ATTEMPTS = 40


def publish_group(pub: IcebergPublisher, members: list[GroupMember]) -> list[PublishResult | Exception]:
    """:class:`~.base.GroupPublisher` for :class:`~.iceberg.IcebergPublisher` (its contract)."""
    from airflow_provider_walsink.core.targets.iceberg import (
        _one_manifest_evaluator_per_manifest,
        marker_property,
        partition_property,
        without_library_retries,
    )

    check_group(members, pub.mode)
    results: list[PublishResult | Exception | None] = [None] * len(members)
    where: dict[int, tuple[str, list[str]]] = {}
    footers: dict[int, list[Any]] = {}
    for i, m in enumerate(members):
        try:
            where[i] = staged_locations(m.attempt, m.manifest, uri=True)
        except WalsinkError as exc:
            results[i] = exc
    last_conflict: Exception | None = None
    for attempt in range(GROUP_COMMIT_ATTEMPTS):
        table = pub.load_table()
        live: list[tuple[int, Any]] = []
        for i, m in enumerate(members):
            if results[i] is not None:
                continue
            try:
                marker = pub.marker_of(table, m.manifest) if table is not None else None
                aborted = pub.aborted_of(table, m.manifest) if table is not None else frozenset()
                if decide(marker, m.manifest, m.ctx, pub.mode, aborted):
                    results[i] = pub._already(m.manifest, marker, where[i][1])
                    continue
                pub._check_order(table, m.manifest)
                if i not in footers:
                    locations = where[i][1]
                    footers[i] = staging_storage(pub.storage, m.attempt).footers(
                        [(loc, c.size) for loc, c in zip(locations, m.manifest.committables, strict=True)]
                    )
                live.append((i, marker))
            except WalsinkError as exc:
                results[i] = exc
        if not live:
            break
        if table is None:
            first = live[0][0]
            pub._create(members[first].manifest, footers[first])
            continue  # check every member again on the created table
        prepared = []
        for i, marker in live:
            m = members[i]
            try:
                base, locations = where[i]
                data_files = pub._data_files(table, m.manifest, locations, footers[i])
                deletes, replaced = pub._files_to_delete(table, m.manifest, marker, base, None)
                m.ctx.fence()  # the member's lease is still the leader's: else it is left out
            except WalsinkError as exc:
                results[i] = exc
                continue
            prepared.append((i, marker, data_files, deletes, replaced))
        if not prepared:
            break
        tx = without_library_retries(table).transaction()
        summary = {"walsink.group": str(len(prepared))}
        for i, *_ in prepared:
            m = members[i]
            summary[f"walsink.group.{m.manifest.pipeline}/{m.manifest.checkpoint_key}"] = json.dumps(
                {"attempt_id": m.manifest.attempt_id, "epoch": m.ctx.epoch, "sequence": m.manifest.sequence},
                sort_keys=True,
            )
        update = tx.update_snapshot(snapshot_properties=summary)
        any_deletes = any(p[3] for p in prepared)
        producer = update.overwrite() if any_deletes else update.fast_append()
        if any_deletes:
            _one_manifest_evaluator_per_manifest(producer)
        with producer:
            for _i, _marker, data_files, deletes, _replaced in prepared:
                for df in deletes:
                    producer.delete_data_file(df)
                for df in data_files:
                    producer.append_data_file(df)
        snapshot = str(producer.snapshot_id)
        props: dict[str, str] = {}
        for i, marker, data_files, _deletes, replaced in prepared:
            manifest, ctx = members[i].manifest, members[i].ctx
            previous = list(marker.previous) if marker else []
            if marker and marker.attempt_id != manifest.attempt_id:
                previous.append(marker.attempt_id)
            value: dict[str, Any] = {
                "attempt_id": manifest.attempt_id,
                "epoch": ctx.epoch,
                "snapshot": snapshot,
                "previous": previous[-20:],
                "files": len(data_files),
            }
            offsets = offsets_value(manifest)
            if offsets is not None:
                value["offsets"] = offsets
            props[marker_property(manifest)] = json.dumps(value, sort_keys=True)
            holder = json.dumps({"checkpoint": manifest.checkpoint_key, "attempt_id": manifest.attempt_id})
            for partition in replaced:
                props[partition_property(manifest.pipeline, partition)] = holder
        if table.metadata.name_mapping() is None:
            props[TableProperties.DEFAULT_NAME_MAPPING] = table.schema().name_mapping.model_dump_json()
        tx.set_properties(props)
        leader = members[0].ctx
        try:
            leader.event("table.before_group_commit")
            tx.commit_transaction()
        except (CommitFailedException, ValidationException) as exc:
            # Nothing committed: reload, check every member again (after a pause: the others go on).
            last_conflict = exc
            log.info(
                "Iceberg group commit of %d checkpoints conflicted (%s); checking again", len(prepared), exc
            )
            time.sleep(conflict_backoff(attempt))
            continue
        leader.event("table.after_group_commit")
        for i, _marker, data_files, deletes, replaced in prepared:
            result = PublishResult(
                outcome=PublishOutcome.PUBLISHED,
                published=len(data_files),
                target_files=where[i][1],
                snapshot=snapshot,
                rows=members[i].manifest.total_rows,
            )
            result.files_rolled_back = len(deletes)
            result.partitions_replaced = list(replaced)
            results[i] = result
        break
    else:
        raise TableCommitConflict(
            f"Iceberg table {pub.identifier} changed under each of {GROUP_COMMIT_ATTEMPTS} group commit attempts "
            f"(last: {last_conflict}); nothing was published, retry the commit"
        )
    return [r if r is not None else WalsinkError("not published") for r in results]
