"""Several checkpoints in one Delta table version: the group commit of :class:`.DeltaPublisher` (a
mixin: it uses the publisher's table access and actions).
"""

from __future__ import annotations

import json
import logging
import time
from typing import Any

from deltalake import CommitProperties, Transaction
from deltalake.exceptions import CommitFailedError

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
from airflow_provider_walsink.core.targets.delta.log import (
    GROUP_COMMIT_ATTEMPTS,
    append_commit,
    marker_transactions,
)

# The target's one logger (its name is what users filter on).
log = logging.getLogger("airflow_provider_walsink.core.targets.delta")


class DeltaGroupCommit:
    """:meth:`publish_group` for :class:`.DeltaPublisher` (:class:`~.base.GroupPublisher`)."""

    table_uri: str
    mode: str
    storage: Any

    def publish_group(self, members: list[GroupMember]) -> list[PublishResult | Exception]:
        """Several checkpoints in one log version, each with its own marker (:class:`~.base.GroupPublisher`).

        The one commit carries every member's add (and, in ``overwrite``, remove) actions and, per
        member, exactly the application transactions a single commit carries
        (:func:`.log.marker_transactions`, at the member's own fencing token). Its
        ``commitInfo`` has no single ``walsink.checkpoint``: ``walsink.group`` lists the members
        (checkpoint, attempt id, token, partitions), read where a single commit's fields are read
        (:func:`.log.commit_holders`).
        """
        check_group(members, self.mode)
        results: list[PublishResult | Exception | None] = [None] * len(members)
        where: dict[int, tuple[str, list[str]]] = {}
        staged: dict[int, list[Any]] = {}
        for i, m in enumerate(members):
            try:
                where[i] = staged_locations(m.attempt, m.manifest)
            except WalsinkError as exc:
                results[i] = exc
        for attempt in range(GROUP_COMMIT_ATTEMPTS):
            dt = self.load_table()
            live: list[tuple[int, Any]] = []
            for i, m in enumerate(members):
                if results[i] is not None:
                    continue
                try:
                    marker = self.marker_of(dt, m.manifest) if dt is not None else None
                    aborted = (
                        self._aborted(dt, m.manifest, [m.manifest.attempt_id])
                        if dt is not None
                        else frozenset()
                    )
                    if decide(marker, m.manifest, m.ctx, self.mode, aborted):
                        results[i] = self._already(m.manifest, marker, where[i][1], dt)
                        continue
                    if dt is not None:
                        self._check_order(dt, m.manifest)
                    if i not in staged:
                        staged[i] = staging_storage(self.storage, m.attempt).describe(m.manifest, where[i][1])
                    live.append((i, marker))
                except WalsinkError as exc:
                    results[i] = exc
            if not live:
                break
            if dt is None:
                first = live[0][0]
                try:
                    _, schema, partition_by = self._adds_for_new_table(
                        members[first].manifest, where[first][0], staged[first]
                    )
                except WalsinkError as exc:
                    results[first] = exc
                    continue
                self._create_empty(schema, partition_by)
                continue  # the data goes in a normal (put-if-absent) commit on the new table
            try:
                if self.bounding(dt):
                    continue
            except CommitFailedError:
                continue  # another writer changed the table first: load it again
            version = dt.version() + 1
            # Every member's removes read the same table state: list its files once, not once per member.
            listed_files = dt.get_add_actions(flatten=True)
            dt.get_add_actions = lambda flatten=True, _files=listed_files: _files  # type: ignore[method-assign]
            actions: list[Any] = []
            transactions: list[Transaction] = []
            listed: list[dict[str, Any]] = []
            prepared = []
            for i, marker in live:
                m = members[i]
                try:
                    adds = self._adds(dt, m.manifest, where[i][0], staged[i])
                    removes, replaced = self._removes(dt, m.manifest, marker, where[i][0], None)
                    m.ctx.fence()  # the member's lease is still the leader's: else it is left out
                except WalsinkError as exc:
                    results[i] = exc
                    continue
                manifest, token = m.manifest, m.ctx.epoch
                actions += [*removes, *adds]
                transactions += marker_transactions(manifest, token, len(adds), replaced, version)
                listed.append(
                    {
                        "pipeline": manifest.pipeline,
                        "checkpoint": manifest.checkpoint_key,
                        "attempt_id": manifest.attempt_id,
                        "epoch": token,
                        "sequence": manifest.sequence,
                        "partitions": list(replaced),
                    }
                )
                prepared.append((i, adds, removes, replaced))
            if not prepared:
                break
            pipelines = sorted({members[i].manifest.pipeline for i, *_ in prepared})
            archived, info = self.archiving(dt, pipelines, transactions, version)
            commit = CommitProperties(
                custom_metadata={
                    "walsink.pipeline": members[prepared[0][0]].manifest.pipeline,
                    "walsink.group": json.dumps(listed, sort_keys=True),
                    **info,
                },
                app_transactions=[*transactions, *archived],
                # Our own retries only: the partition holders name this exact version.
                max_commit_retries=0,
            )
            leader = members[0].ctx
            try:
                leader.event("table.before_group_commit")
                append_commit(dt, actions, commit)
            except CommitFailedError as exc:
                log.info(
                    "Delta group commit of %d checkpoints conflicted (%s); checking again", len(prepared), exc
                )
                time.sleep(conflict_backoff(attempt))
                continue
            leader.event("table.after_group_commit")
            dt.update_incremental()
            if archived:
                dt.copy_archived(pipelines)
            for i, adds, removes, replaced in prepared:
                results[i] = PublishResult(
                    published=len(adds),
                    files_rolled_back=len(removes),
                    partitions_replaced=list(replaced),
                    target_files=where[i][1],
                    snapshot=str(dt.version()),
                    rows=members[i].manifest.total_rows,
                )
            break
        else:
            raise TableCommitConflict(
                f"Delta table {self.table_uri} changed under each of {GROUP_COMMIT_ATTEMPTS} group commit attempts; "
                "nothing was published, retry the commit"
            )
        return [r if r is not None else WalsinkError("not published") for r in results]
