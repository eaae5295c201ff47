"""The one fenced clean-up of staged attempts: post-commit, abort and GC all delete through it.

A clean-up decides from what it read (the committer row, the table's
snapshot) and deletes later; in between a reprocess may commit a new
version whose files a table references in place in staging, or a new run
may start an attempt. A paused clean-up (a stalled node, SIGSTOP) must not
act on what it read before the pause. So, for *each* attempt directory,
immediately before deleting it:

1. **Fence**: ``fence()`` re-reads the committer row and raises
   :class:`CleanupFencedError` if it moved on (another version began or
   committed, the abort's token moved, the row GC read changed). The
   clean-up stops; what it left, a later clean-up or GC removes.
2. **Own version only**: attempts numbered above ``up_to`` (the cleaning
   version's attempt) belong to a later run and are never touched.
3. **What the target references now**: ``referenced(attempt_id)`` asks the
   target's *current* state (a table reloaded for the call) whether any
   snapshot references the attempt's files; such an attempt stays.

As for every fenced step on a plain file system, a process paused exactly
between these checks and the delete can still do that one delete
(docs/guarantees.md); the checks are the last thing before it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING

from airflow_provider_walsink.faults import crashpoint

from .errors import FencedError

if TYPE_CHECKING:
    from .staging import StagingLayout

log = logging.getLogger(__name__)

#: One staged attempt: (number, attempt id or None, location).
Attempt = tuple[int, "str | None", str]


class CleanupFencedError(FencedError):
    """The clean-up's checkpoint moved on since it decided what to delete: it stopped, deleting nothing more."""


def never_referenced(_attempt_id: str | None) -> bool:
    """``referenced`` for targets that copy or move staged files (files, SQL): staging is never table data."""
    return False


def remove_attempts_fenced(
    attempts: Iterable[Attempt],
    *,
    up_to: int,
    fence: Callable[[], None],
    referenced: Callable[[str | None], bool],
    delete: Callable[[str], bool],
    wanted: Callable[[int, str | None], bool] | None = None,
) -> list[str]:
    """Delete the staged attempts of one version, each fenced and checked against the target now.

    ``attempts``: the candidates (listed by the caller). ``up_to``: the
    highest attempt number of the cleaning version. ``fence()``: raises
    :class:`CleanupFencedError` (or any :class:`FencedError`) when the row
    moved on. ``referenced(id)``: whether the target's current state
    references the attempt (it stays). ``delete(location)``: removes one
    attempt directory, True if something was removed. ``wanted``: a further
    filter of the caller (GC's age rules), asked before the fence.

    Returns the locations removed. Raises what ``fence`` raises (the
    locations removed before it are gone; the rest stay). Safe to repeat.
    """
    removed: list[str] = []
    for number, attempt_id, location in attempts:
        if number > up_to:
            continue  # a later run's attempt (a reprocess, a new write after an abort)
        if wanted is not None and not wanted(number, attempt_id):
            continue
        crashpoint("cleanup.before_delete")
        fence()
        if referenced(attempt_id):
            continue
        if delete(location):
            removed.append(location)
    return removed


def remove_staged_attempts(
    layout: StagingLayout,
    pipeline: str,
    checkpoint_key: str,
    *,
    up_to: int,
    fence: Callable[[], None],
    referenced: Callable[[str | None], bool] = never_referenced,
    wanted: Callable[[int, str | None], bool] | None = None,
) -> list[str]:
    """:func:`remove_attempts_fenced` over a local staging layout's attempt directories of one
    checkpoint; then its directory, if that emptied it (an attempt that appears meanwhile stays,
    and so does the directory). Returns the attempt directory names removed."""
    # Attempt numbers start at 1: an ``attempt-0`` directory is not walsink's to delete.
    attempts = [(n, i, str(p)) for n, i, p in layout.staged_attempts(pipeline, checkpoint_key) if n >= 1]
    numbered = {location: (n, i) for n, i, location in attempts}

    def delete(location: str) -> bool:
        number, attempt_id = numbered[location]
        return layout.remove_attempt(pipeline, checkpoint_key, number, attempt_id)

    removed = remove_attempts_fenced(
        attempts, up_to=up_to, fence=fence, referenced=referenced, delete=delete, wanted=wanted
    )
    try:
        layout.checkpoint_dir(pipeline, checkpoint_key).rmdir()
    except OSError:
        pass  # not empty (an attempt kept, or a new one), or already gone
    return [Path(p).name for p in removed]
