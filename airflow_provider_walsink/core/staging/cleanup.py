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

import contextlib
import logging
import os
from collections.abc import Callable, Iterable
from pathlib import Path
from urllib.parse import urlsplit

from airflow_provider_walsink.core.faults import crashpoint
from airflow_provider_walsink.core.protocol.errors import FencedError, PathEscapeError
from airflow_provider_walsink.core.protocol.identifiers import validate_identifier
from airflow_provider_walsink.core.staging.layout import StagingLayout, attempt_of
from airflow_provider_walsink.core.staging.object_store import (
    AttemptLocation,
    StagingStore,
    StagingStoreError,
)

log = logging.getLogger(__name__)

#: One staged attempt: (number, attempt id or None, location).
Attempt = tuple[int, "str | None", str]

#: Opens an object-store staging root with the caller's storage options (credentials):
#: ``stores(root_uri) -> StagingStore``. The Airflow faces pass one built from a connection;
#: the default, :meth:`StagingStore.open` without options, uses the default credential chain.
StoreOpener = Callable[[str], StagingStore]


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


def is_object_store(root: str | os.PathLike[str]) -> bool:
    """Whether a staging root (a path, ``file://`` or another URI) is on an object store."""
    text = os.fspath(root)
    return "://" in text and urlsplit(text).scheme.lower() != "file"


def open_object_store(root: str, stores: StoreOpener | None = None) -> StagingStore:
    """Open an object-store staging root for a clean-up, refusing one that is not a plain prefix.

    A root is where every deletion is confined, so it must name one place:
    a bucket (or container) and a prefix of non-empty segments, none ``.``
    or ``..`` (object keys are not normalised: ``s3://b/staging/../x`` is a
    key prefix of its own, not ``s3://b/x``, and no tool should be trusted to
    read it either way). ``stores`` opens it with the caller's options; the
    store it returns must be the root asked for.

    Raises :class:`PathEscapeError` (a root that is not a plain prefix, or a
    store for another root) and :class:`StagingStoreError` (cannot be opened).
    """
    parts = urlsplit(root)
    prefix = parts.path.strip("/")
    segments = prefix.split("/") if prefix else []
    if not parts.netloc or "\x00" in root or "\\" in root or any(s in ("", ".", "..") for s in segments):
        raise PathEscapeError(
            f"staging root {root!r} is not a bucket and a plain prefix (an empty, '.' or '..' segment); "
            "walsink deletes nothing under it"
        )
    store = (stores or StagingStore.open)(root)
    # As StagingStore.open builds the base: ``bucket/prefix`` (abfs: ``container/prefix``).
    bucket = parts.netloc.partition("@")[0] if store.kind == "abfs" else parts.netloc
    expected = f"{bucket}/{prefix}".rstrip("/")
    if store.layout is not None or store.base != expected:
        raise PathEscapeError(
            f"the store opened for staging root {root!r} is {store.root_uri!r} ({store.base}); refusing to "
            "delete anything through it"
        )
    return store


def staged_locations(store: StagingStore, pipeline: str, checkpoint_key: str) -> list[AttemptLocation]:
    """The attempts of one checkpoint on any store, in order: a local root's directories
    (:meth:`StagingLayout.staged_attempts`), an object store's one listing (:func:`store_attempts`)."""
    if store.layout is None:
        return store_attempts(store, pipeline, checkpoint_key)
    return [
        AttemptLocation(pipeline, checkpoint_key, n, i, str(p), str(p))
        for n, i, p in store.layout.staged_attempts(pipeline, checkpoint_key)
    ]


