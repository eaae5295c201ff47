"""An Apache Iceberg table as a walsink target (pyiceberg), exactly once through the table's own commit.

``iceberg://<catalog>/<namespace>.<table>``. The catalog is configured, never
guessed: the connection named ``<catalog>`` (its ``extra`` holds catalog
properties: ``type`` ``sql`` or ``rest``, ``uri``, ``warehouse``, ``s3.*``),
else the properties in ``TargetOptions.extra["catalog"]``, else pyiceberg's own
configuration of ``<catalog>`` (``~/.pyiceberg.yaml``,
``PYICEBERG_CATALOG__<NAME>__*``). Only the catalog named ``walsink``
(:data:`EMBEDDED_CATALOG`) may have none of these: it is walsink's embedded SQL
catalog on SQLite under ``$WALSINK_ICEBERG_HOME`` (default
``~/.walsink/iceberg``), and the log says where. Any other catalog with no
configuration is refused (:class:`~.registry.TargetNotConfiguredError`).

**Commit = one snapshot.** The write phase stages Parquet files inside the
table location (:meth:`IcebergPublisher.staging_root`: ``<location>/_walsink_staging``),
invisible until a snapshot references them. ``publish`` adds them *by path*
(no copy, no rename) in one snapshot: a fast append, or in ``overwrite`` an
overwrite snapshot that also deletes the files of the interval's partitions.
The snapshot summary names pipeline, checkpoint key, attempt id and fencing
token (keyed by the stable pipeline id and checkpoint key, never by a run id:
Flink's sink lost data when its job id changed, iceberg issues 10892/16008).

**The marker.** The same commit sets the table property
``walsink.marker.<pipeline>/<key>`` = ``{attempt_id, epoch, snapshot, previous, files, t}``:
one dictionary lookup in metadata the table loads anyway, and it survives
snapshot expiry.

**Bounded: the oldest markers are archived** (:mod:`..archive`). Kept forever,
one property per checkpoint made every load and commit grow with the
history (pyiceberg copies the whole metadata several times per commit). So a
pipeline keeps at most ``table_markers`` (default 256) markers and partition
holders in the table; a commit past that also moves the oldest batch into the
committer database and sets the pipeline's ``walsink.archive.<pipeline>``
property, a hash chain over everything archived plus the batch just moved. A
marker is read from the table, else that batch, else the committer database,
and the database is only believed when its chain ends where the table's does.
What the markers protected still holds: a re-run of any old checkpoint is
recognised, and a committer database that was lost, restored from an older
backup or belongs to another table cannot cause a duplicate: the commit is
refused (:class:`~..archive.ArchiveMismatchError`, recorded on the
checkpoint) until the database is restored. What it costs: a table whose
database is lost no longer vouches for its old checkpoints on its own
(docs/targets.md, "Bounded table metadata"). Abort tombstones are not
archived (one per abort a person makes).

**Reprocess.** With ``ctx.supersedes`` (a new version of a committed
checkpoint) the same snapshot also deletes every live file of the superseded
attempt: those staged under the checkpoint's directory by another attempt,
and those the snapshot that committed it added. Older snapshots keep
referencing them (time travel) until ``expire_snapshots``; ``finish`` keeps them.

**Order and retraction by identity.** In ``overwrite`` the commit also sets,
per partition it replaces, ``walsink.partition.<pipeline>/<partition>`` =
``{checkpoint, attempt_id}``; a later commit of an *older* key over it is
refused (:func:`.base.check_partition_order`, invariant 10), checked in the
metadata the commit is based on. The marker records how many files the
attempt added (``files``): a reprocess in ``append`` retracts the superseded
version only if all of them are still live (a rewrite moved its rows into
files with no attempt identity: refused, :func:`._tables.check_retractable`);
in ``overwrite`` it replaces every partition its checkpoint holds.

**No rebasing retries.** pyiceberg retries a conflicting commit by rebasing it
onto the new table state, which re-adds files another committer already added
(duplicate rows). Here the library's retries are off for walsink's commit and
walsink retries *check + commit* itself: every attempt loads the table, checks
the marker in exactly the metadata the commit is based on, and commits with
the requirement that the branch head has not moved; a conflict reloads and
checks again (then usually finds the winner's marker: already published).

**Schema.** The staged files (plus the Hive partition columns of their paths)
must have the table's columns and types, or the publish fails naming them and
the table is unchanged; with ``extra["create_table"]`` a missing table is
created from the first staged file, partitioned by the declared columns.
"""

