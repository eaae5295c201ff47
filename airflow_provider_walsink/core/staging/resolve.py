"""Where a checkpoint's attempts are staged: worked out here, and only here.

The committer table records the root the write phase used, on the checkpoint's
row (``walsink_checkpoint.staging_root``). Every reader (sensor and trigger,
audit, commit task, abort, UI, CLI) asks :func:`staging_for`, so the recorded
root wins everywhere alike and a checkpoint stays readable after the
connection's or the target's root changes. See docs/protocol.md, "Staging root".
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Protocol, TypeAlias

from airflow_provider_walsink.core.staging.cleanup import is_object_store
from airflow_provider_walsink.core.staging.layout import StagingLayout
from airflow_provider_walsink.core.staging.object_store import LocalStagingStore, StagingStore

Staging: TypeAlias = StagingLayout | StagingStore
#: Opens an object-store root with the caller's credentials (the hook's ``get_staging_store``).
StoreOpener: TypeAlias = Callable[[str], StagingStore]
Root: TypeAlias = str | os.PathLike[str]
#: The root of a row that records none: a root, an opened staging, or a function giving either
#: (called only then, so a costly derivation such as resolving a table target is skipped).
DefaultRoot: TypeAlias = Root | Staging | Callable[[], Root | Staging]


class RecordsStagingRoot(Protocol):
    """A checkpoint's row as far as staging goes (:class:`~..store.records.CheckpointRecord`)."""

    @property
    def staging_root(self) -> str | None: ...


def recorded_root(record: RecordsStagingRoot | None) -> str | None:
    """The root the checkpoint's row records, or ``None`` for a row written before walsink
    recorded roots (or no row). The write phase stages a new attempt there too."""
    recorded = record.staging_root if record is not None else None
    return recorded or None


def open_staging(root: Root, open_store: StoreOpener | None = None) -> Staging:
    """A staging root as the staging layer reads it.

    An object-store URI is opened by ``open_store`` (the credentials are the
    caller's: the core holds none); a local path is a :class:`StagingLayout`.
    Without ``open_store`` a URI root raises ``ValueError`` (the layout refuses
    it), as a reader that can only read local files must.
    """
    if open_store is not None and is_object_store(root):
        return open_store(os.fspath(root))
    return StagingLayout(root)


def staging_for(
    record: RecordsStagingRoot | None, default_root: DefaultRoot, open_store: StoreOpener | None = None
) -> Staging:
    """The staging a checkpoint's attempts are read from: the one resolve.

    The root recorded on the checkpoint's row always wins (that is where the
    write phase put the data). Only a row that records none (written before
    walsink recorded roots, or no row at all) falls back to ``default_root``.
    """
    recorded = recorded_root(record)
    if recorded is not None:
        return open_staging(recorded, open_store)
    default = default_root() if callable(default_root) else default_root
    if isinstance(default, StagingLayout | StagingStore):
        return default
    return open_staging(default, open_store)


def as_store(staging: Staging) -> StagingStore:
    """``staging`` as a store: a local :class:`StagingLayout` becomes the store that *is* it
    (:meth:`LocalStagingStore.of`); a store is itself. Readers call it once, at their edge."""
    return staging if isinstance(staging, StagingStore) else LocalStagingStore.of(staging)


def store_for(record: RecordsStagingRoot | None, staging: Staging | Callable[[], Staging]) -> StagingStore:
    """The store a reader given ``staging`` reads the checkpoint from: an opened store as given
    (opened by the caller, with its credentials, for the root it read from the row); a layout,
    or a function giving one, is resolved by the row (:func:`staging_for`: the recorded root wins)."""
    return staging if isinstance(staging, StagingStore) else as_store(staging_for(record, staging))


def local_layout(staging: Staging) -> StagingLayout | None:
    """The local layout ``staging`` reads through (a local store *is* its layout: same resolver,
    same symlink refusals), or ``None`` on an object store."""
    return staging.layout if isinstance(staging, StagingStore) else staging


def object_store_of(staging: Staging) -> StagingStore | None:
    """The object store ``staging`` is on, or ``None`` for a local root."""
    return staging if isinstance(staging, StagingStore) and staging.layout is None else None
