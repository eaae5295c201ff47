"""Group commit into a Delta table: several checkpoints in one log version, each with its own marker.

The one commit carries every member's add (and, in ``overwrite``, remove) actions and, per
member, exactly the application transactions a single commit carries: ``walsink/<pipeline>/<key>``
and ``walsink/<pipeline>/<key>/<attempt id>`` at the member's own fencing token,
``walsink-files/...`` with its file count, and the partition holders of each partition it
replaces at this commit's table version. The commit's ``commitInfo`` has no single
``walsink.checkpoint``; ``walsink.group`` lists the members (checkpoint, attempt id, token,
partitions), which :func:`commit_holders` reads where a single commit's fields are read (the
ordering rule's holder of a partition, the attempt id of a token in the history).
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

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
    PublishOutcome,
    PublishResult,
    check_group,
    conflict_backoff,
)

if TYPE_CHECKING:
    from airflow_provider_walsink.core.targets.delta import DeltaPublisher

log = logging.getLogger(__name__)

#: Check + commit attempts of one group before giving up on a table that keeps changing.
GROUP_COMMIT_ATTEMPTS = 40


def commit_holders(info: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The checkpoints one walsink commit published, from its ``commitInfo``: one for a single
    commit (``pipeline``, ``checkpoint``, ``attempt_id``, ``epoch``; ``partitions`` unknown: ``None``),
    each member of a group commit (with the partitions it replaced)."""
    raw = info.get("walsink.group")
    if raw:
        try:
            return list(json.loads(raw))
        except (TypeError, ValueError):
            return []
    if info.get("walsink.checkpoint") is None:
        return []
    return [
        {
            "pipeline": info.get("walsink.pipeline"),
            "checkpoint": info.get("walsink.checkpoint"),
            "attempt_id": info.get("walsink.attempt-id"),
            "epoch": info.get("walsink.epoch"),
            "partitions": None,
        }
    ]


def publish_group(pub: DeltaPublisher, members: list[GroupMember]) -> list[PublishResult | Exception]:
    """:class:`~.base.GroupPublisher` for :class:`~.delta.DeltaPublisher` (its contract)."""
    from airflow_provider_walsink.core.targets.delta import (
        _append_commit,
        app_id,
        files_app_id,
        partition_app_id,
    )

    check_group(members, pub.mode)
    results: list[PublishResult | Exception | None] = [None] * len(members)
    where: dict[int, tuple[str, list[str]]] = {}
    staged: dict[int, list[Any]] = {}
    for i, m in enumerate(members):
        try:
            where[i] = staged_locations(m.attempt, m.manifest)
        except WalsinkError as exc:
            results[i] = exc
    for attempt in range(GROUP_COMMIT_ATTEMPTS):
        dt = pub.load_table()
        live: list[tuple[int, Any]] = []
        for i, m in enumerate(members):
            if results[i] is not None:
                continue
            try:
                marker = pub.marker_of(dt, m.manifest) if dt is not None else None
                aborted = (
                    pub._aborted(dt, m.manifest, [m.manifest.attempt_id]) if dt is not None else frozenset()
                )
                if decide(marker, m.manifest, m.ctx, pub.mode, aborted):
                    results[i] = pub._already(m.manifest, marker, where[i][1], dt)
                    continue
                if dt is not None:
                    pub._check_order(dt, m.manifest)
                if i not in staged:
                    staged[i] = staging_storage(pub.storage, m.attempt).describe(m.manifest, where[i][1])
                live.append((i, marker))
            except WalsinkError as exc:
                results[i] = exc
        if not live:
            break
        if dt is None:
            first = live[0][0]
            try:
                _, schema, partition_by = pub._adds_for_new_table(
                    members[first].manifest, where[first][0], staged[first]
                )
            except WalsinkError as exc:
                results[first] = exc
                continue
            pub._create_empty(schema, partition_by)
            continue  # the data goes in a normal (put-if-absent) commit on the new table
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
                adds = pub._adds(dt, m.manifest, where[i][0], staged[i])
                removes, replaced = pub._removes(dt, m.manifest, marker, where[i][0], None)
                m.ctx.fence()  # the member's lease is still the leader's: else it is left out
            except WalsinkError as exc:
                results[i] = exc
                continue
            manifest, token = m.manifest, m.ctx.epoch
            actions += [*removes, *adds]
            transactions += [
                Transaction(app_id(manifest), token),
                Transaction(app_id(manifest, manifest.attempt_id), token),
                Transaction(files_app_id(manifest, manifest.attempt_id), len(adds)),
                *(
                    Transaction(app, version)
                    for partition in replaced
                    for app in (
                        partition_app_id(manifest.pipeline, partition),
                        partition_app_id(manifest.pipeline, partition, manifest.checkpoint_key),
                    )
                ),
            ]
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
        commit = CommitProperties(
            custom_metadata={
                "walsink.pipeline": members[prepared[0][0]].manifest.pipeline,
                "walsink.group": json.dumps(listed, sort_keys=True),
            },
            app_transactions=transactions,
            # Our own retries only: the partition holders name this exact version.
            max_commit_retries=0,
        )
        leader = members[0].ctx
        try:
            leader.event("table.before_group_commit")
            _append_commit(dt, actions, commit)
        except CommitFailedError as exc:
            log.info(
                "Delta group commit of %d checkpoints conflicted (%s); checking again", len(prepared), exc
            )
            time.sleep(conflict_backoff(attempt))
            continue
        leader.event("table.after_group_commit")
        dt.update_incremental()
        for i, adds, removes, replaced in prepared:
            result = PublishResult(
                outcome=PublishOutcome.PUBLISHED,
                published=len(adds),
                target_files=where[i][1],
                snapshot=str(dt.version()),
                rows=members[i].manifest.total_rows,
            )
            result.files_rolled_back = len(removes)
            result.partitions_replaced = list(replaced)
            results[i] = result
        break
    else:
        raise TableCommitConflict(
            f"Delta table {pub.table_uri} changed under each of {GROUP_COMMIT_ATTEMPTS} group commit attempts; "
            "nothing was published, retry the commit"
        )
    return [r if r is not None else WalsinkError("not published") for r in results]
