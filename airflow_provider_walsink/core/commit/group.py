"""Group commit: a committer publishes other durable checkpoints of its pipeline with its own, in
one table transaction (Flink's ``IcebergFilesCommitter`` commits every pending checkpoint in one
snapshot), checkpoint by checkpoint exactly-once.

Many commit tasks of a backfill committing into one Iceberg or Delta table at once conflict
(optimistic concurrency) and retry; one that runs out of retries fails. Here the committer that
holds its checkpoint's lease (the *leader*) also takes, by the same compare-and-set every commit
uses, the lease of other checkpoints of its pipeline that are DURABLE (AUDITED where the
pipeline requires its audit) and not held, verifies each as a single commit would (sealed
manifest, digest, identity, and with ``verify_checksums`` every staged checksum; the publisher checks staged files, layout, order and the marker) and
publishes them all in one table transaction, each carrying its own marker
(``publish_group`` on the publisher: the one thing the target contributes). Then COMMITTED is recorded for each member under its
own lease, the history naming the group.

What keeps it exactly-once, member by member:

* each member is published under its own lease's fencing token, checked before the commit
  (``ctx.fence()``) and in the table (the marker rule, on the state the commit is based on):
  a member whose lease was taken over is left out, never published by the leader;
* a member that fails verification is recorded FAILED with its own error, as a single commit
  records it, and is left out; the others go on;
* a leader killed after the table commit leaves its members COMMITTING under leases that
  expire; each member's own commit task (or any committer) then takes the lease over, finds
  its marker in the table (already published) and records COMMITTED, as after any crash;
* only ``overwrite`` pipelines group, and only checkpoints replacing disjoint partitions,
  first versions only (no reprocess): two checkpoints of one partition commit one after the
  other, so the partition ends as two sequential commits leave it. ``append`` pipelines (their
  offsets commit in sequence order) and ``fencing="table"`` commit alone.

The loop is the commit sequence of :class:`~.commit.CheckpointCommitter` over several checkpoints
(lease fencing only): read each sealed attempt, take each lease, publish all, record each.

Members' leases are taken under the owner ``group:<leader's owner>``, so a member's own commit
task can tell its checkpoint is being published by a group and wait for it instead of failing.

Groups form when tasks arrive together (a backfill whose writes finish at once) because only
one commit of the pipeline's table is in flight at a time: a task first claims the pipeline's
group-commit lead (:mod:`~airflow_provider_walsink.core.store.group_lead`, one compare-and-set);
a task that finds it held takes no lease, leaves its checkpoint to the leader's group and waits
for the answer (:func:`commit_waiting_for_group`), as a database's group commit does. Without
the lead, K tasks released together each leased their own checkpoint first, so a leader found
little to take and they all met at the table (groups of 2-8, about 5 table conflicts per
checkpoint). The lead chooses who publishes, never what: each checkpoint is still published
under its own lease.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable
from typing import Any

from airflow_provider_walsink.core.commit.checksums import read_verified_attempt
from airflow_provider_walsink.core.commit.fencing import Committing, Hold
from airflow_provider_walsink.core.commit.lease import FencingContext, lease_context, record_failure
from airflow_provider_walsink.core.commit.refusals import describe_error
from airflow_provider_walsink.core.commit.sealed import publish_argument
from airflow_provider_walsink.core.commit.summary import CommitSummary, publication, summarize, with_result
from airflow_provider_walsink.core.faults import crashpoint
from airflow_provider_walsink.core.protocol.errors import FencedError
from airflow_provider_walsink.core.protocol.states import COMMITTABLE, CheckpointState
from airflow_provider_walsink.core.store.errors import LeaseHeldError
from airflow_provider_walsink.core.store.records import Actor, CheckpointRecord, Lease
from airflow_provider_walsink.core.targets.base import GroupMember, PublishResult

log = logging.getLogger(__name__)
S = CheckpointState

#: Lease owners of checkpoints a group commit holds start with this (then the leader's owner).
GROUP_OWNER_PREFIX = "group:"
#: The history detail of a checkpoint COMMITTED by a group commit starts with this.
GROUP_DETAIL_PREFIX = "group commit led by "
#: Groups a leader publishes after its own before it gives the lead up (a waiting task takes it
#: on): a leader's task ends in bounded time however many checkpoints queue up behind it.
GROUPS_PER_LEAD = 16
#: Member keys named in one history detail (the rest are counted).
DETAIL_KEYS = 50


def is_group_owner(owner: str | None) -> bool:
    """Whether a lease owner is a group commit's leader holding a member's lease."""
    return bool(owner) and owner.startswith(GROUP_OWNER_PREFIX)  # type: ignore[union-attr]


def committed_by_group(detail: str | None) -> bool:
    """Whether a COMMITTED transition's detail says a group commit recorded it."""
    return bool(detail) and detail.startswith(GROUP_DETAIL_PREFIX)  # type: ignore[union-attr]