from __future__ import annotations

import logging
import os
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from functools import partial
from typing import Any, ClassVar
from urllib.parse import urlsplit

from pyiceberg.catalog import Catalog
from pyiceberg.exceptions import (
    CommitFailedException,
    NoSuchNamespaceError,
    NoSuchTableError,
    ValidationException,
)
from pyiceberg.table import Table

from airflow_provider_walsink.core.protocol.errors import NOTHING_DONE
from airflow_provider_walsink.core.protocol.manifest import Manifest
from airflow_provider_walsink.core.protocol.modes import WriteMode
from airflow_provider_walsink.core.targets._reach import REACH_TIMEOUT, host_port, one_line, within
from airflow_provider_walsink.core.targets._tables import (
    STAGING_DIR,
    CheckpointRef,
    Marker,
    S3Settings,
    Storage,
    TableCommitConflict,
    TableFenceState,
    call_with_events,
    checkpoint_location,
    decide,
    layout_root,
    staged_locations,
    staging_storage,
    superseded_attempt,
    uri_flags,
)
from airflow_provider_walsink.core.targets.archive import (
    DEFAULT_KEEP,
    PropertyArchive,
    WalsinkProperties,
    archive_bounds,
)
from airflow_provider_walsink.core.targets.base import (
    Publisher,
    PublisherContext,
    PublishOutcome,
    PublishResult,
    StagedAttempt,
    TargetCapabilities,
    check_partition_order,
    conflict_backoff,
)
from airflow_provider_walsink.core.targets.iceberg.catalog import (
    EMBEDDED_CATALOG,
    catalog_properties_from_connection,
    check_catalog_properties,
    embedded_catalog_properties,
    not_configured,
    open_catalog,
    pyiceberg_configured,
)
from airflow_provider_walsink.core.targets.iceberg.commit import (
    MAX_COMMIT_ATTEMPTS,
    commit_snapshot,
)
from airflow_provider_walsink.core.targets.iceberg.files import IcebergTargetError, new_table_schema
from airflow_provider_walsink.core.targets.iceberg.files import data_files as data_files_of
from airflow_provider_walsink.core.targets.iceberg.group import IcebergGroupCommit
from airflow_provider_walsink.core.targets.iceberg.markers import (
    aborted_of,
    marker_of,
    partition_holder,
    walsink_properties,
)
from airflow_provider_walsink.core.targets.iceberg.outcome import (
    CommitOutcomeUnknownError,
    UnknownCommitOutcome,
    bound_requests,
    describe,
    request_timeout,
)
from airflow_provider_walsink.core.targets.iceberg.retract import files_to_delete
from airflow_provider_walsink.core.targets.iceberg.tombstone import IcebergTombstone
from airflow_provider_walsink.core.targets.registry import (
    TargetNotConfiguredError,
    TargetUnreachableError,
    lookup_connection,
)

# One logger for the whole target (its name is what users filter on), whichever module logs.
log = logging.getLogger("airflow_provider_walsink.core.targets.iceberg")

#: The property the write probe of :meth:`IcebergPublisher.check_writable` asks to set; the probe's
#: requirement always fails, so no table ever carries it.
WRITE_PROBE_PROPERTY = "walsink.write-probe"


