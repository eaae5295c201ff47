"""The publisher contract (Flink's ``Committer``), one subclass of :class:`Publisher` per target kind.

The contract itself, with the numbered call sequence and every optional capability, is the
docstring of :class:`Publisher`; this module also holds what publishers and committers exchange
(:class:`StagedAttempt`, :class:`PublishResult`, :class:`GroupMember`, the contexts) and the rules
every target applies the same way (:func:`check_partition_order`, :func:`check_group`).
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Protocol, runtime_checkable

from airflow_provider_walsink.core.protocol.errors import LayoutError, OrderError
from airflow_provider_walsink.core.protocol.manifest import Manifest
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
    def uri(self) -> str:
        """The attempt as other tools name it: an absolute local path, or ``s3://bucket/...``."""
        return self.location.uri.rstrip("/")

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
        if self.store.layout is None:
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
    #: ``core/commit/tablefence.py``): with ``ctx.fencing == "table"`` it refuses a
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


class Publisher:
    """Makes one sealed attempt of one checkpoint visible in a target, exactly once.

    One subclass per target kind (a directory of files, an Iceberg or Delta table, a SQL
    table); the registry builds it (:mod:`.registry`). Every capability a target may offer is
    declared here. A class attribute states a fact about the target; an **optional method is
    ``None`` here**, meaning "not offered": a target offers it by defining the method, and a
    caller asks ``publisher.<name> is not None`` (never probes with ``getattr``). walsink calls,
    in this order, as Spark's ``FileCommitProtocol`` numbers its calls (the write task step 1,
    the committer, :mod:`~airflow_provider_walsink.core.commit.commit`, steps 2-4):

    0. **Build**: ``from_uri(uri, options)`` (a class method; the registry calls it with its
       ``TargetOptions``), or the user passes a publisher object.
    1. **Plan and check**, before the write phase (the write task). ``check_writable()``
       (optional) refuses a target this process could not publish into, so the commit does not
       fail after the Spark job. ``staging_root()`` (optional) names where the write phase must
       stage, for a target that references staged files in place (a table stages inside its own
       location); ``None`` or not offered: the connection's staging root.
    2. **Publish**, under the checkpoint's lease: ``publish(manifest, attempt, ctx)``.
       ``attempt`` says where the sealed attempt is staged: a :class:`StagedAttempt` when the
       target declares ``takes_staged_attempt`` (the table targets, on a local or an
       object-store root), else the attempt's local directory (a ``Path``: such a target cannot
       publish from an object store). It may be called any number of times for the same sealed
       attempt, by the same or another committer, after a crash at any point: every step
       already done is recognised **by the attempt's identity** (``manifest.attempt_id``,
       globally unique, plus checksums where the target keeps them), never by a file's size or
       by ``(pipeline, key, attempt number)``, which repeat once retention has trimmed the
       committer table. Before changing the target it checks that everything can be published
       (committables staged with the recorded size, the layout the pipeline declares, no
       symlink where a directory must be); if not, it raises a
       :class:`~airflow_provider_walsink.core.protocol.errors.WalsinkError` subclass and the
       target is unchanged. **Before every side effect** (a rename, a delete, a journal write, a
       table commit) it calls ``ctx.fence()``, which raises
       :class:`~airflow_provider_walsink.core.protocol.errors.FencedError` once the lease has
       moved on; a target with its own atomic commit also carries ``ctx.epoch`` (the fencing
       token) into that commit and refuses a commit whose token is lower than one the target
       already holds for the checkpoint. A publish of a newer attempt of the same checkpoint
       first retracts what an older attempt had published (asking ``ctx.fence()`` first).
       **Reprocess**: when ``ctx.supersedes`` names an attempt id, this publish is a new version
       of a checkpoint whose committed version is that attempt; it also retracts that attempt's
       data, in the same atomic step where the target has one, so the interval ends up holding
       the new version only. A target that cannot do this for its mode raises
       :class:`~airflow_provider_walsink.core.protocol.errors.SupersedeError` before changing
       anything.
       ``publish_group(members)`` (optional, :class:`GroupPublisher` states its contract)
       publishes several checkpoints in one table transaction, each as a single ``publish``
       would (Flink's ``IcebergFilesCommitter`` committing every pending checkpoint at once).
    3. The committer records COMMITTED in the committer table.
    4. **Finish**: ``finish(manifest, layout, fence=...)`` drops the target's own bookkeeping
       and the staging the target does not reference (best effort, after COMMITTED; ``fence()``
       before each deletion). ``layout`` is the ``StagingStore`` the attempt was staged in
       (deletions go through that store only).
       Not offered (the default): the staging stays for garbage collection.
    5. **Abort and retract**, instead of 3-4 (:mod:`~airflow_provider_walsink.core.commit.abort`):
       ``retract_attempt(pipeline, checkpoint_key, attempt_id, ctx)`` (optional; a target
       without an atomic commit) undoes what an aborted attempt published, ``ctx.fence()``
       before each change, and returns the number of files removed;
       ``tombstone(ref, attempt_ids, superseded=..., create_from=...)`` (optional; targets with
       ``capabilities.table_fence``) commits an abort's tombstone in the table's own atomic
       commit, or returns the attempt the table holds (then the abort is refused).

    **Ask the target** (reconcile after a crash, or after the committer table's rows were
    trimmed or lost; any time, changing nothing):

    * ``published_attempt(manifest)``: which attempt of the checkpoint the target holds, or
      ``None`` (none, or a target that keeps no such record: the default);
    * ``published_offsets(manifest, attempt_id)`` (optional): the source offsets
      ``(start, end)`` that attempt was published from, ``None`` when unknown;
    * ``holds_attempt(manifest)`` (optional): whether the target holds or held the manifest's
      attempt, i.e. may reference its staged files (not offered: assume it may);
    * ``fence_state(ref, ...)`` (optional): the attempt the table holds for a checkpoint
      (``_tables.CheckpointRef``) and which candidates it aborted or held
      (``_tables.TableFenceState``).

    Raises, for every method: ``FencedError`` (stop, do nothing more; safe to ignore for the
    target, which is consistent), a ``WalsinkError`` naming bad input or layout (the checkpoint
    is recorded FAILED with that message and can be retried after the cause is fixed),
    ``OSError`` and the table libraries' own errors (recorded the same way). Repeating any call
    is safe.

    **A new kind**: one module with one subclass (setting ``kind`` and ``publish``, and
    ``from_uri`` to be built from a URI) and one line in :data:`.registry.KNOWN_TARGETS`.
    """

    #: The URI scheme or name of the target kind (``file``, ``iceberg``, ``delta``, ``sql``); required.
    kind: ClassVar[str]
    #: What the target guarantees on its own (default: nothing beyond this contract).
    capabilities: ClassVar[TargetCapabilities] = TargetCapabilities(
        atomic=False, needs_rename=False, remembers_commits=False, fenced_by_target=False
    )
    #: The target references staged files in place (table targets): GC must never remove a
    #: committed attempt's staging (``gc.py``), an abort only what the target never held.
    references_staged_files: ClassVar[bool] = False
    #: ``publish`` takes a :class:`StagedAttempt` (any store); without it, the attempt's local ``Path``.
    takes_staged_attempt: ClassVar[bool] = False

    # Optional capabilities: ``None`` is "not offered" (class docstring). Typed loosely where a
    # signature names a type of ``._tables``, which imports this module.
    #: 1. ``check_writable() -> None``: refuse, before the write phase, a target this process cannot publish into.
    check_writable: Callable[..., None] | None = None
    #: 1. ``staging_root() -> str | None``: where the write phase stages for this target (``None``: the connection's).
    staging_root: Callable[[], str | None] | None = None
    #: 2. ``publish_group(members) -> [PublishResult | Exception]``: :class:`GroupPublisher`.
    publish_group: Callable[[list[GroupMember]], list[PublishResult | Exception]] | None = None
    #: ``published_offsets(manifest, attempt_id) -> (start, end) | None``.
    published_offsets: Callable[[Manifest, str], tuple[Any, Any] | None] | None = None
    #: ``holds_attempt(manifest) -> bool``.
    holds_attempt: Callable[[Manifest], bool] | None = None
    #: ``fence_state(ref, ...) -> TableFenceState``.
    fence_state: Callable[..., Any] | None = None
    #: 5. ``retract_attempt(pipeline, checkpoint_key, attempt_id, ctx) -> int`` (files removed).
    retract_attempt: Callable[[str, str, str, PublisherContext], int] | None = None
    #: 5. ``tombstone(ref, attempt_ids, *, superseded, create_from) -> str | None`` (the attempt held).
    tombstone: Callable[..., str | None] | None = None

    @classmethod
    def from_uri(cls, uri: str, options: Any) -> Publisher:
        """0. Build the publisher of ``uri`` with the registry's ``TargetOptions`` (the registry calls it)."""
        raise NotImplementedError(f"target kind {cls.__name__} cannot be built from a URI ({uri!r})")

    def publish(
        self, manifest: Manifest, attempt: StagedAttempt | Path, ctx: PublisherContext
    ) -> PublishResult:
        """2. Make the sealed attempt visible in the target, exactly once (class docstring); required."""
        raise NotImplementedError(f"{type(self).__name__} does not define publish()")

    def published_attempt(self, manifest: Manifest) -> str | None:
        """The attempt of the manifest's checkpoint the target holds; ``None``: none, or not recorded."""
        return None

    def finish(
        self,
        manifest: Manifest,
        layout: StagingStore | None = None,
        *,
        fence: Callable[[], None] | None = None,
    ) -> Any:
        """4. After COMMITTED, best effort: drop bookkeeping and unreferenced staging (default: nothing)."""
        return None

    def describe(self) -> str:
        """A one-line, credential-free description of the target for logs and the UI."""
        return f"{type(self).__name__} target"


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