class GroupCommitInFlightError(LeaseHeldError):
    """Another task leads a group commit of the pipeline: this checkpoint, left unheld, goes into
    its next group (or to this task once the lead is given up). Ask again after a pause."""

    def __init__(self, pipeline: str, checkpoint_key: str, leader: str) -> None:
        self.leader = leader
        super().__init__(
            f"checkpoint {pipeline}/{checkpoint_key} waits for the group commit of pipeline {pipeline} "
            f"led by {leader}: that leader publishes it with its next group, or this task does once "
            "the lead is given up or runs out"
        )


def groups_checkpoints(committer: Committing) -> bool:
    """A committer groups when asked to, with lease fencing, in ``overwrite`` mode, into a
    publisher that offers ``publish_group`` of staged attempts."""
    return (
        committer.group_commit > 0
        and committer.fencing == "lease"
        and committer.mode == "overwrite"
        and committer.publisher.publish_group is not None
        and committer.publisher.takes_staged_attempt
    )


def can_lead_group(committer: Committing, record: CheckpointRecord) -> bool:
    """A committer leads a group when it groups at all and the checkpoint may group (no reprocess)."""
    return groups_checkpoints(committer) and not record.supersedes_attempt_id


def claim_lead(committer: Committing, pipeline: str, checkpoint_key: str, actor: Actor) -> str | None:
    """Claim the pipeline's group-commit lead before taking any lease; the owner to release it with.

    ``None`` when the committer does not group, or the checkpoint cannot be committed now
    (COMMITTED, not durable, rejected: the sequence answers or refuses it at once). Raises
    :class:`GroupCommitInFlightError` when another task leads: this task takes no lease, so the
    leader can take its checkpoint into its group.
    """
    if not groups_checkpoints(committer):
        return None
    record = committer.store.get(pipeline, checkpoint_key)
    if record is None or record.state not in COMMITTABLE:
        # COMMITTED, not yet durable, rejected...: the sequence answers or refuses it at once,
        # never waiting behind a group, and leads nothing.
        return None
    owner = (committer.owner or actor.lease_owner)[:255]
    leader = committer.store.lead_group(pipeline, owner, ttl=committer.lease_ttl)
    if leader is None or leader == owner:
        return owner
    raise GroupCommitInFlightError(pipeline, checkpoint_key, leader)


