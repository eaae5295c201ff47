"""The publisher contract (Flink's ``Committer.commit``), one per target kind.

A *publisher* makes one sealed attempt of one checkpoint visible in a target
(a directory of files, an Iceberg or Delta table, a SQL table), exactly once.
The committer (``committer/commit.py``) calls it in this order, as Spark's
``FileCommitProtocol`` numbers its calls:

1. ``publish(manifest, attempt, ctx)``, under the checkpoint's lease. ``attempt``
   says where the sealed attempt is staged: a :class:`StagedAttempt` for
   publishers that declare ``takes_staged_attempt`` (the table targets, on a
   local or an object-store root), else the attempt's local directory (a
   ``Path``: such a publisher cannot publish from an object store). It
   may be called any number of times for the same sealed attempt, by the same
   or another committer, after a crash at any point: every step already done
   is recognised **by the attempt's identity** (``manifest.attempt_id``,
   globally unique, plus checksums where the target keeps them), never by a
   file's size or by ``(pipeline, key, attempt number)``, which repeat once
   retention has trimmed the committer table. Before changing the target it
   checks that everything can be published (committables staged with the
   recorded size, the layout the pipeline declares, no symlink where a
   directory must be); if not, it raises a
   :class:`~airflow_provider_walsink.core.protocol.errors.WalsinkError` subclass
   and the target is unchanged. **Before every side effect** (a rename, a
   delete, a journal write, a table commit) it calls ``ctx.fence()``, which
   raises :class:`~airflow_provider_walsink.core.protocol.errors.FencedError` once
   the lease has moved on; a target with its own atomic commit also carries
   ``ctx.epoch`` (the fencing token) into that commit and refuses a commit
   whose token is lower than one the target already holds for the checkpoint.
   A publish of a newer attempt of the same checkpoint first retracts what an
   older attempt had published (ask ``ctx.fence()`` first).
   **Reprocess**: when ``ctx.supersedes`` names an attempt id, this publish is
   a new version of a checkpoint whose committed version is that attempt; the
   publish also retracts that attempt's data, in the same atomic step where
   the target has one, so the interval ends up holding the new version only.
   A target that cannot do this for its mode raises
   :class:`~airflow_provider_walsink.core.protocol.errors.SupersedeError` before
   changing anything.
2. The committer records COMMITTED in the committer table.
3. ``finish(manifest, layout)``: drop the publisher's own bookkeeping and the
   staging the target does not reference (best effort, after COMMITTED).
   ``layout`` is the local :class:`StagingLayout`, or the ``StagingStore`` of an
   object-store root (deletions then go through that store only).

``published_attempt(manifest)`` answers, from the target alone, whether the
target already holds an attempt of this checkpoint and which one: it lets a
committer reconcile the committer table after a crash or after its rows were
trimmed or lost. Targets that keep no such record return ``None``.

Raises, for every method: ``FencedError`` (stop, do nothing more; safe to
ignore for the target, which is consistent), a ``WalsinkError`` naming bad
input or layout (the checkpoint is recorded FAILED with that message and can
be retried after the cause is fixed), ``OSError`` and the table libraries'
own errors (recorded the same way). Repeating any call is safe.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Protocol, runtime_checkable

from airflow_provider_walsink.core.protocol.errors import LayoutError, OrderError
from airflow_provider_walsink.core.protocol.manifest import Manifest
from airflow_provider_walsink.core.staging.layout import StagingLayout
from airflow_provider_walsink.core.staging.object_store import AttemptLocation, StagingStore, check_segments


class PublishOutcome(enum.StrEnum):
    """What a ``publish`` call found and did (Flink's commit-request signals)."""

    #: This call made (the rest of) the attempt visible.
    PUBLISHED = "PUBLISHED"
    #: The target already held exactly this attempt: nothing was changed.
    ALREADY_PUBLISHED = "ALREADY_PUBLISHED"


@dataclass
class PublishResult:
    """What one ``publish`` call did; a re-run after a full publish reports only ``already``."""

    outcome: PublishOutcome = PublishOutcome.PUBLISHED
    published: int = 0
    already: int = 0
    partitions_replaced: list[str] = field(default_factory=list)
    files_rolled_back: int = 0
    #: Where the committables now are, relative to the target (files) or as the
    #: table references them (table targets).
    target_files: list[str] = field(default_factory=list)
    #: The table version that holds the attempt (Iceberg snapshot id, Delta
    #: version, SQL marker id), for the committer table and the UI.
    snapshot: str | None = None
    rows: int | None = None

    def __post_init__(self) -> None:
        if self.outcome is PublishOutcome.PUBLISHED and not self.published and self.already:
            self.outcome = PublishOutcome.ALREADY_PUBLISHED


#: What may make a manifest-relative path escape or alias another key, as substrings of the
#: paths joined one a line (``"\n" + ... + "\n"``): ``..`` or ``.`` segments, empty segments,
#: absolute or empty paths, a trailing slash, NUL, backslash. Only when one is present does
#: each path take the store's exact check (and its message).
_SUSPECT = (
    "/../",
    "/./",
    "//",
    "\n/",
    "/\n",
    "\n\n",
    "\n../",
    "\n./",
    "/..\n",
    "/.\n",
    "\n..\n",
    "\n.\n",
    "\x00",
    "\\",
)


@dataclass(frozen=True)
class StagedAttempt:
    """Where one sealed attempt is staged: the store that holds it and its location there.

    The one object a committer hands a publisher (``publish(manifest, attempt,
    ctx)``) instead of a local path, so the same publisher reads an attempt on a
    local disk or on an object store. The contract a publisher keeps with it:

    * every committable is named ``attempt.uri + "/" + relative`` (the attempt's
      local path on a local root, ``s3://bucket/...`` on S3) and reached only
      through ``attempt.store`` (its ``filesystem``), after the store's
      confinement check (:meth:`committable_uri`: no ``..``, absolute, empty or
      ``.`` segment; on a local root no symlink is followed, checked where the
      publisher reads or references the file);
    * sizes come from the store's metadata (``lstat``, HEAD, LIST), never by
      downloading a file; a publisher opens a file only where it must read a
      Parquet footer;
    * the committer built it from the checkpoint's recorded identifiers (never
      from a path a manifest or a row gives) and read the sealed manifest
      through the same store, so a table that references ``uri + "/" +
      relative`` references exactly the files the durability check verified.
    """

    store: StagingStore
    location: AttemptLocation

    @property
    def is_local(self) -> bool:
        return self.store.is_local

    @property
    def uri(self) -> str:
        """The attempt as other tools name it: an absolute local path, or ``s3://bucket/...``."""
        return self.location.path if self.store.is_local else self.location.uri.rstrip("/")

    def committable_uri(self, relative: str) -> str:
        """``uri/relative`` once ``relative`` passes the store's lexical confinement (``PathEscapeError``)."""
        return self.committable_uris([relative])[0]

    def committable_uris(self, relatives: Iterable[str]) -> list[str]:
        """:meth:`committable_uri` for the many files of one attempt (one regular expression per
        clean path; the store's own check, with its message, for any path the expression flags)."""
        relatives = list(relatives)
        # One scan of all paths (a line each; MULTILINE anchors per line): a 1,000-file commit
        # pays well under a millisecond for it.
        joined = "\n" + "\n".join(relatives) + "\n"
        if not relatives or any(s in joined for s in _SUSPECT):
            for relative in relatives:
                check_segments(relative, "committable", self.location.uri)
        base = self.uri + "/"
        return [base + relative for relative in relatives]

    def local_dir(self) -> Path:
        """The attempt's directory on a local root; ``LayoutError`` on an object store."""
        if not self.store.is_local:
            raise LayoutError(
                f"attempt {self.location.uri} is staged on an object store ({self.store.kind}://); this "
                "target publishes from a local staging root only (table targets reference the staged "
                "objects in place: use an Iceberg or Delta target on the same store)"
            )
        return Path(self.location.path)


@dataclass(frozen=True)
class TargetCapabilities:
    """What a target guarantees on its own; docs/targets.md tabulates them."""

    #: A commit becomes visible in one atomic step (a table commit, a SQL transaction).
    atomic: bool
    #: Publishing moves files by rename (needs a file system with atomic rename).
    needs_rename: bool
    #: The target records which checkpoint attempts it holds, so a commit stays
    #: exactly-once even if the committer table is trimmed, restored or lost.
    remembers_commits: bool
    #: The target's own commit refuses a fenced-out committer (``ctx.epoch``),
    #: closing the window between ``ctx.fence()`` and the side effect.
    fenced_by_target: bool
    #: The table's atomic commit can be the *only* fence (``fencing="table"``,
    #: ``committer/tablefence.py``): with ``ctx.fencing == "table"`` it refuses a
    #: second attempt of the same checkpoint version (first publication wins,
    #: by pipeline + checkpoint key, the marker checked in the state the commit
    #: is based on), and it can carry an abort's tombstone (``tombstone()``) in
    #: its own atomic commit, which every publish checks the same way.
    table_fence: bool = False


@runtime_checkable
class PublisherContext(Protocol):
    """Runtime services the committer passes to ``publish`` (Flink's ``CommitterInitContext``).

    ``epoch`` is the fencing token of the lease this publish runs under:
    strictly greater than the token of every earlier holder of the
    checkpoint. ``fence()`` raises ``FencedError`` unless the lease is still
    this committer's, and extends it (one conditional statement in the
    committer database; free when the lease was confirmed recently enough
    that nobody else can have taken it). ``event(name)`` marks a point of the
    protocol (fault-injection tests crash there). ``supersedes`` is the
    attempt id of the committed version a reprocess replaces (``None``: a
    first version); read it with ``getattr(ctx, "supersedes", None)``.
    """

    pipeline: str
    checkpoint_key: str
    attempt_id: str
    epoch: int
    supersedes: str | None

    def fence(self) -> None: ...

    def event(self, name: str) -> None: ...


@dataclass
class StaticContext:
    """A context for publishing outside a lease (tools, tests): never fenced."""

    pipeline: str
    checkpoint_key: str
    attempt_id: str
    epoch: int = 0
    on_event: Callable[[str], None] | None = None
    supersedes: str | None = None

    def fence(self) -> None:
        return None

    def event(self, name: str) -> None:
        if self.on_event is not None:
            self.on_event(name)

    @classmethod
    def for_manifest(cls, manifest: Manifest, **kwargs: Any) -> StaticContext:
        return cls(manifest.pipeline, manifest.checkpoint_key, manifest.attempt_id, **kwargs)


class Publisher(Protocol):
    """Makes a sealed attempt's committables visible in a target, exactly once (module docstring)."""

    #: The URI scheme or name of the target kind (``file``, ``iceberg``, ``delta``, ``sql``).
    kind: ClassVar[str]
    capabilities: ClassVar[TargetCapabilities]
    #: The target references staged files in place (table targets): GC must never
    #: remove a committed attempt's staging (``gc.py``).
    references_staged_files: ClassVar[bool]

    #: ``publish`` takes a :class:`StagedAttempt` (any store); without it, the attempt's local ``Path``.
    takes_staged_attempt: ClassVar[bool]

    def publish(
        self, manifest: Manifest, attempt: StagedAttempt | Path, ctx: PublisherContext
    ) -> PublishResult: ...

    def published_attempt(self, manifest: Manifest) -> str | None: ...

    def finish(self, manifest: Manifest, layout: StagingLayout | StagingStore) -> None: ...

    def describe(self) -> str:
        """A one-line, credential-free description of the target for logs and the UI."""
        ...


def check_partition_order(
    manifest: Manifest,
    partition: str,
    holder_pipeline: str | None,
    holder_checkpoint: str | None,
    *,
    allow_older: bool,
    target: str,
) -> None:
    """Invariant 10, one rule for every target: an ``overwrite`` never takes a partition back to an older checkpoint.

    ``holder_*`` name the checkpoint whose data the partition holds now, as the
    target records it (``None``: nothing walsink wrote, or another pipeline's).
    Checkpoint keys order as strings (the key format sorts by interval). The
    same key is never older: a retry, or a reprocess ``replace`` of the key that
    holds the partition, replaces it. Table targets call this on the table
    state their atomic commit is based on, so two racing committers cannot
    both pass it. Safe to repeat; changes nothing.

    Raises:
        OrderError: the partition holds a newer checkpoint of the same pipeline
            and ``allow_older`` (the commit task's ``allow_older_overwrite``) is off.
    """
    if (
        allow_older
        or holder_checkpoint is None
        or holder_pipeline != manifest.pipeline
        or holder_checkpoint <= manifest.checkpoint_key
    ):
        return
    raise OrderError(
        f"checkpoint {manifest.pipeline}/{manifest.checkpoint_key} would replace partition {partition!r} of "
        f"{target}, which holds the newer checkpoint {holder_checkpoint}: a late commit of an older checkpoint "
        "is refused (pass allow_older_overwrite=True to the commit task to roll the partition back on "
        "purpose); target left unchanged"
    )


@dataclass(frozen=True)
class GroupMember:
    """One checkpoint of a group commit: its sealed manifest, where it is staged, and its own lease's context."""

    manifest: Manifest
    attempt: StagedAttempt
    ctx: PublisherContext


@runtime_checkable
class GroupPublisher(Protocol):
    """A target that publishes several checkpoints in one table transaction (Flink's
    ``IcebergFilesCommitter`` committing every pending checkpoint in one snapshot).

    ``publish_group(members)`` answers each member in its slot of the returned list, in
    order: a :class:`PublishResult` (published by this call's one transaction, or
    already held, by the member's own marker) or the exception a single ``publish`` of
    that member would have raised (bad input, layout, order, schema, ``FencedError``).
    A member that fails its checks is left out of the transaction and never fails the
    others. Every member is checked by the marker rule on the table state the one
    commit is based on, exactly as a single ``publish``; the commit carries each
    member's own marker (attempt id, fencing token, file count, partition holders) as
    a single commit writes it, so every later ``publish``, ``published_attempt`` and
    reconcile of a member reads it as if it had been committed alone. ``ctx.fence()``
    of every member is asked before the commit; a member fenced out is left out.
    Callers pass ``overwrite`` members with disjoint partitions and no reprocess
    (``ctx.supersedes`` unset); anything else raises ``ValueError`` before the table is
    read. A commit that conflicts is retried with back-off and jitter on the reloaded
    table (members found published meanwhile become already held); a table that
    keeps changing raises :class:`~._tables.TableCommitConflict`, nothing published.
    ``members[0].ctx.event`` marks ``table.before_group_commit`` and
    ``table.after_group_commit``. Repeating the call is safe.
    """

    def publish_group(self, members: list[GroupMember]) -> list[PublishResult | Exception]: ...


def check_group(members: list[GroupMember], mode: str) -> None:
    """The caller's side of :class:`GroupPublisher`: ``overwrite``, no reprocess, disjoint partitions
    (``ValueError`` naming the problem; nothing read or changed)."""
    if mode != "overwrite":
        raise ValueError(f"a group commit publishes overwrite checkpoints only, not {mode}")
    seen: dict[str, str] = {}
    for m in members:
        if getattr(m.ctx, "supersedes", None):
            raise ValueError(
                f"{m.manifest.pipeline}/{m.manifest.checkpoint_key} is a reprocess: commit it alone"
            )
        for partition in m.manifest.replaced_partitions():
            if partition in seen:
                raise ValueError(
                    f"{m.manifest.checkpoint_key} and {seen[partition]} both replace partition {partition!r}: "
                    "commit them one after the other"
                )
            seen[partition] = m.manifest.checkpoint_key


def conflict_backoff(attempt: int, *, base: float = 0.02, cap: float = 1.0) -> float:
    """Seconds to wait before retry ``attempt`` (0-based) of a conflicting table commit: full jitter
    over an exponential bound, so committers that collided do not collide again in step."""
    import random

    return random.uniform(0, min(cap, base * 2**attempt))
