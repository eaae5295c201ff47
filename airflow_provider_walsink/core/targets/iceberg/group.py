"""Several checkpoints in one Iceberg snapshot: the group commit of :class:`.IcebergPublisher`.

A mixin of the publisher (it uses the publisher's table access: ``_load_deciding``, ``_create``,
``_check_order``, ``_landed``, ``_already``), kept apart because it is a concern of its own.
"""

from __future__ import annotations

import json
import logging
import time
from typing import Any

from pyiceberg.exceptions import CommitFailedException, ValidationException

from airflow_provider_walsink.core.protocol.errors import WalsinkError
from airflow_provider_walsink.core.targets._tables import (
    TableCommitConflict,
    decide,
    staged_locations,
    staging_storage,
)
from airflow_provider_walsink.core.targets.base import (
    GroupMember,
    PublishResult,
    check_group,
    conflict_backoff,
)
from airflow_provider_walsink.core.targets.iceberg.commit import (
    GROUP_COMMIT_ATTEMPTS,
    one_manifest_evaluator_per_manifest,
    set_walsink_properties,
    without_library_retries,
)
from airflow_provider_walsink.core.targets.iceberg.files import data_files as data_files_of
from airflow_provider_walsink.core.targets.iceberg.markers import aborted_of, marker_of, marker_properties
from airflow_provider_walsink.core.targets.iceberg.outcome import UnknownCommitOutcome, unknown_outcome_errors
from airflow_provider_walsink.core.targets.iceberg.retract import files_to_delete

log = logging.getLogger("airflow_provider_walsink.core.targets.iceberg")