def next_group(committer: Committing, pipeline: str, lead: str, *, actor: Actor) -> Hold | None:
    """The lease of the pipeline's next checkpoint to lead a group with, while ``lead`` still leads.

    A leader keeps publishing the durable checkpoints left to it, a group at a time (as a
    database's group commit flushes while transactions queue up), so tasks that wait behind it
    are answered without a hand-over of the lead per group. ``None`` (stop) when fewer than two
    could go together (one left commits alone, by its own task), or the lead was lost. The
    checkpoint is held under the group owner, so its own task waits for the answer.
    """
    store = committer.store
    if store.lead_group(pipeline, lead, ttl=committer.lease_ttl) != lead:
        return None  # extended, or lost (ran out, taken over): then stop leading
    states = [S.AUDITED.value] if committer.require_audit else [S.DURABLE.value, S.AUDITED.value]
    candidates = [
        c
        for c in store.checkpoints(
            pipeline, states=states, limit=committer.group_commit + 1, descending=False
        )
        if not c.supersedes_attempt_id
    ]
    if len(candidates) < 2:
        return None
    first, asked = candidates[0], time.monotonic()
    try:
        lease = store.acquire_lease(
            pipeline,
            first.checkpoint_key,
            owner=(GROUP_OWNER_PREFIX + lead)[:255],
            ttl=committer.lease_ttl,
            actor=actor,
            mode=committer.mode,
            require_audit=committer.require_audit,
        )
    except Exception as exc:  # noqa: BLE001 - taken, committed or refused meanwhile: its own task answers
        log.debug("not leading another group of %s from %s: %s", pipeline, first.checkpoint_key, exc)
        return None
    record = lease.record or store.require(pipeline, first.checkpoint_key)
    return Hold(record, lease_context(store, lease, committer.lease_ttl, record, asked))


def commit_waiting_for_group(
    committer: Any,
    pipeline: str,
    checkpoint_key: str,
    *,
    actor: Actor,
    poll: float,
    patience: float | None = None,
) -> CommitSummary:
    """:meth:`~.commit.CheckpointCommitter.commit`, waiting while a group commit has the checkpoint.

    It waits while another task leads the pipeline's group commit (:class:`GroupCommitInFlightError`)
    or a group holds the checkpoint's lease (owner ``group:...``): the leader records COMMITTED
    (then this is an answered no-op) or dies, and its lead and leases run out on the database's
    clock (then this task leads, takes the lease over and reconciles from the table's marker).
    Any other live holder is raised at once, as a single commit raises it. ``patience``
    (default: twice the lease TTL and a minute) runs from the moment the awaited holder last
    changed, so a long line of groups that all make progress is waited out.
    """
    patience = 2 * committer.lease_ttl.total_seconds() + 60 if patience is None else patience
    awaited: str | None = None
    deadline = time.monotonic() + patience
    while True:
        try:
            return committer.commit(pipeline, checkpoint_key, actor=actor)
        except GroupCommitInFlightError as exc:
            holder: str | None = exc.leader
        except LeaseHeldError:
            record = committer.store.get(pipeline, checkpoint_key)
            # Re-read after the refusal: a group may have finished meanwhile (no holder now: ask again).
            if record is None or (record.lease_owner and not is_group_owner(record.lease_owner)):
                raise
            holder = record.lease_owner
        now = time.monotonic()
        if holder != awaited:
            awaited, deadline = holder, now + patience
            log.info(
                "checkpoint %s/%s is left to the group commit of %s; waiting for it",
                pipeline,
                checkpoint_key,
                holder,
            )
        elif now > deadline:
            raise LeaseHeldError(
                f"checkpoint {pipeline}/{checkpoint_key} waited {patience:.0f} s for the group commit of "
                f"{holder}, which neither finished nor gave it up"
            )
        _await_a_change(committer.store, pipeline, checkpoint_key, poll, until=deadline)