class IcebergPublisher(IcebergGroupCommit, IcebergTombstone, Publisher):
    """Publishes checkpoint attempts into one Iceberg table (module docstring)."""

    kind: ClassVar[str] = "iceberg"
    capabilities: ClassVar[TargetCapabilities] = TargetCapabilities(
        atomic=True, needs_rename=False, remembers_commits=True, fenced_by_target=True, table_fence=True
    )
    #: Snapshots reference the staged files in place: GC never removes a committed attempt.
    references_staged_files: ClassVar[bool] = True
    #: ``publish`` takes a :class:`~.base.StagedAttempt`: local roots and object stores alike.
    takes_staged_attempt: ClassVar[bool] = True
    #: Where the catalog's properties come from (a message names it as the place to fix them).
    catalog_source: str = "its catalog_properties"

    def __init__(
        self,
        identifier: str,
        mode: str,
        *,
        catalog_name: str = "walsink",
        catalog_properties: Mapping[str, str] | None = None,
        partition_by: Sequence[str] = (),
        create_table: bool = False,
        table_properties: Mapping[str, str] | None = None,
        allow_older_overwrite: bool = False,
        property_archive: PropertyArchive | None = None,
        table_markers: int | str = DEFAULT_KEEP,
    ) -> None:
        WriteMode.parse(mode, error=IcebergTargetError)
        namespace, dot, name = identifier.rpartition(".")
        if not dot or not namespace or not name:
            raise IcebergTargetError(f"Iceberg table {identifier!r} must be written <namespace>.<table>")
        self.identifier = identifier
        self.namespace = namespace
        self.mode = mode
        self.catalog_name = catalog_name
        if catalog_properties is None and catalog_name != EMBEDDED_CATALOG:
            raise TargetNotConfiguredError(
                f"Iceberg catalog {catalog_name!r} is not configured: pass its catalog_properties "
                f"(only the catalog {EMBEDDED_CATALOG!r} defaults to walsink's embedded one)"
            )
        self.catalog_properties = dict(
            catalog_properties if catalog_properties is not None else embedded_catalog_properties()
        )
        #: Seconds every request of a REST catalog may take (:mod:`.outcome`); never sent to the catalog.
        self.request_timeout = request_timeout(self.catalog_properties)
        self.partition_by = tuple(partition_by)
        self.create_table = create_table
        self.table_properties = dict(table_properties or {})
        self.allow_older_overwrite = allow_older_overwrite
        #: Where a pipeline's markers beyond ``table_markers`` go (:mod:`..archive`); ``None``:
        #: nothing is archived, and a table that archived some is refused where it must be read.
        self.property_archive = property_archive
        try:
            bounds = archive_bounds(table_markers)
        except ValueError as exc:
            raise IcebergTargetError(f"Iceberg table {identifier}: {exc}") from None
        self.archive_keep: tuple[int, int] | None = bounds if property_archive else None
        self._catalog: Catalog | None = None
        self.storage = Storage(self._s3_settings())

    @classmethod
    def from_uri(cls, uri: str, options: Any) -> IcebergPublisher:
        """``iceberg://<catalog>/<namespace>.<table>[?create_table=true]`` with :class:`~.registry.TargetOptions`."""
        parts = urlsplit(uri)
        identifier = parts.path.strip("/")
        if parts.scheme != "iceberg" or not parts.netloc or not identifier:
            raise IcebergTargetError(
                f"Iceberg target {uri!r} must be iceberg://<catalog>/<namespace>.<table>"
            )
        extra = dict(options.extra or {})
        name = parts.netloc
        props: dict[str, str] | None = None
        # Configured places only, in order; a failing lookup raises (never read as "absent").
        conn = (
            lookup_connection(options, name, needed_by=f"Iceberg target {uri!r}")
            if options.connections
            else None
        )
        if conn:
            props, source = catalog_properties_from_connection(conn), f"connection {name!r}"
        elif extra.get("catalog"):
            props, source = {str(k): str(v) for k, v in dict(extra["catalog"]).items()}, "target_options"
        else:
            props, source = pyiceberg_configured(name), "the pyiceberg configuration"
        if props is None and name != EMBEDDED_CATALOG:
            raise not_configured(uri, name)
        if props is not None:
            check_catalog_properties(uri, name, source, props)
        flags = uri_flags(parts.query, ("create_table",), uri)
        publisher = cls(
            identifier,
            options.mode,
            catalog_name=name,
            catalog_properties=props,
            partition_by=tuple(options.partition_by or ()),
            create_table=flags.get("create_table", bool(extra.get("create_table", False))),
            table_properties=extra.get("table_properties"),
            allow_older_overwrite=bool(getattr(options, "allow_older_overwrite", False)),
            property_archive=getattr(options, "property_archive", None),
            table_markers=extra.get("table_markers", DEFAULT_KEEP),
        )
        publisher.catalog_source = source if props is not None else "walsink's embedded catalog"
        return publisher

    def check_writable(self) -> None:
        """1. Before the write phase (``core/commit/preflight.py``): the catalog answers one cheap
        call (``table_exists``) within :data:`._reach.REACH_TIMEOUT` seconds, with the credential
        it was given; a REST catalog is then asked whether that credential may *write* the table
        (:meth:`_probe_write`).

        Raises:
            TargetNotConfiguredError: the catalog refused the credential or token (401/403, an
                OAuth2 error), or lets it read the table but not write it, naming where it comes
                from (the connection to fix).
            TargetUnreachableError: naming the catalog, where its configuration comes from (the
                connection to fix), its ``host:port`` and what went wrong.
        """
        from pyiceberg.exceptions import ForbiddenError, OAuthError, UnauthorizedError

        uri = self.catalog_properties.get("uri")
        where = host_port(uri) if uri else "(its configured location)"
        try:
            exists = within(
                REACH_TIMEOUT,
                lambda: self.catalog.table_exists(self.identifier),
                what=f"Iceberg catalog {self.catalog_name!r} at {where}",
            )
        except (OAuthError, UnauthorizedError, ForbiddenError) as exc:
            raise TargetNotConfiguredError(
                f"Iceberg target iceberg://{self.catalog_name}/{self.identifier}: catalog {self.catalog_name!r} at "
                f"{where} refused the credential from {self.catalog_source} ({one_line(exc)}): fix the client id "
                f"and secret (or the token, scope) there; {NOTHING_DONE}"
            ) from None
        except Exception as exc:  # noqa: BLE001 - whatever the catalog's client raises is the answer
            raise TargetUnreachableError(
                f"Iceberg target iceberg://{self.catalog_name}/{self.identifier}: catalog {self.catalog_name!r} "
                f"(from {self.catalog_source}) is unreachable at {where} ({one_line(exc)}): fix the catalog's "
                f"uri (host and port) there, or start the catalog; {NOTHING_DONE}"
            ) from None
        if exists:
            self._probe_write(where)

    def _probe_write(self, where: str) -> None:
        """Ask a REST catalog whether this credential may write the table, with a commit that cannot apply.

        The REST protocol has no "may I write" call, and a read-only token is otherwise found only
        at the commit, after Spark ran. The probe is a real commit request (a property update, the
        kind walsink's commits carry) whose one requirement, that the table's UUID is a fresh random
        one, always fails: the catalog authorises the write (403: refused, raised to the caller) and
        then answers 409 with nothing applied. A catalog that checks the requirement before the
        grant answers 409 as well and tells nothing: the commit then fails with its 403, recorded.
        Other catalog kinds are asked nothing more (their writes are the storage's and the
        database's, checked when they happen). Any other answer is logged and the write goes on:
        an inconclusive probe refuses nothing.
        """
        from pyiceberg.catalog.rest import RestCatalog
        from pyiceberg.exceptions import ForbiddenError, OAuthError, UnauthorizedError
        from pyiceberg.table.update import AssertTableUUID, SetPropertiesUpdate

        if not isinstance(self.catalog, RestCatalog):
            return

        def probe() -> None:
            table = self.catalog.load_table(self.identifier)
            self.catalog.commit_table(
                table,
                (AssertTableUUID(uuid=uuid.uuid4()),),
                (SetPropertiesUpdate(updates={WRITE_PROBE_PROPERTY: "never applied"}),),
            )

        try:
            within(REACH_TIMEOUT, probe, what=f"Iceberg catalog {self.catalog_name!r} at {where}")
        except CommitFailedException:
            return  # the grant passed; the requirement failed, as it always does: nothing applied
        except (ForbiddenError, UnauthorizedError, OAuthError) as exc:
            raise TargetNotConfiguredError(
                f"Iceberg target iceberg://{self.catalog_name}/{self.identifier}: catalog {self.catalog_name!r} at "
                f"{where} lets the credential from {self.catalog_source} read the table but not write it "
                f"({one_line(exc)}): grant that principal write access to {self.identifier} (or configure one "
                f"that has it) there; {NOTHING_DONE}"
            ) from None
        except Exception as exc:  # noqa: BLE001 - inconclusive: the commit will tell
            log.warning(
                "Iceberg catalog %r at %s did not say whether %s may write table %s (%s); going on, the commit "
                "will tell",
                self.catalog_name,
                where,
                self.catalog_source,
                self.identifier,
                one_line(exc),
            )
            return
        # Applied although its requirement failed: the catalog does not check requirements, and
        # walsink's exactly-once rests on them (the branch head it asserts).
        raise TargetNotConfiguredError(
            f"Iceberg target iceberg://{self.catalog_name}/{self.identifier}: catalog {self.catalog_name!r} at "
            f"{where} accepted a commit whose requirement (the table's UUID) was false: it does not check commit "
            f"requirements, which walsink's exactly-once commit relies on; use a catalog that does. {NOTHING_DONE}"
        )

    # ------------------------------------------------------------------ catalog and table

    def _s3_settings(self) -> S3Settings:
        p = self.catalog_properties
        return S3Settings(
            endpoint=p.get("s3.endpoint"),
            access_key=p.get("s3.access-key-id"),
            secret_key=p.get("s3.secret-access-key"),
            session_token=p.get("s3.session-token"),
            region=p.get("s3.region") or p.get("client.region"),
        )

    @property
    def catalog(self) -> Catalog:
        if self._catalog is None:
            self._catalog = open_catalog(self.catalog_name, self.catalog_properties)
            bound_requests(self._catalog, self.request_timeout)
        return self._catalog

    def load_table(self) -> Table | None:
        try:
            return self.catalog.load_table(self.identifier)
        except (NoSuchTableError, NoSuchNamespaceError):
            return None

    def describe(self) -> str:
        shown = {k: v for k, v in self.catalog_properties.items() if k in ("type", "warehouse")}
        uri = self.catalog_properties.get("uri", "")
        if "://" in uri:  # never the user:password part of a database URI
            parts = urlsplit(uri)
            shown["uri"] = (
                f"{parts.scheme}://{parts.hostname or ''}{parts.path if parts.scheme.startswith('sqlite') else ''}"
            )
        settings = ", ".join(f"{k}={v}" for k, v in sorted(shown.items()))
        return f"Iceberg table {self.identifier} in catalog {self.catalog_name} ({settings}), {self.mode}"

    def staging_root(self) -> str | None:
        """Where the write phase stages attempts: inside the table location, unreferenced until committed."""
        table = self.load_table()
        if table is not None:
            location = table.location()
        else:
            if self.create_table:  # the table will be created here: its namespace may be created now
                self._create_namespace()
            try:
                name = self.identifier.rpartition(".")[2]
                resolve = getattr(self.catalog, "_resolve_table_location", None)
                if resolve is None:  # a REST catalog: its server chooses the location on creation
                    raise NotImplementedError(
                        f"{type(self.catalog).__name__} names a table's location on creation"
                    )
                location = resolve(None, self.namespace, name)
            except (NoSuchNamespaceError, NotImplementedError, ValueError) as exc:
                # Namespace missing, or a catalog that cannot say before the table exists: the
                # attempt stages under the connection's root (said here, since it is a choice).
                log.warning(
                    "%s cannot say where its table will be (%s): staging elsewhere", self.identifier, exc
                )
                return None
        return f"{location.rstrip('/')}/{STAGING_DIR}"

    def _create_namespace(self) -> None:
        """Create the table's namespace if it is missing; an error that leaves it missing propagates.

        pyiceberg checks, then creates: two write tasks of one new table (a backfill's first
        intervals) race, and the loser's insert fails on the catalog's unique key. The namespace
        then exists, which is all that is needed. Any failure that leaves it missing is raised,
        never turned into "no staging root" (which would stage the attempt somewhere else)."""
        try:
            self.catalog.create_namespace_if_not_exists(self.namespace)
        except Exception:
            if not self.catalog.namespace_exists(self.namespace):
                raise
            log.info(
                "Namespace %s of %s was created meanwhile by another task", self.namespace, self.identifier
            )

    # ------------------------------------------------------------------ marker

    def _props(self, table: Table) -> WalsinkProperties:
        """The walsink properties of this table state, the archived ones behind them."""
        return walsink_properties(table, self.property_archive, self.identifier)

    def _check_order(self, props: WalsinkProperties | None, manifest: Manifest) -> None:
        """Invariant 10 on the metadata the commit is based on (``OrderError``; the commit asserts the head)."""
        if props is None or self.mode != "overwrite":
            return
        for partition in manifest.replaced_partitions():
            holder = partition_holder(props, manifest.pipeline, partition) or {}
            check_partition_order(
                manifest,
                partition,
                manifest.pipeline if holder else None,
                holder.get("checkpoint"),
                allow_older=self.allow_older_overwrite,
                target=f"Iceberg table {self.identifier}",
            )

    def fence_state(self, ref: CheckpointRef) -> TableFenceState:
        """The attempt the table holds for the checkpoint, the attempts aborted in it, and those it held."""
        table = self.load_table()
        if table is None:
            return TableFenceState(None)
        view = self._props(table)
        marker = marker_of(view, ref)
        known = frozenset({marker.attempt_id, *marker.previous}) if marker else frozenset()
        return TableFenceState(marker.attempt_id if marker else None, aborted_of(view, ref), known)

    def published_marker(self, manifest: Manifest) -> Marker | None:
        """The table's marker for the manifest's checkpoint (attempt id, fencing token, snapshot), or ``None``.

        Lets a committer whose rows were trimmed take its next lease above the token the table holds.
        """
        table = self.load_table()
        return marker_of(self._props(table), manifest) if table is not None else None

    def published_attempt(self, manifest: Manifest) -> str | None:
        marker = self.published_marker(manifest)
        return marker.attempt_id if marker else None

    def published_offsets(self, manifest: Manifest, attempt_id: str) -> tuple[Any, Any] | None:
        """The source offsets ``(start, end)`` of ``attempt_id`` if the table holds it and its marker
        records them (markers written before they were do not), else ``None``: unknown."""
        marker = self.published_marker(manifest)
        return marker.offsets if marker is not None and marker.attempt_id == attempt_id else None

    def holds_attempt(self, manifest: Manifest) -> bool:
        """Whether the table holds or held the manifest's attempt (a snapshot may reference its staged files)."""
        marker = self.published_marker(manifest)
        return marker is not None and manifest.attempt_id in (marker.attempt_id, *marker.previous)

    # ------------------------------------------------------------------ publish

    def publish(
        self, manifest: Manifest, attempt_dir: StagedAttempt | str | os.PathLike[str], ctx: PublisherContext
    ) -> PublishResult:
        """Add the attempt's staged files to the table in one snapshot, or find it already there.

        Raises ``FencedError`` (a newer committer's attempt is in the table, or
        ``ctx.fence()`` refused), ``CommittableError`` / ``LayoutError`` /
        :class:`IcebergTargetError` (staged files, layout or schema do not fit;
        table unchanged), :class:`TableCommitConflict` (the table changed under
        every one of :data:`MAX_COMMIT_ATTEMPTS` attempts). Safe to repeat.
        """
        base, locations = staged_locations(attempt_dir, manifest, uri=True)
        storage = staging_storage(self.storage, attempt_dir)
        footers: list[Any] | None = None
        last_conflict: Exception | None = None
        # Commits whose outcome the catalog did not report, by the snapshot id each built
        # (:mod:`.outcome`): the table's marker says whether one landed.
        pending: dict[str, PublishResult] = {}
        for attempt in range(MAX_COMMIT_ATTEMPTS):
            table = self._load_deciding(manifest, pending)
            view = self._props(table) if table is not None else None
            marker = marker_of(view, manifest) if view is not None else None
            aborted = aborted_of(view, manifest) if view is not None else frozenset()
            if decide(marker, manifest, ctx, self.mode, aborted):
                return self._landed(manifest, marker, pending) or self._already(manifest, marker, locations)
            self._check_order(view, manifest)
            if footers is None:
                footers = storage.footers(
                    [(loc, c.size) for loc, c in zip(locations, manifest.committables, strict=True)]
                )
            if table is None:
                table = self._create(manifest, footers)
                view = self._props(table)
                marker = marker_of(view, manifest)
                if decide(marker, manifest, ctx, self.mode, aborted_of(view, manifest)):
                    return self._already(manifest, marker, locations)
            data_files = data_files_of(table, manifest, locations, footers, identifier=self.identifier)
            deletes, replaced = files_to_delete(
                table,
                manifest,
                marker,
                base,
                superseded_attempt(ctx, manifest),
                mode=self.mode,
                identifier=self.identifier,
                props=view,
            )
            result = PublishResult(
                published=len(data_files),
                files_rolled_back=len(deletes),
                partitions_replaced=manifest.replaced_partitions() if self.mode == "overwrite" else [],
                target_files=locations,
                rows=manifest.total_rows,
            )
            try:
                snapshot = call_with_events(
                    ctx,
                    "table_commit",
                    partial(
                        commit_snapshot,
                        table,
                        manifest,
                        ctx.epoch,
                        marker,
                        data_files,
                        deletes,
                        replaced,
                        props=view,
                        keep=self.archive_keep,
                    ),
                )
            except (CommitFailedException, ValidationException) as e:
                # Nothing was committed: the catalog refused the commit, or the producer found
                # the files to delete gone from the snapshot it was based on. Reload, check again.
                log.info(
                    "Iceberg commit of %s/%s conflicted (%s); checking again",
                    manifest.pipeline,
                    manifest.checkpoint_key,
                    e,
                )
                last_conflict = e
                continue
            except UnknownCommitOutcome as unknown:
                # It may have landed: delete nothing, retract nothing; the next load decides.
                pending[str(unknown.snapshot_id)] = result
                last_conflict = unknown.cause
                self._log_unknown(f"{manifest.pipeline}/{manifest.checkpoint_key}", unknown)
                time.sleep(conflict_backoff(attempt))
                continue
            result.snapshot = str(snapshot)
            return result
        if pending:  # the last commit's outcome is still to be read from the table
            table = self._load_deciding(manifest, pending)
            marker = marker_of(self._props(table), manifest) if table is not None else None
            if (landed := self._landed(manifest, marker, pending)) is not None:
                return landed
        raise TableCommitConflict(
            f"Iceberg table {self.identifier} changed under each of {MAX_COMMIT_ATTEMPTS} commit attempts of "
            f"{manifest.pipeline}/{manifest.checkpoint_key} (last: {last_conflict}); nothing was published, "
            "retry the commit"
        )

    def _load_deciding(self, manifest: Manifest | None, pending: Mapping[str, Any]) -> Table | None:
        """The table, loaded to decide what to do next; after a commit of unknown outcome, a table
        that cannot be loaded is :class:`~.outcome.CommitOutcomeUnknownError` (nothing deleted)."""
        if not pending:
            return self.load_table()
        try:
            return self.load_table()
        except Exception as exc:  # noqa: BLE001 - whatever the catalog's client raises, the outcome stays unknown
            what = (
                f"{manifest.pipeline}/{manifest.checkpoint_key}" if manifest else f"{len(pending)} commit(s)"
            )
            raise CommitOutcomeUnknownError(
                f"Iceberg table {self.identifier}: catalog {self.catalog_name!r} did not report whether the commit "
                f"of {what} landed, and the table could not be loaded to decide it ({describe(exc)}). Nothing was "
                "deleted or retracted; the next commit try reads the table's marker and records the checkpoint "
                "COMMITTED if the commit landed, or commits it if it did not"
            ) from exc

    @staticmethod
    def _landed(
        manifest: Manifest, marker: Marker | None, pending: Mapping[str, PublishResult]
    ) -> PublishResult | None:
        """This try's own commit, found in the table after its outcome was unknown (or ``None``)."""
        if marker is None or marker.attempt_id != manifest.attempt_id or marker.snapshot not in pending:
            return None
        result = pending[marker.snapshot]
        result.snapshot = marker.snapshot
        log.warning(
            "Iceberg commit of %s/%s landed (snapshot %s) although the catalog did not say so: recorded as committed",
            manifest.pipeline,
            manifest.checkpoint_key,
            marker.snapshot,
        )
        return result

    def _log_unknown(self, what: str, unknown: UnknownCommitOutcome) -> None:
        log.warning(
            "Iceberg commit of %s to %s: the catalog did not report the outcome (%s); nothing is deleted, "
            "the table is loaded again and the marker decides whether snapshot %s landed",
            what,
            self.identifier,
            describe(unknown.cause),
            unknown.snapshot_id,
        )

    def _already(self, manifest: Manifest, marker: Marker | None, locations: list[str]) -> PublishResult:
        return PublishResult(
            outcome=PublishOutcome.ALREADY_PUBLISHED,
            already=manifest.expected_count,
            target_files=locations,
            snapshot=marker.snapshot if marker else None,
            rows=manifest.total_rows,
        )

    def _create(self, manifest: Manifest, footers: list[Any]) -> Table:
        """Create the table from the first staged file (plus path partition columns), if asked to."""
        if not self.create_table:
            raise IcebergTargetError(
                f"Iceberg table {self.identifier} does not exist in catalog {self.catalog_name}; create it, or set "
                'extra={"create_table": True} to create it from the staged files on the first commit'
            )
        if not footers:
            raise IcebergTargetError(
                f"Iceberg table {self.identifier} does not exist and checkpoint "
                f"{manifest.pipeline}/{manifest.checkpoint_key} staged no file to take its schema from"
            )
        schema, spec = new_table_schema(manifest, footers, self.partition_by, identifier=self.identifier)
        self.catalog.create_namespace_if_not_exists(self.namespace)
        # The name mapping (staged files carry no field ids) is set by the first commit, from the
        # schema with the ids the catalog assigned.
        return self.catalog.create_table_if_not_exists(
            self.identifier, schema=schema, partition_spec=spec, properties=self.table_properties
        )

    # ------------------------------------------------------------------ finish

    def finish(
        self, manifest: Manifest, layout: Any = None, *, fence: Callable[[], None] | None = None
    ) -> list[str]:
        """Drop the attempt's manifest and the version's attempts the table never held; best effort.

        ``layout``: the :class:`StagingLayout` (or staging root URI) the attempt
        was staged under; default :meth:`staging_root`. ``fence``: raises once
        the committer row no longer names this attempt (asked before every
        deletion). Never deletes a file a snapshot references: before each
        deletion the table is loaded again and attempts its marker names
        (current or previous) stay; the table's expire-snapshots /
        remove-orphan-files own them.
        """
        root = layout_root(layout) or self.staging_root()
        if root is None:
            return []
        table = self.load_table()
        marker = marker_of(self._props(table), manifest) if table is not None else None
        if marker is None or marker.attempt_id != manifest.attempt_id:
            return []  # not (or no longer) ours in the table: leave everything to the committer's GC

        def held_now(attempt_id: str) -> bool:
            now = self.load_table()
            current = marker_of(self._props(now), manifest) if now is not None else None
            # No marker now (the table was replaced or dropped): keep, never guess.
            return current is None or attempt_id in (current.attempt_id, *current.previous)

        return staging_storage(self.storage, layout).remove_unreferenced_attempts(
            checkpoint_location(root, manifest), manifest, held_now, fence=fence
        )