class IcebergGroupCommit:
    """:meth:`publish_group` for :class:`.IcebergPublisher` (:class:`~.base.GroupPublisher`)."""

    identifier: str
    mode: str
    storage: Any
    archive_keep: tuple[int, int] | None

    def publish_group(self, members: list[GroupMember]) -> list[PublishResult | Exception]:
        """Several checkpoints in one snapshot, each with its own marker (:class:`~.base.GroupPublisher`).

        The one snapshot adds every member's staged files (and, in ``overwrite``, deletes the files
        of each member's partitions) and sets, per member, exactly the properties a single commit
        sets (:func:`marker_properties`), so a member committed in a group is indistinguishable
        from one committed alone. The snapshot summary names each member
        (``walsink.group.<pipeline>/<key>`` = ``{attempt_id, epoch, sequence}``) but carries no
        single ``walsink.attempt-id``: that key tells a reprocess which files one attempt's
        snapshot added, and a group snapshot added several attempts' files.
        """
        check_group(members, self.mode)
        results: list[PublishResult | Exception | None] = [None] * len(members)
        where: dict[int, tuple[str, list[str]]] = {}
        footers: dict[int, list[Any]] = {}
        for i, m in enumerate(members):
            try:
                where[i] = staged_locations(m.attempt, m.manifest, uri=True)
            except WalsinkError as exc:
                results[i] = exc
        last_conflict: Exception | None = None
        # Per member, the results of group commits whose outcome the catalog did not report, by
        # the snapshot id each built (:mod:`.outcome`): each member's marker decides for it.
        pending: dict[int, dict[str, PublishResult]] = {}
        for attempt in range(GROUP_COMMIT_ATTEMPTS):
            table = self._load_deciding(None, {s: r for p in pending.values() for s, r in p.items()})
            view = self._props(table) if table is not None else None
            live: list[tuple[int, Any]] = []
            for i, m in enumerate(members):
                if results[i] is not None:
                    continue
                try:
                    marker = marker_of(view, m.manifest) if view is not None else None
                    aborted = aborted_of(view, m.manifest) if view is not None else frozenset()
                    if decide(marker, m.manifest, m.ctx, self.mode, aborted):
                        results[i] = self._landed(m.manifest, marker, pending.get(i, {})) or self._already(
                            m.manifest, marker, where[i][1]
                        )
                        continue
                    self._check_order(view, m.manifest)
                    if i not in footers:
                        locations = where[i][1]
                        footers[i] = staging_storage(self.storage, m.attempt).footers(
                            [(loc, c.size) for loc, c in zip(locations, m.manifest.committables, strict=True)]
                        )
                    live.append((i, marker))
                except WalsinkError as exc:
                    results[i] = exc
            if not live:
                break
            if table is None:
                first = live[0][0]
                self._create(members[first].manifest, footers[first])
                continue  # check every member again on the created table
            prepared = []
            for i, marker in live:
                m = members[i]
                try:
                    base, locations = where[i]
                    data_files = data_files_of(
                        table, m.manifest, locations, footers[i], identifier=self.identifier
                    )
                    deletes, replaced = files_to_delete(
                        table,
                        m.manifest,
                        marker,
                        base,
                        None,
                        mode=self.mode,
                        identifier=self.identifier,
                        props=view,
                    )
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
                    {
                        "attempt_id": m.manifest.attempt_id,
                        "epoch": m.ctx.epoch,
                        "sequence": m.manifest.sequence,
                    },
                    sort_keys=True,
                )
            update = tx.update_snapshot(snapshot_properties=summary)
            any_deletes = any(p[3] for p in prepared)
            producer = update.overwrite() if any_deletes else update.fast_append()
            if any_deletes:
                one_manifest_evaluator_per_manifest(producer)
            with producer:
                for _i, _marker, data_files, deletes, _replaced in prepared:
                    for df in deletes:
                        producer.delete_data_file(df)
                    for df in data_files:
                        producer.append_data_file(df)
            snapshot = str(producer.snapshot_id)
            props: dict[str, str] = {}
            for i, marker, data_files, _deletes, replaced in prepared:
                m = members[i]
                props.update(
                    marker_properties(m.manifest, m.ctx.epoch, snapshot, marker, len(data_files), replaced)
                )
            pipelines = [members[i].manifest.pipeline for i, *_ in prepared]
            leader = members[0].ctx
            try:
                set_walsink_properties(tx, table, props, view, self.archive_keep, pipelines)
            except WalsinkError as exc:  # the archive cannot be read: no member is published
                return [r if r is not None else exc for r in results]
            try:
                leader.event("table.before_group_commit")
                tx.commit_transaction()
            except unknown_outcome_errors() as exc:
                # It may have landed: delete nothing; the next load decides for each member.
                for i, _marker, data_files, deletes, replaced in prepared:
                    pending.setdefault(i, {})[snapshot] = self._group_result(
                        members[i], where[i][1], data_files, deletes, replaced, None
                    )
                last_conflict = exc
                self._log_unknown(
                    f"a group of {len(prepared)} checkpoints", UnknownCommitOutcome(exc, int(snapshot))
                )
                time.sleep(conflict_backoff(attempt))
                continue
            except (CommitFailedException, ValidationException) as exc:
                # Nothing committed: reload, check every member again (after a pause: the others go on).
                last_conflict = exc
                log.info(
                    "Iceberg group commit of %d checkpoints conflicted (%s); checking again",
                    len(prepared),
                    exc,
                )
                time.sleep(conflict_backoff(attempt))
                continue
            leader.event("table.after_group_commit")
            for i, _marker, data_files, deletes, replaced in prepared:
                results[i] = self._group_result(
                    members[i], where[i][1], data_files, deletes, replaced, snapshot
                )
            break
        else:
            if not pending:
                raise TableCommitConflict(
                    f"Iceberg table {self.identifier} changed under each of {GROUP_COMMIT_ATTEMPTS} group commit "
                    f"attempts (last: {last_conflict}); nothing was published, retry the commit"
                )
            # The last commit's outcome is still to be read from the table, member by member.
            table = self._load_deciding(None, {s: r for p in pending.values() for s, r in p.items()})
            for i, m in enumerate(members):
                if results[i] is None and table is not None:
                    results[i] = self._landed(
                        m.manifest, marker_of(self._props(table), m.manifest), pending.get(i, {})
                    )
            return [
                r
                if r is not None
                else TableCommitConflict(
                    f"Iceberg table {self.identifier}: none of {GROUP_COMMIT_ATTEMPTS} group commit attempts of "
                    f"{members[i].manifest.pipeline}/{members[i].manifest.checkpoint_key} landed (last: "
                    f"{last_conflict}); nothing of it was published, retry the commit"
                )
                for i, r in enumerate(results)
            ]
        return [r if r is not None else WalsinkError("not published") for r in results]

    @staticmethod
    def _group_result(
        member: GroupMember,
        locations: list[str],
        data_files: list[Any],
        deletes: list[Any],
        replaced: Any,
        snapshot: str | None,
    ) -> PublishResult:
        """What one member's part of a group snapshot published (``snapshot``: ``None`` while unknown)."""
        return PublishResult(
            published=len(data_files),
            files_rolled_back=len(deletes),
            partitions_replaced=list(replaced),
            target_files=locations,
            snapshot=snapshot,
            rows=member.manifest.total_rows,
        )
