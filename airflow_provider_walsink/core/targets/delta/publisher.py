"""A Delta Lake table as a walsink target (deltalake), exactly once through the table's own commit.

``delta:///abs/path`` (local), ``delta+s3://bucket/path`` (S3-compatible:
``TargetOptions.extra["storage_options"]`` as deltalake takes them, or
``extra["conn_id"]``, a connection whose login/password are the access key
pair and whose extra may hold ``endpoint_url`` and ``region_name``), or
``delta+gs://bucket/path`` / ``delta+abfss://container@account.dfs.core.windows.net/path``
(``extra["conn_id"]`` required: a ``google_cloud_platform`` / ``wasb`` or ``adls`` connection,
read as a staging root's is: :mod:`.stores`).

**Commit = one table version.** The write phase stages Parquet files inside
the table directory (:meth:`DeltaPublisher.staging_root`:
``<table>/_walsink_staging``, skipped by readers and by ``VACUUM``'s orphan
scan because of the leading underscore). ``publish`` adds them by path (no
copy, no rename) in one commit; in ``overwrite`` the same commit removes the
files of the interval's partitions.

**The marker.** The commit carries two application transactions: app id
``walsink/<pipeline>/<key>`` and ``walsink/<pipeline>/<key>/<attempt id>``, both
at version = the fencing token (``ctx.epoch``: strictly increasing per lease
take of the checkpoint, so a later holder always commits a higher version),
plus commit metadata naming pipeline, checkpoint, attempt id and token. Both
lookups are ``transaction_version(app_id)``, answered from the table state the
library loads anyway (flat as history grows). deltalake does **not** enforce
transaction versions (committing the same or a lower version succeeds), so
walsink refuses itself: the checkpoint's version >= ours with another attempt
-> ``FencedError``; our attempt's version equal to the checkpoint's -> already
published. With ``ctx.supersedes`` (a reprocess) the marker may name the superseded
attempt (its own application transaction holds the checkpoint's version):
the same commit then removes its files (those staged under the checkpoint's
directory by another attempt) and adds the new ones.
A concurrent commit of the same app id is refused by the table's
conflict check (``CommitFailedError``): walsink then reloads and checks again,
and finds the winner's marker.
Every application transaction carries its commit time (``lastUpdated``), and a table
that expires them (``delta.setTransactionRetentionDuration``) is refused at every load
(:func:`.log.check_markers_kept`): a marker Delta dropped on its own would read as "never
published". The one exception is walsink's own bound (``table_markers``, opt-in,
:mod:`.markers`): walsink then expires a pipeline's oldest markers itself, after keeping them
in the committer database, and every lookup here reads them through
:class:`.markers.MarkedDeltaTable`.

**Order and retraction by identity.** ``walsink-files/<pipeline>/<key>/<attempt id>``
holds the number of files the attempt added: a reprocess in ``append``
retracts the superseded version only if all of them are still live
(``OPTIMIZE`` moved its rows into files with no attempt identity: refused,
:func:`._tables.check_retractable`). In ``overwrite`` each replaced partition
gets ``walsink-partition/<pipeline>/<partition>`` (and ``...#<key>``) at the
commit's own table version: a later commit of an older key over it is refused
(:func:`.base.check_partition_order`, invariant 10, holder read from that
version's ``commitInfo``), and a reprocess replaces every partition its
checkpoint holds.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable, Mapping, Sequence
from functools import partial
from typing import Any, ClassVar
from urllib.parse import urlsplit

from deltalake import DeltaTable, Transaction
from deltalake import Schema as DeltaSchema
from deltalake.exceptions import CommitFailedError, TableNotFoundError
from deltalake.transaction import AddAction, RemoveAction, create_table_with_add_actions

from airflow_provider_walsink.core.protocol.errors import NOTHING_DONE, TargetStateError
from airflow_provider_walsink.core.protocol.manifest import Manifest
from airflow_provider_walsink.core.protocol.modes import WriteMode
from airflow_provider_walsink.core.targets._reach import check_bucket, check_location, missing_credentials
from airflow_provider_walsink.core.targets._tables import (
    STAGING_DIR,
    CheckpointRef,
    Marker,
    S3Settings,
    StagedFile,
    Storage,
    TableCommitConflict,
    TableFenceState,
    call_with_events,
    checkpoint_location,
    decide,
    layout_root,
    local_path,
    offsets_of,
    staged_locations,
    staging_storage,
    superseded_attempt,
    table_fenced,
    uri_flags,
)
from airflow_provider_walsink.core.targets.archive import PropertyArchive, archive_bounds
from airflow_provider_walsink.core.targets.base import (
    Publisher,
    PublisherContext,
    PublishOutcome,
    PublishResult,
    StagedAttempt,
    TargetCapabilities,
)
from airflow_provider_walsink.core.targets.delta import stores
from airflow_provider_walsink.core.targets.delta.actions import DeltaActions, DeltaTargetError
from airflow_provider_walsink.core.targets.delta.group import DeltaGroupCommit
from airflow_provider_walsink.core.targets.delta.log import (
    ABORTED_TXN,
    MAX_COMMIT_ATTEMPTS,
    app_id,
    append_commit,
    check_markers_kept,
    commit_holders,
    commit_properties,
    held_version,
    history,
    is_bound,
    marker_transactions,
)
from airflow_provider_walsink.core.targets.delta.markers import MarkedDeltaTable, bound_table
from airflow_provider_walsink.core.targets.delta.tombstone import DeltaTombstone
from airflow_provider_walsink.core.targets.registry import (
    TargetUnreachableError,
    connection_missing,
    lookup_connection,
)

# One logger for the whole target (its name is what users filter on), whichever module logs.
log = logging.getLogger("airflow_provider_walsink.core.targets.delta")

#: Table URI schemes (after ``delta+``) whose credentials come only from a connection (:mod:`.stores`).
_STORE_SCHEMES = (*stores.GCS_SCHEMES, *stores.AZURE_SCHEMES)
#: How to create a target's missing connection, by store.
_HOW_TO_CREATE = {
    "s3": "with the access key pair as login/password and endpoint_url/region_name in its extra",
    "gs": "of type 'google_cloud_platform' (extra keyfile_dict or key_path, project; endpoint_url for an emulator)",
    "abfss": "of type 'wasb' (login = storage account, password = its key) or 'adls'",
}


def storage_options_from_connection(conn: Mapping[str, Any]) -> dict[str, str]:
    extra = conn.get("extra") or {}
    if isinstance(extra, str):
        extra = json.loads(extra) if extra.strip() else {}
    opts: dict[str, str] = {}
    if conn.get("login"):
        opts["AWS_ACCESS_KEY_ID"] = str(conn["login"])
        opts["AWS_SECRET_ACCESS_KEY"] = str(conn.get("password") or "")
    endpoint = extra.get("endpoint_url") or extra.get("endpoint")
    if endpoint:
        opts["AWS_ENDPOINT_URL"] = str(endpoint)
        if str(endpoint).startswith("http://"):
            opts["AWS_ALLOW_HTTP"] = "true"
    if extra.get("region_name"):
        opts["AWS_REGION"] = str(extra["region_name"])
    opts.update({str(k): str(v) for k, v in (extra.get("storage_options") or {}).items()})
    return opts


class DeltaPublisher(DeltaGroupCommit, DeltaTombstone, DeltaActions, Publisher):
    """Publishes checkpoint attempts into one Delta table (module docstring)."""

    kind: ClassVar[str] = "delta"
    capabilities: ClassVar[TargetCapabilities] = TargetCapabilities(
        atomic=True, needs_rename=False, remembers_commits=True, fenced_by_target=True, table_fence=True
    )
    #: Snapshots reference the staged files in place: GC never removes a committed attempt.
    references_staged_files: ClassVar[bool] = True
    #: ``publish`` takes a :class:`~.base.StagedAttempt`: local roots and object stores alike.
    takes_staged_attempt: ClassVar[bool] = True
    #: The connection its storage options were read from (``TargetOptions.extra["conn_id"]``), if any.
    conn_id: str | None = None

    def __init__(
        self,
        table_uri: str,
        mode: str,
        *,
        storage_options: Mapping[str, str] | None = None,
        partition_by: Sequence[str] = (),
        create_table: bool = False,
        allow_older_overwrite: bool = False,
        store_options: Mapping[str, Any] | None = None,
        property_archive: PropertyArchive | None = None,
        table_markers: int | str | None = None,
    ) -> None:
        WriteMode.parse(mode, error=DeltaTargetError)
        if "://" not in table_uri and not os.path.isabs(table_uri):
            raise DeltaTargetError(
                f"Delta table {table_uri!r} must be an absolute path or an s3://, gs:// or abfss:// URI"
            )
        self.table_uri = table_uri.rstrip("/")
        self.mode = mode
        self.partition_by = tuple(partition_by)
        self.create_table = create_table
        self.allow_older_overwrite = allow_older_overwrite
        #: A table on GCS or Azure: its store's options as the staging store takes them (from the
        #: target's connection), which also give deltalake's (explicit ``storage_options`` win).
        self.store_options = dict(store_options or {})
        self.storage_options = {
            **(stores.deltalake_options(self.table_uri, self.store_options) if self.store_options else {}),
            **dict(storage_options or {}),
        }
        self._storage: Storage | None = None
        #: Where expired markers are kept (:mod:`.markers`); also read without ``table_markers``,
        #: since another task may have bounded the table.
        self.property_archive = property_archive
        #: ``(keep, batch)`` when this publisher bounds the table's markers (``table_markers``, opt-in).
        self.archive_keep: tuple[int, int] | None = None
        if table_markers is not None:
            try:
                bounds = archive_bounds(table_markers)
            except ValueError as exc:
                raise DeltaTargetError(f"Delta table {self.table_uri}: {exc}") from None
            self.archive_keep = bounds if property_archive is not None else None

    @property
    def storage(self) -> Storage:
        """What walsink reads the table's log (and a local attempt) with: pyarrow's S3 or local file
        system, or for a table on GCS or Azure that store's staging backend opened on the table with
        the connection's options (reads confined to the table), opened on first use."""
        if self._storage is None:
            if stores.store_scheme(self.table_uri) and self.store_options:
                from airflow_provider_walsink.core.staging.object_store import StagingStore
                from airflow_provider_walsink.core.targets._tables import StoreStorage

                self._storage = StoreStorage(StagingStore.open(self.table_uri, self.store_options))
            else:
                self._storage = Storage(self._s3_settings())
        return self._storage

    @classmethod
    def from_uri(cls, uri: str, options: Any) -> DeltaPublisher:
        """``delta:///abs/path`` or ``delta+s3://bucket/path`` (``?create_table=true``) with :class:`~.registry.TargetOptions`."""
        parts = urlsplit(uri)
        extra = dict(options.extra or {})
        if parts.scheme == "delta":
            if parts.netloc or not parts.path.startswith("/"):
                raise DeltaTargetError(f"Delta target {uri!r} must be delta:///absolute/path (three slashes)")
            table_uri = parts.path
        elif parts.scheme in ("delta+s3", "delta+s3a", *(f"delta+{s}" for s in _STORE_SCHEMES)):
            if not parts.netloc or not parts.path.strip("/"):
                raise DeltaTargetError(f"Delta target {uri!r} must be {parts.scheme}://bucket/path")
            table_uri = f"{parts.scheme.removeprefix('delta+')}://{parts.netloc}{parts.path}"
        else:
            raise DeltaTargetError(
                f"Delta target {uri!r}: use delta:///path, delta+s3://bucket/path, delta+gs://bucket/path or "
                "delta+abfss://container@account.dfs.core.windows.net/path"
            )
        opts: dict[str, str] = {}
        store_options: dict[str, str] = {}
        on_store = stores.store_scheme(table_uri)
        if on_store and not extra.get("conn_id"):
            kind = "'google_cloud_platform'" if on_store == "gs" else "'wasb' or 'adls'"
            raise DeltaTargetError(
                f"Delta target {uri!r} names no conn_id: a table on {on_store}:// is reached only with a "
                f'{kind} connection (target_options={{"conn_id": ...}}), never with credentials found in '
                "the environment (docs/targets.md)"
            )
        if extra.get("conn_id"):
            conn_id = str(extra["conn_id"])
            fields = lookup_connection(options, conn_id, needed_by=f"Delta target {uri!r}")
            if fields is None:
                raise connection_missing(
                    conn_id,
                    needed_by=f"Delta target {uri!r}",
                    how=_HOW_TO_CREATE.get(on_store or "s3", ""),
                )
            if on_store:
                store_options = stores.connection_options({"conn_id": conn_id, **fields}, table_uri)
            else:
                opts.update(storage_options_from_connection(fields))
        opts.update({str(k): str(v) for k, v in (extra.get("storage_options") or {}).items()})
        if table_uri.startswith("s3://") and not opts:
            # deltalake's documented default, not walsink's: said so, since nothing was configured.
            log.info(
                "Delta target %s names no conn_id and no storage_options: deltalake takes S3 credentials "
                "from the environment (AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY, AWS_PROFILE, an instance role)",
                uri,
            )
        flags = uri_flags(parts.query, ("create_table",), uri)
        publisher = cls(
            table_uri,
            options.mode,
            storage_options=opts,
            partition_by=tuple(options.partition_by or ()),
            create_table=flags.get("create_table", bool(extra.get("create_table", False))),
            allow_older_overwrite=bool(getattr(options, "allow_older_overwrite", False)),
            store_options=store_options,
            property_archive=getattr(options, "property_archive", None),
            table_markers=extra.get("table_markers"),
        )
        publisher.conn_id = str(extra["conn_id"]) if extra.get("conn_id") else None
        return publisher

    def check_writable(self) -> None:
        """1. Before the write phase (``core/commit/preflight.py``): on S3, a connection named by
        ``conn_id`` gives credentials (read from the connection, never from this process's
        environment), and the table's bucket exists and its location can be looked up (a new
        table's directory need not exist). A local table: nothing checked here.

        Raises:
            TargetUnreachableError: naming the connection to fix and what was wrong.
        """
        target = f"Delta target {self.table_uri}"
        if stores.store_scheme(self.table_uri) and self.store_options:
            # The connection gave credentials (its reader refuses one that cannot); the bucket or
            # container must exist and the table's location be listable with them.
            fs, path = self.storage.fs_and_path(self.table_uri)
            where = stores.endpoint_of(self.store_options)
            check_location(
                lambda: fs, path, self.table_uri, target=target, where=f" at {where}" if where else "",
                connection=f"connection {self.conn_id!r} (the target's conn_id)",
            )  # fmt: skip
            return
        if not self.table_uri.startswith("s3://"):
            return
        if self.conn_id is not None:
            missing = missing_credentials(self.storage_options)
            if missing:
                raise TargetUnreachableError(
                    f"{target}: connection {self.conn_id!r} (the target's conn_id) has {missing}: give it the "
                    'access key pair as login/password (docs/targets.md, "Catalogs and connections"); '
                    f"{NOTHING_DONE}"
                )
            connection = f"connection {self.conn_id!r} (the target's conn_id)"
        elif self.storage_options:
            connection = "the target's storage_options (target_options)"
        else:
            connection = "the default credential chain of this host (the target names no conn_id)"
        check_bucket(self._s3_settings(), self.table_uri, target=target, connection=connection)

    def _s3_settings(self) -> S3Settings:
        o = {k.upper(): v for k, v in self.storage_options.items()}
        return S3Settings(
            endpoint=o.get("AWS_ENDPOINT_URL") or o.get("AWS_ENDPOINT"),
            access_key=o.get("AWS_ACCESS_KEY_ID"),
            secret_key=o.get("AWS_SECRET_ACCESS_KEY"),
            session_token=o.get("AWS_SESSION_TOKEN"),
            region=o.get("AWS_REGION") or o.get("AWS_DEFAULT_REGION"),
        )

    # ------------------------------------------------------------------ table

    def load_table(self) -> MarkedDeltaTable | None:
        """The table as its log stands now, or ``None`` (not created yet). Every read and commit of
        the target goes through here, so a table that can drop walsink's markers on its own is
        refused before anything is decided from them (:func:`.log.check_markers_kept`), and
        every marker lookup also answers the archived ones (:class:`.markers.MarkedDeltaTable`)."""
        try:
            dt = MarkedDeltaTable(self.table_uri, storage_options=self.storage_options or None)
        except TableNotFoundError:
            return None
        check_markers_kept(dt, self.table_uri)
        return dt.attach(self.storage, self.property_archive, self.table_uri)

    def bounding(self, dt: MarkedDeltaTable) -> bool:
        """Bound the table first if this publisher should and it is not yet (:func:`.markers.bound_table`);
        ``True`` when it did (the caller reloads)."""
        if self.archive_keep is None or is_bound(dt):
            return False
        bound_table(dt, self.storage, self.table_uri)
        return True

    def archiving(
        self, dt: MarkedDeltaTable, pipelines: Sequence[str], transactions: list[Transaction], version: int
    ) -> tuple[list[Transaction], dict[str, str]]:
        """What the commit at ``version`` also carries to keep each pipeline bounded (:mod:`.markers`)."""
        if self.archive_keep is None:
            return [], {}
        keep, batch = self.archive_keep
        return dt.archiving(pipelines, transactions, version=version, keep=keep, batch=batch)

    def describe(self) -> str:
        endpoint = stores.endpoint_of(self.store_options) or self._s3_settings().endpoint
        where = f" at {endpoint}" if endpoint else ""
        return f"Delta table {self.table_uri}{where}, {self.mode}"

    def staging_root(self) -> str | None:
        """Where the write phase stages attempts: inside the table directory, unreferenced until committed."""
        return f"{self.table_uri}/{STAGING_DIR}"

    # ------------------------------------------------------------------ marker

    def marker_of(
        self,
        dt: DeltaTable,
        manifest: Manifest,
        *,
        need_id: bool = False,
        candidates: Sequence[str | None] = (),
    ) -> Marker | None:
        """The checkpoint's marker: which attempt's application transaction holds the checkpoint's version.

        The manifest's attempt and each of ``candidates`` (the attempt a reprocess supersedes)
        are recognised by two lookups each; another attempt's id is looked up in the history
        only with ``need_id``.
        """
        version = dt.transaction_version(app_id(manifest))
        if version is None:
            return None
        # Each lease take raises the token, so only the attempt that committed under the
        # checkpoint's current version holds that same version.
        for attempt in (manifest.attempt_id, *candidates):
            if (
                attempt
                and version != ABORTED_TXN
                and dt.transaction_version(app_id(manifest, attempt)) == version
            ):
                return Marker(attempt, version)
        other = self._attempt_in_history(dt, manifest, version) if need_id else None
        return Marker(other or "another attempt", version)

    def _attempt_in_history(self, dt: DeltaTable, manifest: Manifest, version: int) -> str | None:
        for commit in history(self.storage, self.table_uri, dt):
            for held in commit_holders(commit):  # a group commit lists several checkpoints
                if (
                    held.get("pipeline") == manifest.pipeline
                    and held.get("checkpoint") == manifest.checkpoint_key
                    and str(held.get("epoch")) == str(version)
                ):
                    return held.get("attempt_id")
        return None

    def published_marker(self, manifest: Manifest, *, need_id: bool = True) -> Marker | None:
        """The table's marker for the manifest's checkpoint (attempt id, fencing token), or ``None``.

        Lets a committer whose rows were trimmed take its next lease above the token the table
        holds. With ``need_id=False`` the id of an attempt other than the manifest's is not
        looked up in the history (the token alone, two lookups).
        """
        dt = self.load_table()
        return self.marker_of(dt, manifest, need_id=need_id) if dt is not None else None

    def published_attempt(self, manifest: Manifest) -> str | None:
        marker = self.published_marker(manifest)
        return marker.attempt_id if marker else None

    def published_offsets(self, manifest: Manifest, attempt_id: str) -> tuple[Any, Any] | None:
        """The source offsets ``(start, end)`` of ``attempt_id`` if the table holds it, from its commit's
        metadata; ``None`` (unknown) when that commit left the history the table keeps (log retention)
        or predates the metadata."""
        dt = self.load_table()
        marker = self.marker_of(dt, manifest, need_id=True) if dt is not None else None
        if dt is None or marker is None or marker.attempt_id != attempt_id:
            return None
        for commit in history(self.storage, self.table_uri, dt):
            if (
                commit.get("walsink.pipeline") == manifest.pipeline
                and commit.get("walsink.checkpoint") == manifest.checkpoint_key
                and commit.get("walsink.attempt-id") == attempt_id
                and str(commit.get("walsink.epoch")) == str(marker.epoch)
            ):
                raw = commit.get("walsink.offsets")
                try:
                    return offsets_of(json.loads(raw)) if isinstance(raw, str) else None
                except ValueError:
                    return None
        return None

    def holds_attempt(self, manifest: Manifest) -> bool:
        """Whether a table version holds or held the manifest's attempt (it references its staged files)."""
        dt = self.load_table()
        return dt is not None and held_version(dt.transaction_version(app_id(manifest, manifest.attempt_id)))

    @staticmethod
    def _aborted(dt: DeltaTable, ref: Manifest | CheckpointRef, attempts: Sequence[str]) -> frozenset[str]:
        return frozenset(a for a in attempts if a and dt.transaction_version(app_id(ref, a)) == ABORTED_TXN)

    def fence_state(self, ref: CheckpointRef, candidates: Sequence[str] = ()) -> TableFenceState:
        """The attempt the table holds for the checkpoint, and which of ``candidates`` are aborted / held."""
        dt = self.load_table()
        if dt is None:
            return TableFenceState(None)
        marker = self.marker_of(dt, ref, need_id=True, candidates=tuple(candidates))  # type: ignore[arg-type]
        attempts = [a for a in (ref.attempt_id, *candidates) if a]
        known = frozenset(a for a in attempts if held_version(dt.transaction_version(app_id(ref, a))))
        return TableFenceState(marker.attempt_id if marker else None, self._aborted(dt, ref, attempts), known)

    def _create_empty(self, schema: DeltaSchema, partition_by: Sequence[str]) -> None:
        """Create the missing table as version 0 with no data, marker or tombstone.

        deltalake's create is not atomic on every store: two processes creating
        the same table at once both succeed, the later version 0 replacing the
        earlier (seen on local files). So version 0 never carries anything a
        racing creator could erase: data, markers and tombstones go in a
        normal commit after it, which the log writes put-if-absent (a racing
        commit gets ``CommitFailedError``). Two racing creators of this empty
        version write the same thing; an existing table is left as it is.
        """
        create_table_with_add_actions(
            self.table_uri,
            schema,
            [],
            mode="ignore",
            partition_by=list(partition_by),
            storage_options=self.storage_options or None,
        )

    # ------------------------------------------------------------------ publish

    def publish(
        self, manifest: Manifest, attempt_dir: StagedAttempt | str | os.PathLike[str], ctx: PublisherContext
    ) -> PublishResult:
        """Add the attempt's staged files in one Delta commit, or find it already there.

        Raises ``FencedError``, ``CommittableError`` / ``LayoutError`` /
        :class:`DeltaTargetError` (table unchanged), :class:`TableCommitConflict`.
        Safe to repeat.
        """
        supersedes = superseded_attempt(ctx, manifest)
        base, locations = staged_locations(attempt_dir, manifest)
        storage = staging_storage(self.storage, attempt_dir)
        staged: list[StagedFile] | None = None
        for _ in range(MAX_COMMIT_ATTEMPTS):
            dt = self.load_table()
            marker = self.marker_of(dt, manifest, candidates=(supersedes,)) if dt is not None else None
            aborted = self._aborted(dt, manifest, [manifest.attempt_id]) if dt is not None else frozenset()
            if decide(marker, manifest, ctx, self.mode, aborted):
                return self._already(manifest, marker, locations, dt)
            if dt is not None:
                self._check_order(dt, manifest)
            if staged is None:
                staged = storage.describe(manifest, locations)
            token = ctx.epoch
            if table_fenced(ctx) and marker is not None:
                # No lease orders the tokens: keep ours above the version the checkpoint holds, so only
                # the attempt that holds it shares its version (marker_of stays unambiguous).
                token = max(token, marker.epoch + 1)
            try:
                if dt is None:
                    _, schema, partition_by = self._adds_for_new_table(manifest, base, staged)
                    self._create_empty(schema, partition_by)
                    continue  # the data goes in a normal (put-if-absent) commit on the new table
                if self.bounding(dt):
                    continue
                adds = self._adds(dt, manifest, base, staged)
                removes, replaced = self._removes(dt, manifest, marker, base, supersedes)
                version = dt.version() + 1
                transactions = marker_transactions(manifest, token, len(adds), replaced, version)
                archived, info = self.archiving(dt, [manifest.pipeline], transactions, version)
                commit = commit_properties(
                    manifest,
                    token,
                    [*transactions, *archived],
                    exact_version=bool(replaced or archived),
                    metadata=info,
                )
                actions: list[AddAction | RemoveAction] = [*removes, *adds]
                call_with_events(
                    ctx,
                    "table_commit",
                    partial(append_commit, dt, actions, commit),
                )
            except CommitFailedError as e:
                log.info(
                    "Delta commit of %s/%s conflicted (%s); checking again",
                    manifest.pipeline,
                    manifest.checkpoint_key,
                    e,
                )
                continue
            dt.update_incremental()  # the log entries since the load: our commit's version
            if archived:
                dt.copy_archived([manifest.pipeline])
            return PublishResult(
                published=len(adds),
                files_rolled_back=len(removes),
                partitions_replaced=manifest.replaced_partitions() if self.mode == "overwrite" else [],
                target_files=locations,
                snapshot=str(dt.version()),
                rows=manifest.total_rows,
            )
        raise TableCommitConflict(
            f"Delta table {self.table_uri} changed under each of {MAX_COMMIT_ATTEMPTS} commit attempts of "
            f"{manifest.pipeline}/{manifest.checkpoint_key}; nothing was published, retry the commit"
        )

    def _already(
        self, manifest: Manifest, marker: Marker | None, locations: list[str], dt: Any
    ) -> PublishResult:
        return PublishResult(
            outcome=PublishOutcome.ALREADY_PUBLISHED,
            already=manifest.expected_count,
            target_files=locations,
            snapshot=str(dt.version()) if dt is not None else None,
            rows=manifest.total_rows,
        )

    # ------------------------------------------------------------------ finish

    def finish(
        self, manifest: Manifest, layout: Any = None, *, fence: Callable[[], None] | None = None
    ) -> list[str]:
        """Drop the attempt's manifest and the version's attempts the table never held; best effort.

        ``fence``: raises once the committer row no longer names this attempt
        (asked before every deletion). Never deletes a file a table version
        references: before each deletion the table is loaded again and an
        attempt is removed only if it has no application transaction in it.
        """
        dt = self.load_table()
        marker = self.marker_of(dt, manifest) if dt is not None else None
        if dt is None or marker is None or marker.attempt_id != manifest.attempt_id:
            return []
        root = layout_root(layout) or self.staging_root()
        assert root is not None

        def held_now(attempt_id: str) -> bool:
            now = self.load_table()
            try:
                return now is None or held_version(now.transaction_version(app_id(manifest, attempt_id)))
            except TargetStateError:  # an archived marker the database cannot vouch for: keep the files
                return True

        return staging_storage(self.storage, layout).remove_unreferenced_attempts(
            checkpoint_location(local_path(root), manifest), manifest, held_now, fence=fence
        )
