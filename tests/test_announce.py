"""The commit task's announcement decision (``operators/announce.py``), on its own: which commit
gets an asset event, and what a group member's event says (issue 47)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

import pytest

from airflow_provider_walsink.core.commit.summary import CommitSummary
from airflow_provider_walsink.core.store.records import Actor
from airflow_provider_walsink.operators.announce import (
    Announcement,
    announces,
    decide_announcement,
    event_extra,
)

THIS = Actor(name="d.commit@run", dag_id="d", run_id="run", task_id="commit", try_number=2)


@dataclass
class Committed:
    """The fields of a COMMITTED transition the decision reads."""

    detail: str | None = None
    dag_id: str | None = "d"
    run_id: str | None = "run"
    task_id: str | None = "commit"
    actor: str | None = "d.commit@run"
    try_number: int | None = 1
    at: datetime = datetime(2026, 3, 1)


def summary(*, already: bool, committables: int | None = 4, published: int = 4) -> CommitSummary:
    return CommitSummary(
        pipeline="events", checkpoint_key="k1", sequence=1, attempt=1, attempt_id="a" * 32,
        state="COMMITTED", already_committed=already, committables=committables, published=published,
    )  # fmt: skip


def never_read(committed):  # a new commit must not need to read the events
    raise AssertionError("the events were read for a new commit")


@pytest.mark.parametrize(
    ("already", "committed", "unannounced", "expected"),
    [
        (False, None, never_read, (True, Announcement.NEW_COMMIT)),
        (True, Committed(detail="group commit led by k0 (x): 4 checkpoints"), lambda c: True,
         (True, Announcement.GROUP_MEMBER)),
        (True, Committed(detail="group commit led by k0 (x): 4 checkpoints"), lambda c: False,
         (False, Announcement.NONE)),
        (True, Committed(try_number=1), lambda c: True, (True, Announcement.RECONCILED)),
        (True, Committed(try_number=2), lambda c: True, (True, Announcement.RECONCILED)),
        (True, Committed(try_number=1), lambda c: False, (False, Announcement.NONE)),
        (True, Committed(try_number=3), lambda c: True, (False, Announcement.NONE)),  # a later try's
        (True, Committed(task_id="other"), lambda c: True, (False, Announcement.NONE)),  # another task's
        (True, Committed(run_id="other-run"), lambda c: True, (False, Announcement.NONE)),
        (True, Committed(try_number=None), lambda c: True, (False, Announcement.NONE)),
        (True, None, lambda c: True, (False, Announcement.NONE)),
    ],
    ids=["new", "group-unannounced", "group-announced", "earlier-try", "this-try", "earlier-try-announced",
         "later-try", "other-task", "other-run", "no-try", "no-commit"],
)  # fmt: skip
def test_a_commit_is_announced_exactly_when_no_other_task_can_announce_it(
    already, committed, unannounced, expected
):
    decision = decide_announcement(summary(already=already), committed, THIS, unannounced)
    assert (decision.announce, decision.case) == expected
    assert "events/k1" in decision.message


def test_a_group_members_event_carries_its_own_files_and_the_groups_identity():
    member = summary(already=True, committables=3, published=0)  # published by the group's leader
    publication = {"snapshot": "812", "group": {"leader": "k0", "size": 4}, "files": ["..."]}
    extra = event_extra(member, Announcement.GROUP_MEMBER, publication=publication, partition_key="münchen-ü")
    assert extra == {
        "pipeline": "events",
        "checkpoint_key": "k1",
        "partition_key": "münchen-ü",
        "attempt": 1,
        "attempt_id": "a" * 32,
        "rows": None,
        "files": 3,
        "published": 3,
        "announced": "group member",
        "group": {"leader": "k0", "size": 4, "snapshot": "812"},
    }
    assert announces(extra, member)
    assert not announces({**extra, "attempt_id": "b" * 32}, member)
    # A commit alone names no group.
    alone = event_extra(
        summary(already=False), Announcement.NEW_COMMIT, publication={"snapshot": "9"}, partition_key=None
    )
    assert "group" not in alone and "partition_key" not in alone and alone["published"] == 4
