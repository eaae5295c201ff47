"""Rolling back and retracting a file target's attempts from their publish journals: the files
of another attempt of the same checkpoint, a superseded attempt, a whole attempt on request.
"""

from __future__ import annotations

import contextlib
import json
import os
from typing import Any

from airflow_provider_walsink.core.protocol.errors import CommittableError, LayoutError, PathEscapeError
from airflow_provider_walsink.core.protocol.manifest import Manifest, write_atomic
from airflow_provider_walsink.core.staging.layout import confine
from airflow_provider_walsink.core.targets.base import PublisherContext, PublishResult
from airflow_provider_walsink.core.targets.files import fsops  # called as fsops.X: one place to replace them
from airflow_provider_walsink.core.targets.files.fsops import _DirFds, _remove_empty_dirs
from airflow_provider_walsink.core.targets.files.spec import BOOKKEEPING_DIR, MARKER_NAME


class Retraction:
    """The retraction half of :class:`~airflow_provider_walsink.core.targets.files.FilePublisher`
    (a mixin: it uses the publisher's ``target_root``, journal paths and markers)."""

    def _retract_superseded(self, manifest: Manifest, superseded: str, ctx: PublisherContext) -> int:
        """Reprocess, second phase: remove the superseded version's files wherever they still are.

        Runs after the new version is in place (``append``: a reader listing in
        between sees both versions; a crash in between is finished by the
        re-run, which repeats this). Only files whose name carries the
        superseded attempt's id, and partition markers naming it, are removed;
        nothing is followed through a symlink. In ``overwrite`` the partition
        swap already removed them from every partition the new version covers;
        this clears partitions it no longer covers.
        """
        prefix = f"{manifest.checkpoint_key}-{superseded}-"
        removed = 0
        with _DirFds(self.target_root) as dirs:
            pending = [""]
            while pending:
                relative = pending.pop()
                fd = dirs.open(relative)
                with os.scandir(fd) as entries:
                    names = [
                        (e.name, e.is_dir(follow_symlinks=False), e.is_file(follow_symlinks=False))
                        for e in entries
                    ]
                for name, is_dir, is_file in names:
                    child = f"{relative}/{name}" if relative else name
                    if is_dir and child != BOOKKEEPING_DIR:
                        pending.append(child)
                    elif is_file and (
                        name.startswith(prefix)
                        or (
                            name == MARKER_NAME
                            and (self._live_marker(relative) or {}).get("attempt_id") == superseded
                        )
                    ):
                        ctx.fence()
                        try:
                            os.unlink(name, dir_fd=fd)
                        except FileNotFoundError:
                            continue
                        removed += name != MARKER_NAME
                        ctx.event("publish.after_retract")
            dirs.fsync_all()
        return removed

    def _roll_back_other_attempts(
        self, manifest: Manifest, plan: list, result: PublishResult, ctx: PublisherContext
    ) -> None:
        """Write the publish journal; first undo what another attempt of this checkpoint published.

        Files are removed only if their name carries the other attempt's id:
        the journal can never make this delete a file of another attempt.
        """
        journal_path = self._target(self._journal_rel(manifest))
        try:
            previous = json.loads(journal_path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            previous = None
        except json.JSONDecodeError as exc:
            raise CommittableError(f"publish journal {journal_path} is not valid JSON ({exc})") from None
        previous_id = previous.get("attempt_id") if isinstance(previous, dict) else None
        if previous is not None and previous_id != manifest.attempt_id:
            ctx.fence()
            if self.mode == "append" and previous_id:
                # Also what an aborted attempt had published, if its abort did not finish.
                self._unlink_journal_files(previous, previous_id, result)
            # Overwrite: the partition swap replaces whatever is live; only the
            # other attempt's pending directory is garbage.
            if previous_id:
                with _DirFds(self.target_root) as dirs:
                    dirs.rmtree(f"{self._pending_rel(manifest)}/{previous_id}")
        if previous is None or previous_id != manifest.attempt_id:
            ctx.fence()
            journal_path.parent.mkdir(parents=True, exist_ok=True)
            files = [self._relative(dest) for _c, _s, dest, _t in plan]
            write_atomic(
                journal_path,
                json.dumps(
                    {
                        "pipeline": manifest.pipeline,
                        "checkpoint": manifest.checkpoint_key,
                        "attempt": manifest.attempt,
                        "attempt_id": manifest.attempt_id,
                        "epoch": ctx.epoch,
                        "mode": self.mode,
                        "files": files if self.mode == "append" else [],
                        "partitions": manifest.replaced_partitions() if self.mode == "overwrite" else [],
                    },
                    sort_keys=True,
                ).encode(),
            )

    def retract_attempt(
        self, pipeline: str, checkpoint_key: str, attempt_id: str, ctx: PublisherContext
    ) -> int:
        """Undo what ``attempt_id`` published of the checkpoint (an abort: it will never commit).

        Acts only if the publish journal names ``attempt_id``: a journal that
        names another attempt means a later publish already rolled this one
        back, or this one never started publishing. ``append``: the journal's
        files whose names carry the attempt id are removed. ``overwrite``:
        each partition whose live marker names the attempt is swapped back
        with the partition it replaced (kept in the attempt's pending
        directory), or moved out where there was none; then the attempt's
        pending directory is deleted. The journal stays (a later publish of
        the checkpoint repeats this harmlessly; ``finish`` removes it).
        ``ctx.fence()`` precedes every change. Returns the number of data
        files removed from the target. Repeating it is safe.
        """
        journal_path = self._target(f"{BOOKKEEPING_DIR}/journal/{pipeline}/{checkpoint_key}.json")
        try:
            journal = json.loads(journal_path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return 0
        except json.JSONDecodeError as exc:
            raise CommittableError(f"publish journal {journal_path} is not valid JSON ({exc})") from None
        if not isinstance(journal, dict) or journal.get("attempt_id") != attempt_id:
            return 0
        removed = 0
        if journal.get("mode") == "append":
            result = PublishResult()
            ctx.fence()
            self._unlink_journal_files(journal, attempt_id, result)
            removed = result.files_rolled_back
        pending_rel = f"{BOOKKEEPING_DIR}/pending/{pipeline}/{checkpoint_key}/{attempt_id}"
        with _DirFds(self.target_root) as dirs:
            for partition in journal.get("partitions") or []:
                if not isinstance(partition, str) or not partition:
                    continue
                self._target(partition)  # confined: a journal entry cannot point outside the target
                if (self._live_marker(partition) or {}).get("attempt_id") != attempt_id:
                    continue  # not swapped in (or replaced since): the live partition is not this attempt's
                removed += sum(
                    1
                    for n in os.listdir(self._target(partition))
                    if n != MARKER_NAME and not n.startswith(".")
                )
                live_parent, live_name = partition.rpartition("/")[::2]
                pending_parent, pending_name = f"{pending_rel}/{partition}".rpartition("/")[::2]
                pending_fd = dirs.open(pending_parent, create=True)
                ctx.fence()
                try:
                    os.stat(pending_name, dir_fd=pending_fd, follow_symlinks=False)
                    had_old = True
                except FileNotFoundError:
                    had_old = False
                if had_old:  # the partition this attempt replaced: swap it back in
                    fsops._swap_in(pending_fd, pending_name, dirs.open(live_parent), live_name)
                else:  # there was none: move this attempt's partition out of sight
                    os.rename(
                        live_name, pending_name, src_dir_fd=dirs.open(live_parent), dst_dir_fd=pending_fd
                    )
                    os.fsync(pending_fd)
                ctx.event("abort.after_swap_back")
            for partition in journal.get("partitions") or []:
                if isinstance(partition, str) and partition:
                    self._remove_own_pending(dirs, f"{pending_rel}/{partition}", attempt_id, ctx)
            _remove_empty_dirs(dirs, pending_rel)
        return removed

    def _remove_own_pending(
        self, dirs: _DirFds, relative: str, attempt_id: str, ctx: PublisherContext
    ) -> None:
        """Delete a pending partition of ``attempt_id`` only if it holds that attempt's files alone.

        A racing publish may swap a live partition (another checkpoint's committed
        rows) into this very name at any moment, so the directory is first renamed
        aside (after which no swap can reach it) and only then identified: by its
        marker naming the attempt, or, before the marker was written, by every
        file name carrying the attempt id. Anything else is renamed back and
        reported (:class:`LayoutError`): the rollback never deletes another
        checkpoint's data.
        """
        parent, _, name = relative.rpartition("/")
        try:
            parent_fd = dirs.open(parent)
        except FileNotFoundError:
            return
        aside = f".{name}.retract-{attempt_id}"
        ctx.fence()
        try:
            os.rename(name, aside, src_dir_fd=parent_fd, dst_dir_fd=parent_fd)
        except FileNotFoundError:
            aside_there = True
            try:
                os.stat(aside, dir_fd=parent_fd, follow_symlinks=False)
            except FileNotFoundError:
                aside_there = False
            if not aside_there:
                return  # nothing pending (an earlier run of this rollback finished it)
        moved = f"{parent}/{aside}" if parent else aside
        if self._only_attempt(dirs, moved, attempt_id):
            dirs.rmtree(moved)
            return
        os.rename(aside, name, src_dir_fd=parent_fd, dst_dir_fd=parent_fd)
        raise LayoutError(
            f"pending partition {relative} under {self.target_root} holds data that is not attempt "
            f"{attempt_id}'s (a partition another publish swapped out); the rollback left it in place. "
            "Check which checkpoint it belongs to before removing it"
        )

    def _only_attempt(self, dirs: _DirFds, relative: str, attempt_id: str) -> bool:
        """The directory holds ``attempt_id``'s partition: its marker names it, or no marker and
        every data file's name carries the id."""
        fd = dirs.open(relative)
        try:
            mfd = os.open(MARKER_NAME, os.O_RDONLY | os.O_NOFOLLOW, dir_fd=fd)
        except FileNotFoundError:
            mfd = None
        if mfd is not None:
            with os.fdopen(mfd, encoding="utf-8") as f:
                try:
                    marker = json.loads(f.read())
                except json.JSONDecodeError:
                    return False
            return isinstance(marker, dict) and marker.get("attempt_id") == attempt_id
        with os.scandir(fd) as entries:
            for entry in entries:
                if entry.name.startswith("."):
                    continue  # a temporary file of an interrupted marker write
                if entry.is_dir(follow_symlinks=False):
                    if not self._only_attempt(dirs, f"{relative}/{entry.name}", attempt_id):
                        return False
                elif f"-{attempt_id}-" not in entry.name:
                    return False
        return True

    def _unlink_journal_files(self, journal: dict[str, Any], attempt_id: str, result: PublishResult) -> None:
        """Remove the journal's files whose names carry ``attempt_id`` (never another attempt's)."""
        for rel in journal.get("files", []):
            if not isinstance(rel, str) or f"-{attempt_id}-" not in rel.rpartition("/")[2]:
                continue
            with contextlib.suppress(FileNotFoundError, PathEscapeError):
                os.unlink(confine(self.target_root, rel, what="journal entry"))
                result.files_rolled_back += 1