def store_attempts(store: StagingStore, pipeline: str, checkpoint_key: str) -> list[AttemptLocation]:
    """The attempts of one checkpoint staged on an object store, from one listing, in order.

    Only prefixes walsink names (``attempt-<n>`` or ``attempt-<n>-<32 hex>``,
    n >= 1) directly under ``<root>/<pipeline>/<checkpoint>/``; any other
    object or prefix there is not an attempt and never listed.
    """
    validate_identifier(pipeline, "pipeline id")
    validate_identifier(checkpoint_key, "checkpoint key")
    cdir = f"{store.base}/{pipeline}/{checkpoint_key}"
    found = []
    for name in store.child_dirs(cdir):  # the prefixes directly under the checkpoint, by name
        named = attempt_of(name)
        if named is None or named[0] < 1 or "/" in name:
            continue
        uri = f"{store.root_uri.rstrip('/')}/{pipeline}/{checkpoint_key}/{name}"
        found.append(AttemptLocation(pipeline, checkpoint_key, named[0], named[1], f"{cdir}/{name}", uri))
    return sorted(found, key=lambda loc: (loc.attempt, loc.attempt_id or ""))


def remove_staged_attempts(
    layout: StagingLayout | StagingStore,
    pipeline: str,
    checkpoint_key: str,
    *,
    up_to: int,
    fence: Callable[[], None],
    referenced: Callable[[str | None], bool] = never_referenced,
    wanted: Callable[[int, str | None], bool] | None = None,
) -> list[str]:
    """:func:`remove_attempts_fenced` over the attempts of one checkpoint; returns their names removed.

    ``layout``: a local :class:`StagingLayout` (or a local :class:`StagingStore`):
    attempt directories, then the checkpoint's directory if that emptied it (an
    attempt that appears meanwhile stays, and so does the directory). Or an
    object-store :class:`StagingStore` (open it with :func:`open_object_store`):
    the attempt prefixes it lists (:func:`store_attempts`), each deleted by
    :meth:`StagingStore.remove_attempt` (only a location it builds itself);
    a prefix has no directory to remove once its objects are gone.
    """
    if isinstance(layout, StagingStore):
        if layout.layout is not None:
            layout = layout.layout
        else:
            return _remove_store_attempts(
                layout,
                pipeline,
                checkpoint_key,
                up_to=up_to,
                fence=fence,
                referenced=referenced,
                wanted=wanted,
            )
    # Attempt numbers start at 1: an ``attempt-0`` directory is not walsink's to delete.
    attempts = [(n, i, str(p)) for n, i, p in layout.staged_attempts(pipeline, checkpoint_key) if n >= 1]
    numbered = {location: (n, i) for n, i, location in attempts}

    def delete(location: str) -> bool:
        number, attempt_id = numbered[location]
        return layout.remove_attempt(pipeline, checkpoint_key, number, attempt_id)

    removed = remove_attempts_fenced(
        attempts, up_to=up_to, fence=fence, referenced=referenced, delete=delete, wanted=wanted
    )
    with contextlib.suppress(OSError):  # not empty (an attempt kept, or a new one), or already gone
        layout.checkpoint_dir(pipeline, checkpoint_key).rmdir()
    return [Path(p).name for p in removed]


def _remove_store_attempts(
    store: StagingStore,
    pipeline: str,
    checkpoint_key: str,
    *,
    up_to: int,
    fence: Callable[[], None],
    referenced: Callable[[str | None], bool],
    wanted: Callable[[int, str | None], bool] | None,
) -> list[str]:
    """:func:`remove_staged_attempts` on an object store."""
    located = {loc.path: loc for loc in store_attempts(store, pipeline, checkpoint_key)}

    def delete(path: str) -> bool:
        try:
            return store.remove_attempt(located[path])
        except PathEscapeError as exc:
            # The store refuses a location it would not build itself (an unnumbered name beside a
            # named attempt of that number): left in place, never deleted by guess.
            log.warning("clean-up left %s: %s", located[path].uri, exc)
            return False
        except OSError as exc:  # the store's own error, naming the attempt
            raise StagingStoreError(f"deleting {located[path].uri} failed: {exc}") from exc

    removed = remove_attempts_fenced(
        [(loc.attempt, loc.attempt_id, path) for path, loc in located.items()],
        up_to=up_to,
        fence=fence,
        referenced=referenced,
        delete=delete,
        wanted=wanted,
    )
    return [path.rsplit("/", 1)[-1] for path in removed]