def commit_as_leader(
    committer: Committing,
    hold: Hold,
    *,
    actor: Actor,
    started: float,
    alone: Callable[[], CommitSummary],
) -> CommitSummary:
    """Commit the leased checkpoint with up to ``committer.group_commit`` others (module docstring).

    ``hold`` is the leader's lease (:class:`~.lease.LeaseFencing`); ``alone`` commits it by
    itself (the sequence's single publish), when nothing can join it. Raises what
    :meth:`CheckpointCommitter.commit` raises for the leader's own checkpoint; a member's
    error is recorded on that member and never raised here.
    """
    store, record = committer.store, hold.record
    pipeline = record.pipeline
    try:
        manifest, attempt = read_verified_attempt(
            committer.staging,
            record,
            verify_checksums=committer.verify_checksums,
            publisher=committer.publisher,
        )
    except Exception:  # noqa: BLE001 - the single commit reads it again and records the error
        return alone()
    leader_ctx: FencingContext = hold.ctx
    leader_ctx.attempt_id = manifest.attempt_id
    taken: dict[str, str] = {p: record.checkpoint_key for p in manifest.replaced_partitions()}
    members: list[tuple[CheckpointRecord, Lease, Any, Any, FencingContext]] = []
    owner = (GROUP_OWNER_PREFIX + (committer.owner or actor.lease_owner))[:255]
    states = [S.AUDITED.value] if committer.require_audit else [S.DURABLE.value, S.AUDITED.value]
    for candidate in store.checkpoints(
        pipeline, states=states, limit=committer.group_commit * 2 + 1, descending=False
    ):
        if len(members) >= committer.group_commit:
            break
        if (
            candidate.checkpoint_key == record.checkpoint_key
            or candidate.supersedes_attempt_id
            or (candidate.staging_root or None) != (record.staging_root or None)
        ):
            continue
        # Read first (no lease needed to read): a checkpoint that cannot join is left untouched.
        try:
            member_manifest, member_attempt = read_verified_attempt(
                committer.staging,
                candidate,
                verify_checksums=committer.verify_checksums,
                publisher=committer.publisher,
            )
            unreadable: Exception | None = None
            if any(p in taken for p in member_manifest.replaced_partitions()):
                continue  # sequential commits of one partition: it waits for its own turn
        except Exception as exc:  # noqa: BLE001 - recorded on it below, as its single commit would
            unreadable = exc
        member_asked = time.monotonic()
        try:
            member_lease = store.acquire_lease(
                pipeline,
                candidate.checkpoint_key,
                owner=owner,
                ttl=committer.lease_ttl,
                actor=actor,
                mode=committer.mode,
                require_audit=committer.require_audit,
            )
        except Exception as exc:  # noqa: BLE001 - taken by another, committed meanwhile...: not ours
            log.debug("not grouping %s/%s: %s", pipeline, candidate.checkpoint_key, exc)
            continue
        member = member_lease.record or store.require(pipeline, candidate.checkpoint_key)
        if (member.sealed_attempt_id, member.manifest_digest, member.supersedes_attempt_id) != (
            candidate.sealed_attempt_id,
            candidate.manifest_digest,
            None,
        ):
            # A new attempt was sealed since it was read: not what was checked, so not grouped.
            _release(store, member_lease, actor, "not grouped: its sealed attempt changed while it was read")
            continue
        if unreadable is not None:
            log.error("checkpoint %s/%s cannot be committed: %s", pipeline, member.checkpoint_key, unreadable)
            record_failure(
                store, pipeline, member.checkpoint_key, describe_error(unreadable), actor, member_lease
            )
            continue
        for p in member_manifest.replaced_partitions():
            taken[p] = member.checkpoint_key
        ctx = lease_context(store, member_lease, committer.lease_ttl, member, member_asked)
        ctx.attempt_id = member_manifest.attempt_id
        members.append((member, member_lease, member_manifest, member_attempt, ctx))
    if not members:
        return alone()

    everyone = [(record, hold.ctx.lease, manifest, attempt, leader_ctx), *members]
    group = [
        GroupMember(m, publish_argument(committer.publisher, a), ctx)  # type: ignore[arg-type]
        for _r, _l, m, a, ctx in everyone
    ]
    try:
        results = committer.publisher.publish_group(group)  # type: ignore[attr-defined]
    except Exception as exc:
        # Nothing published (a table that kept changing, a database error): members go back, unheld,
        # to be committed by their own tasks; the leader's error is recorded as a single commit's.
        for _member, member_lease, *_ in members:
            _release(store, member_lease, actor, f"group commit of {record.checkpoint_key} failed: {exc}")
        log.error("checkpoint %s/%s cannot be committed: %s", pipeline, record.checkpoint_key, exc)
        record_failure(store, pipeline, record.checkpoint_key, describe_error(exc), actor, leader_ctx.lease)
        raise
    keys = [
        r.checkpoint_key
        for (r, *_), res in zip(everyone, results, strict=True)
        if isinstance(res, PublishResult)
    ]
    detail = _detail(record, actor, keys)
    summaries: dict[str, CommitSummary] = {}
    leader_error: Exception | None = None
    crashpoint("group.before_committed")
    for (member, _lease, member_manifest, _attempt, ctx), result in zip(everyone, results, strict=True):
        key = member.checkpoint_key
        if isinstance(result, PublishResult):
            try:
                done = store.mark_committed(
                    ctx.lease,
                    actor=actor,
                    end_offsets=member_manifest.end_offsets,
                    detail=f"{detail}; published {result.published}, already there {result.already}",
                    # The group's identity on every member: its asset event names the group.
                    publication=publication(committer.publisher, result)
                    | {"group": {"leader": record.checkpoint_key, "size": len(keys)}},
                )
            except FencedError as exc:
                log.error("stopped committing %s/%s: %s", pipeline, key, exc)
                record_failure(store, pipeline, key, f"fenced out: {exc}", actor, ctx.lease)
                if key == record.checkpoint_key:
                    leader_error = exc
                continue
            summaries[key] = with_result(summarize(done, already=False, started=started), result)
            continue
        # Left out of the group: recorded on the member as its own commit would record it.
        why = f"fenced out: {result}" if isinstance(result, FencedError) else describe_error(result)
        log.error("checkpoint %s/%s cannot be committed: %s", pipeline, key, result)
        record_failure(store, pipeline, key, why, actor, ctx.lease)
        if key == record.checkpoint_key:
            leader_error = result
    crashpoint("group.after_committed")
    # Step 6 for the leader's checkpoint only: each member's own task asks again, finds its
    # checkpoint COMMITTED and cleans its own staging (the leader would do it a second time).
    if record.checkpoint_key in summaries:
        committer.finish(manifest)
    log.info(
        "group commit of %s/%s: %d checkpoints committed together (%s)",
        pipeline,
        record.checkpoint_key,
        len(summaries),
        ", ".join(summaries),
    )
    if leader_error is not None:
        raise leader_error
    summary = summaries[record.checkpoint_key]
    summary.lease_taken_over_from = hold.taken_over_from
    summary.group = [record.checkpoint_key, *(k for k in summaries if k != record.checkpoint_key)]
    return summary


