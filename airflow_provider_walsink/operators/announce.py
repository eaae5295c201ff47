"""When the commit task adds an asset event for a commit, and what the event says.

Airflow records a task's asset events only when the task succeeds, and a downstream DAG runs
once per event, so the commit task must announce each committed version exactly once:

* **new commit**: this try recorded COMMITTED. Announced.
* **group member**: another task's group commit recorded it (its leader announces only its own
  checkpoint). Announced by the checkpoint's own commit task, unless an event of the pipeline's
  alias since that COMMITTED already names it (this task ran before).
* **reconciled**: a try of *this* task instance recorded it, this one (finding a dead try's table
  commit) or an earlier one killed before its success: none of them can still deliver the event.
  Announced unless an event already names it. A COMMITTED recorded by any other task is that
  task's to announce.
* **none**: anything else (a re-run of a committed checkpoint): nothing changed, no event.

"Already names it" is read from the alias's events by the operator; when they cannot be read,
nothing is announced (a missed downstream run can be repaired, a second one cannot).

Every event's extra (documented field by field in docs/ui.md, "Asset events"): ``pipeline``,
``checkpoint_key``, ``partition_key`` (a partitioned run), ``attempt``, ``attempt_id``, ``rows``,
``files`` (the checkpoint's committables), ``published`` (the files of this checkpoint the commit
made visible: its committables, whoever published them), ``announced`` (which of the cases above),
and, for a checkpoint committed in a group, ``group``: ``{"leader", "size", "snapshot"}`` (the
leader's checkpoint key, how many checkpoints the one table commit holds, and its snapshot or
version), the same in every member's event.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from airflow_provider_walsink.core.commit.group import committed_by_group
from airflow_provider_walsink.core.commit.summary import CommitSummary
from airflow_provider_walsink.core.store.records import Actor


class Announcement(StrEnum):
    NEW_COMMIT = "new commit"
    GROUP_MEMBER = "group member"
    RECONCILED = "reconciled"
    NONE = "none"


@dataclass(frozen=True)
class AnnounceDecision:
    """Whether to add the event, which case it is, and the one log line that says so."""

    announce: bool
    case: Announcement
    message: str


def decide_announcement(
    summary: CommitSummary,
    committed: Any,
    actor: Actor,
    unannounced: Callable[[Any], bool],
) -> AnnounceDecision:
    """The announcement of one commit (module docstring).

    ``committed``: the COMMITTED transition of the version now committed (``None`` if there is
    none); ``unannounced(committed)``: no event of the alias since that transition names this
    commit (the operator reads Airflow's events; it answers ``False`` when it cannot read them).
    """
    what = f"{summary.pipeline}/{summary.checkpoint_key}"
    if not summary.already_committed:
        return AnnounceDecision(True, Announcement.NEW_COMMIT, f"Checkpoint {what} committed by this task")
    if committed is not None and committed_by_group(committed.detail):
        if unannounced(committed):
            return AnnounceDecision(
                True,
                Announcement.GROUP_MEMBER,
                f"Checkpoint {what} was committed by another task's group commit ({committed.detail}); "
                "adding its asset event, which the group's leader does not add",
            )
        return AnnounceDecision(
            False,
            Announcement.NONE,
            f"Checkpoint {what} was committed by a group commit and its asset event was already added",
        )
    if _by_this_task(committed, actor) and unannounced(committed):
        return AnnounceDecision(
            True,
            Announcement.RECONCILED,
            f"Checkpoint {what} was committed by this task (an earlier try that did not finish, or this try "
            "reconciling a dead try's table commit) and no asset event announces it; adding it",
        )
    return AnnounceDecision(
        False,
        Announcement.NONE,
        f"Checkpoint {what} was already committed; nothing changed and no asset event",
    )


def _by_this_task(committed: Any, actor: Actor) -> bool:
    """A try of this task instance, this one or an earlier one, recorded the COMMITTED."""
    if committed is None or committed.try_number is None or actor.try_number is None:
        return False
    same_task = (committed.dag_id, committed.run_id, committed.task_id, committed.actor) == (
        actor.dag_id,
        actor.run_id,
        actor.task_id,
        actor.name[:255],
    )
    return same_task and committed.try_number <= actor.try_number


def announces(extra: Mapping[str, Any], summary: CommitSummary) -> bool:
    """Does an event's extra name this commit? By attempt id (unique across a checkpoint's lives,
    where numbers repeat after retention), or by number for events written before the id was."""
    return (
        extra.get("pipeline") == summary.pipeline
        and extra.get("checkpoint_key") == summary.checkpoint_key
        and extra.get("attempt") == summary.attempt
        and extra.get("attempt_id", summary.attempt_id) == summary.attempt_id
    )


def event_extra(
    summary: CommitSummary,
    case: Announcement,
    *,
    publication: Mapping[str, Any] | None,
    partition_key: str | None,
) -> dict[str, Any]:
    """What the asset event of one commit says (module docstring)."""
    files = summary.committables
    extra: dict[str, Any] = {
        "pipeline": summary.pipeline,
        "checkpoint_key": summary.checkpoint_key,
        "attempt": summary.attempt,
        "attempt_id": summary.attempt_id,
        "rows": summary.rows,
        "files": files,
        # The checkpoint's files made visible by this version, whoever published them (a group's
        # leader, a dead try): a consumer filtering on published > 0 sees every committed one.
        "published": files if files is not None else summary.published + summary.already_published,
        "announced": case.value,
    }
    if partition_key is not None:
        # Airflow itself gives an event added through an alias the run's partition key (alias
        # events carry dag_run.partition_key), so a PartitionedAssetTimetable runs for it; shown here too.
        extra["partition_key"] = partition_key
    group = (publication or {}).get("group")
    if group:
        extra["group"] = {
            "leader": group.get("leader"),
            "size": group.get("size"),
            "snapshot": (publication or {}).get("snapshot"),
        }
    return extra