def _await_a_change(store: Any, pipeline: str, checkpoint_key: str, poll: float, *, until: float) -> None:
    """Wait, one read per look (:meth:`~...store.group_lead.GroupLeads.group_wait`) every ``poll``
    seconds (jittered: tasks released together do not look in step), until asking again can change
    the answer: the checkpoint is no longer waiting (COMMITTED, failed...), the group's lease on it
    ran out, it is held by a single committer (raised), or it is unheld and no one leads; or until
    ``until``. A leader publishing it, or a live lead it waits for, is waited out without a write."""
    while time.monotonic() < until:
        time.sleep(poll * random.uniform(0.8, 1.2))
        look = store.group_wait(pipeline, checkpoint_key)
        if look is None or look.state not in (S.DURABLE, S.AUDITED, S.COMMITTING):
            return
        if look.lease_owner:
            if not (look.lease_live and is_group_owner(look.lease_owner)):
                return
        elif not look.lead_live:
            return


def _detail(leader: CheckpointRecord, actor: Actor, keys: list[str]) -> str:
    shown = ", ".join(keys[:DETAIL_KEYS]) + (
        f" (+{len(keys) - DETAIL_KEYS} more)" if len(keys) > DETAIL_KEYS else ""
    )
    who = f"{actor.dag_id}/{actor.run_id}/{actor.task_id}" if actor.dag_id else actor.name
    return f"{GROUP_DETAIL_PREFIX}{leader.checkpoint_key} ({who}): {len(keys)} checkpoints in one table commit [{shown}]"


def _release(store: Any, lease: Lease, actor: Actor, reason: str) -> None:
    try:
        store.release_lease(lease, actor=actor, reason=reason[:1000])
    except Exception as exc:  # noqa: BLE001 - its lease expires; its own task takes it over
        log.warning("could not release %s/%s: %s", lease.pipeline, lease.checkpoint_key, exc)
