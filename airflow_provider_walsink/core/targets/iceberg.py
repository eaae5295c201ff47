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
``walsink.marker.<pipeline>/<key>`` = ``{attempt_id, epoch, snapshot, previous}``:
one dictionary lookup in metadata the table loads anyway (the check costs the
table load, whatever the history: ``bench/bench_tables.py``), and it survives
snapshot expiry.

**Why one property per checkpoint, kept forever.** The properties grow with
the number of checkpoints ever committed (about 150 bytes each), also after
``expire_snapshots``, and pyiceberg parses all of them on every load; each
commit rewrites them in a new metadata file (docs/targets.md, "What it
costs", has the figures). Bounding them was considered and rejected, because
the guarantee they carry is: *a checkpoint whose marker is in the table is
never published twice, even with the committer table lost* (retention trims
it; a backfill re-runs old keys, in any order).

* A high-water mark per pipeline (the greatest key committed) plus the
  markers of recent keys: a key below the mark with no marker is either an
  evicted committed checkpoint or one never committed (backfills commit out of
  order). Calling it published drops its rows silently; calling it new
  publishes an evicted one twice in ``append``. Refusing it is safe but makes
  every out-of-order backfill below the mark uncommittable, and a reprocess of
  an evicted key loses what it must retract (the superseded attempt id and its
  snapshot), so it would have to be refused too.
* Any exact answer to "is key k one of the N keys committed?" for arbitrary
  keys committed in any order needs space growing with N (the set itself is
  the information); a compressed summary such as a Bloom filter errs in one
  direction only, so its "maybe" would again have to refuse a legitimate new
  key, and it still grows linearly (in bits rather than bytes).
* Keeping old markers in files outside the metadata JSON: a table property
  is not a reference that Iceberg's ``remove_orphan_files`` honours, so the
  maintenance users run anyway would delete them, and a lost marker is a
  silent double publish.

So the markers stay one per checkpoint; the cost is measured and documented
(after 10,000 checkpoints with snapshots expired: 1.5 MiB of metadata, a load
of 23.5 ms against 1.7 ms without markers, a one-file commit of 337 ms against
47 ms), and the metadata files a commit leaves behind are bounded by the
table's own ``write.metadata.delete-after-commit.enabled`` (docs/targets.md).
A denser encoding (one property per pipeline holding all its keys) would cut
the constant, not the growth (pyiceberg would copy one string where it now
copies 10,000 entries), at a price: every marker write would then rely on the
commit asserting the branch head, where per-key properties compose even under
concurrent property updates. Not done.

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

import json
import logging
import os
from collections.abc import Callable, Mapping, Sequence
from functools import partial
from pathlib import Path
from typing import Any, ClassVar
from urllib.parse import urlsplit

from pyiceberg.catalog import Catalog, load_catalog
from pyiceberg.exceptions import (
    CommitFailedException,
    NoSuchNamespaceError,
    NoSuchTableError,
    ValidationException,
)
from pyiceberg.expressions import AlwaysTrue, And, EqualTo, Or
from pyiceberg.io.pyarrow import (
    UnsupportedPyArrowTypeException,
    compute_statistics_plan,
    data_file_statistics_from_parquet_metadata,
    parquet_path_to_id_mapping,
    schema_to_pyarrow,
)
from pyiceberg.manifest import DataFile, DataFileContent, FileFormat
from pyiceberg.partitioning import PartitionField, PartitionSpec
from pyiceberg.table import Table, TableProperties
from pyiceberg.transforms import IdentityTransform
from pyiceberg.typedef import Record
from pyiceberg.types import BooleanType, DateType, IntegerType, LongType, StringType
from pyiceberg.utils.datetime import date_str_to_days

from airflow_provider_walsink.core.protocol.errors import LayoutError, WalsinkError
from airflow_provider_walsink.core.protocol.manifest import Manifest
from airflow_provider_walsink.core.targets._tables import (
    STAGING_DIR,
    CheckpointRef,
    Marker,
    S3Settings,
    Storage,
    TableCommitConflict,
    TableFenceState,
    as_uri,
    call_with_events,
    check_retractable,
    checkpoint_location,
    decide,
    int96_columns,
    layout_root,
    offsets_of,
    offsets_value,
    partition_of_path,
    schema_problems,
    staged_locations,
    staging_storage,
    superseded_attempt,
    uri_flags,
)
from airflow_provider_walsink.core.targets.base import (
    Publisher,
    PublisherContext,
    PublishOutcome,
    PublishResult,
    StagedAttempt,
    TargetCapabilities,
    check_partition_order,
)
from airflow_provider_walsink.core.targets.registry import TargetNotConfiguredError, lookup_connection

log = logging.getLogger(__name__)

MODES = ("append", "overwrite")
MARKER_PREFIX = "walsink.marker."
#: Table property listing the attempt ids an abort tombstoned (``walsink.aborted.<pipeline>/<key>``).
ABORTED_PREFIX = "walsink.aborted."
#: Table property naming the checkpoint whose data an ``overwrite`` partition holds
#: (``walsink.partition.<pipeline>/<partition path>`` = ``{checkpoint, attempt_id}``): the
#: ordering rule (invariant 10) reads it in the metadata the commit is based on, and a
#: reprocess replaces the partitions its checkpoint holds, whatever files maintenance left.
PARTITION_PREFIX = "walsink.partition."
#: Check + commit attempts before giving up on a table that keeps changing.
MAX_COMMIT_ATTEMPTS = 20
HIVE_NULL = "__HIVE_DEFAULT_PARTITION__"
#: Catalog properties that are secrets: never described or logged.
_SECRET_KEYS = ("secret", "password", "token", "credential", "key-id")


def without_library_retries(table: Table) -> Table:
    """``table`` with pyiceberg's own commit retries off: a conflict must come back to walsink,
    which re-checks its marker and fence on the new state before it tries again."""
    return Table(
        table._identifier,
        table.metadata.model_copy(
            update={"properties": {**table.metadata.properties, TableProperties.COMMIT_NUM_RETRIES: "0"}}
        ),
        table.metadata_location,
        table.io,
        table.catalog,
    )


class IcebergTargetError(WalsinkError):
    """The Iceberg target cannot be used as configured; the message says why (table unchanged)."""


def marker_property(manifest: Manifest) -> str:
    # "/" cannot occur in a pipeline id or checkpoint key, so the key is unambiguous.
    return f"{MARKER_PREFIX}{manifest.pipeline}/{manifest.checkpoint_key}"


def partition_property(pipeline: str, partition: str) -> str:
    return f"{PARTITION_PREFIX}{pipeline}/{partition}"


#: The one catalog name that needs no configuration: walsink's embedded SQL catalog.
EMBEDDED_CATALOG = "walsink"
#: Catalog types that cannot work without a ``uri`` property.
_NEEDS_URI = ("sql", "rest")


def default_catalog_properties() -> dict[str, str]:
    """The embedded catalog: SQLite file and a local warehouse under ``$WALSINK_ICEBERG_HOME``."""
    home = Path(os.environ.get("WALSINK_ICEBERG_HOME") or Path.home() / ".walsink" / "iceberg")
    home.mkdir(parents=True, exist_ok=True)
    return {
        "type": "sql",
        "uri": f"sqlite:///{home / 'catalog.db'}",
        "warehouse": as_uri(str(home / "warehouse")),
    }


def _embedded_catalog_properties() -> dict[str, str]:
    props = default_catalog_properties()
    # A documented default, named in the log: a table here is on this machine only.
    log.info(
        "Iceberg catalog %r is walsink's embedded SQL catalog: %s, warehouse %s "
        "($WALSINK_ICEBERG_HOME; for a shared catalog, create a connection and name it in the target URI)",
        EMBEDDED_CATALOG,
        props["uri"],
        props["warehouse"],
    )
    return props


def _pyiceberg_configured(name: str) -> dict[str, str] | None:
    """pyiceberg's own configuration of catalog ``name`` (``~/.pyiceberg.yaml``, ``PYICEBERG_CATALOG__*``)."""
    from pyiceberg.utils.config import Config

    found = Config().get_catalog_config(name)
    return {str(k): str(v) for k, v in found.items()} if found else None


def _not_configured(uri: str, name: str) -> TargetNotConfiguredError:
    return TargetNotConfiguredError(
        f"Iceberg target {uri!r}: Iceberg catalog {name!r} is not configured: there is no connection "
        f'{name!r}, no target_options={{"catalog": {{...}}}} and no pyiceberg configuration of it. '
        f"Create the connection (Admin > Connections, or AIRFLOW_CONN_{name.upper()}) with the catalog "
        'properties in its extra, e.g. {"type": "sql", "uri": "postgresql+psycopg2://...", "warehouse": '
        '"s3://bucket/warehouse"}; or pass them as target_options={"catalog": {...}}; or configure it for '
        f"pyiceberg (~/.pyiceberg.yaml, PYICEBERG_CATALOG__{name.upper()}__URI); or use "
        f"iceberg://{EMBEDDED_CATALOG}/... for walsink's embedded SQLite catalog on this machine "
        "(docs/targets.md). Nothing was written."
    )


def _check_catalog_properties(uri: str, name: str, source: str, props: Mapping[str, str]) -> None:
    kind = props.get("type", "")
    if kind in _NEEDS_URI and not props.get("uri"):
        raise TargetNotConfiguredError(
            f"Iceberg target {uri!r}: catalog {name!r} from {source} is of type {kind!r} but has no 'uri' "
            "property (the catalog database's SQLAlchemy URL, or the REST endpoint): add it (docs/targets.md)"
        )


def catalog_properties_from_connection(conn: Mapping[str, Any]) -> dict[str, str]:
    """Catalog properties from a connection's fields: ``extra`` as is, ``host``/``login`` filling gaps."""
    extra = conn.get("extra") or {}
    if isinstance(extra, str):
        extra = json.loads(extra) if extra.strip() else {}
    props = {str(k): str(v) for k, v in extra.items()}
    conn_type = (conn.get("conn_type") or "").lower()
    if "type" not in props:
        props["type"] = "rest" if conn_type in ("http", "https", "iceberg_rest", "rest") else "sql"
    if "uri" not in props and conn.get("host"):
        scheme = "https" if conn_type == "https" else "http"
        port = f":{conn['port']}" if conn.get("port") else ""
        props["uri"] = f"{scheme}://{conn['host']}{port}{conn.get('schema') and '/' + conn['schema'] or ''}"
    if conn.get("login") and "s3.access-key-id" not in props:
        props["s3.access-key-id"] = str(conn["login"])
        props["s3.secret-access-key"] = str(conn.get("password") or "")
    return props


def _is_secret(key: str) -> bool:
    return any(s in key.lower() for s in _SECRET_KEYS)


class IcebergPublisher(Publisher):
    """Publishes checkpoint attempts into one Iceberg table (module docstring)."""

    kind: ClassVar[str] = "iceberg"
    capabilities: ClassVar[TargetCapabilities] = TargetCapabilities(
        atomic=True, needs_rename=False, remembers_commits=True, fenced_by_target=True, table_fence=True
    )
    #: Snapshots reference the staged files in place: GC never removes a committed attempt.
    references_staged_files: ClassVar[bool] = True
    #: ``publish`` takes a :class:`~.base.StagedAttempt`: local roots and object stores alike.
    takes_staged_attempt: ClassVar[bool] = True

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
    ) -> None:
        if mode not in MODES:
            raise IcebergTargetError(f"mode must be one of {MODES}, got {mode!r}")
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
            catalog_properties if catalog_properties is not None else _embedded_catalog_properties()
        )
        self.partition_by = tuple(partition_by)
        self.create_table = create_table
        self.table_properties = dict(table_properties or {})
        self.allow_older_overwrite = allow_older_overwrite
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
            props, source = _pyiceberg_configured(name), "the pyiceberg configuration"
        if props is None and name != EMBEDDED_CATALOG:
            raise _not_configured(uri, name)
        if props is not None:
            _check_catalog_properties(uri, name, source, props)
        flags = uri_flags(parts.query, ("create_table",), uri)
        return cls(
            identifier,
            options.mode,
            catalog_name=name,
            catalog_properties=props,
            partition_by=tuple(options.partition_by or ()),
            create_table=flags.get("create_table", bool(extra.get("create_table", False))),
            table_properties=extra.get("table_properties"),
            allow_older_overwrite=bool(getattr(options, "allow_older_overwrite", False)),
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
            self._catalog = load_catalog(self.catalog_name, **self.catalog_properties)
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
                location = self.catalog._resolve_table_location(None, self.namespace, name)
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

    @staticmethod
    def marker_of(table: Table, manifest: Manifest) -> Marker | None:
        raw = table.metadata.properties.get(marker_property(manifest))
        if not raw:
            return None
        data = json.loads(raw)
        files = data.get("files")
        return Marker(
            data["attempt_id"],
            int(data["epoch"]),
            data.get("snapshot"),
            tuple(data.get("previous", ())),
            files=int(files) if files is not None else None,
            offsets=offsets_of(data.get("offsets")),
        )

    @staticmethod
    def partition_holder(table: Table, pipeline: str, partition: str) -> dict[str, str] | None:
        """``{checkpoint, attempt_id}`` of the checkpoint whose data ``partition`` holds (``overwrite``), or ``None``."""
        raw = table.metadata.properties.get(partition_property(pipeline, partition))
        return json.loads(raw) if raw else None

    @staticmethod
    def partitions_held(table: Table, manifest: Manifest) -> list[str]:
        """The partitions whose data is the manifest's checkpoint's (any attempt of it), per the holder properties."""
        prefix = partition_property(manifest.pipeline, "")
        held = []
        for name, raw in table.metadata.properties.items():
            if name.startswith(prefix) and json.loads(raw).get("checkpoint") == manifest.checkpoint_key:
                held.append(name[len(prefix) :])
        return sorted(held)

    def _check_order(self, table: Table | None, manifest: Manifest) -> None:
        """Invariant 10 on the metadata the commit is based on (``OrderError``; the commit asserts the head)."""
        if table is None or self.mode != "overwrite":
            return
        for partition in manifest.replaced_partitions():
            holder = self.partition_holder(table, manifest.pipeline, partition) or {}
            check_partition_order(
                manifest,
                partition,
                manifest.pipeline if holder else None,
                holder.get("checkpoint"),
                allow_older=self.allow_older_overwrite,
                target=f"Iceberg table {self.identifier}",
            )

    @staticmethod
    def aborted_of(table: Table, manifest: Manifest | CheckpointRef) -> frozenset[str]:
        """Attempt ids of the checkpoint that an abort tombstoned in this table state."""
        raw = table.metadata.properties.get(f"{ABORTED_PREFIX}{manifest.pipeline}/{manifest.checkpoint_key}")
        return frozenset(json.loads(raw)) if raw else frozenset()

    def fence_state(self, ref: CheckpointRef) -> TableFenceState:
        """The attempt the table holds for the checkpoint, the attempts aborted in it, and those it held."""
        table = self.load_table()
        if table is None:
            return TableFenceState(None)
        marker = self.marker_of(table, ref)  # type: ignore[arg-type]
        known = frozenset({marker.attempt_id, *marker.previous}) if marker else frozenset()
        return TableFenceState(marker.attempt_id if marker else None, self.aborted_of(table, ref), known)

    def tombstone(
        self,
        ref: CheckpointRef,
        attempt_ids: frozenset[str],
        *,
        superseded: str | None = None,
        create_from: tuple[Manifest, StagedAttempt | str] | None = None,
    ) -> str | None:
        """Commit an abort's tombstone for ``attempt_ids``, or return the attempt that makes it refuse.

        One snapshot with no data file (so the branch head moves, and a
        committer whose commit is based on the state before it fails the
        catalog's compare-and-swap and checks again) that adds the ids to the
        ``walsink.aborted.<pipeline>/<key>`` property. The marker is checked in
        the metadata the commit is based on: if the table holds *any* attempt
        of the checkpoint but ``superseded`` (the committed version a
        reprocess replaces), nothing is written and that attempt's id is
        returned (the checkpoint is published). Ids the table holds or held are never
        tombstoned. A missing table is created from ``create_from`` (a sealed
        manifest and its attempt: a local directory, or a :class:`StagedAttempt` on any store) when the target may create it;
        otherwise :class:`IcebergTargetError`.
        """
        for _ in range(MAX_COMMIT_ATTEMPTS):
            table = self.load_table()
            if table is None:
                if create_from is None or not self.create_table:
                    raise IcebergTargetError(
                        f"Iceberg table {self.identifier} does not exist, so it cannot carry the abort's "
                        f"tombstone for {ref.pipeline}/{ref.checkpoint_key}; create it (or set create_table) "
                        "and abort again"
                    )
                manifest, attempt_dir = create_from
                _, created_from = staged_locations(attempt_dir, manifest, uri=True)
                footers = staging_storage(self.storage, attempt_dir).footers(
                    [(loc, c.size) for loc, c in zip(created_from, manifest.committables, strict=True)]
                )
                table = self._create(manifest, footers)
            marker = self.marker_of(table, ref)  # type: ignore[arg-type]
            if marker is not None and marker.attempt_id != superseded:
                return marker.attempt_id
            known = {marker.attempt_id, *marker.previous} if marker else set()
            already = self.aborted_of(table, ref)
            new = set(attempt_ids) - known - already
            if not new:
                return None
            tx = without_library_retries(table).transaction()
            summary = {
                "walsink.pipeline": ref.pipeline,
                "walsink.checkpoint": ref.checkpoint_key,
                "walsink.aborted": ",".join(sorted(new)),
            }
            with tx.update_snapshot(snapshot_properties=summary).fast_append():
                pass  # no data file: the snapshot moves the head, the property carries the tombstone
            tx.set_properties(
                {f"{ABORTED_PREFIX}{ref.pipeline}/{ref.checkpoint_key}": json.dumps(sorted(already | new))}
            )
            try:
                tx.commit_transaction()
            except (CommitFailedException, ValidationException) as e:
                log.info(
                    "Iceberg tombstone of %s/%s conflicted (%s); checking again",
                    ref.pipeline,
                    ref.checkpoint_key,
                    e,
                )
                continue
            return None
        raise TableCommitConflict(
            f"Iceberg table {self.identifier} changed under each of {MAX_COMMIT_ATTEMPTS} tombstone commits of "
            f"{ref.pipeline}/{ref.checkpoint_key}; nothing was written, abort again"
        )

    def published_marker(self, manifest: Manifest) -> Marker | None:
        """The table's marker for the manifest's checkpoint (attempt id, fencing token, snapshot), or ``None``.

        Lets a committer whose rows were trimmed take its next lease above the token the table holds.
        """
        table = self.load_table()
        return self.marker_of(table, manifest) if table is not None else None

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
        for _ in range(MAX_COMMIT_ATTEMPTS):
            table = self.load_table()
            marker = self.marker_of(table, manifest) if table is not None else None
            aborted = self.aborted_of(table, manifest) if table is not None else frozenset()
            if decide(marker, manifest, ctx, self.mode, aborted):
                return self._already(manifest, marker, locations)
            self._check_order(table, manifest)
            if footers is None:
                footers = storage.footers(
                    [(loc, c.size) for loc, c in zip(locations, manifest.committables, strict=True)]
                )
            if table is None:
                table = self._create(manifest, footers)
                marker = self.marker_of(table, manifest)
                if decide(marker, manifest, ctx, self.mode, self.aborted_of(table, manifest)):
                    return self._already(manifest, marker, locations)
            data_files = self._data_files(table, manifest, locations, footers)
            deletes, replaced = self._files_to_delete(
                table, manifest, marker, base, superseded_attempt(ctx, manifest)
            )
            try:
                snapshot = call_with_events(
                    ctx,
                    "table_commit",
                    partial(self._commit, table, manifest, ctx, marker, data_files, deletes, replaced),
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
            result = PublishResult(
                outcome=PublishOutcome.PUBLISHED,
                published=len(data_files),
                target_files=locations,
                snapshot=str(snapshot),
                rows=manifest.total_rows,
            )
            result.files_rolled_back = len(deletes)
            if self.mode == "overwrite":
                result.partitions_replaced = manifest.replaced_partitions()
            return result
        raise TableCommitConflict(
            f"Iceberg table {self.identifier} changed under each of {MAX_COMMIT_ATTEMPTS} commit attempts of "
            f"{manifest.pipeline}/{manifest.checkpoint_key} (last: {last_conflict}); nothing was published, "
            "retry the commit"
        )

    def publish_group(self, members: list[Any]) -> list[PublishResult | Exception]:
        """Several checkpoints in one snapshot, each with its own marker (:class:`~.base.GroupPublisher`)."""
        from airflow_provider_walsink.core.targets.iceberg_group import publish_group

        return publish_group(self, members)

    def _already(self, manifest: Manifest, marker: Marker | None, locations: list[str]) -> PublishResult:
        return PublishResult(
            outcome=PublishOutcome.ALREADY_PUBLISHED,
            already=manifest.expected_count,
            target_files=locations,
            snapshot=marker.snapshot if marker else None,
            rows=manifest.total_rows,
        )

    def _commit(
        self,
        table: Table,
        manifest: Manifest,
        ctx: PublisherContext,
        marker: Marker | None,
        data_files: list[DataFile],
        deletes: list[DataFile],
        replaced: Sequence[str] = (),
    ) -> int:
        """One transaction, library retries off: snapshot + marker (+ the holder of each replaced
        partition), or ``CommitFailedException``."""
        tx = without_library_retries(table).transaction()
        summary = {
            "walsink.pipeline": manifest.pipeline,
            "walsink.checkpoint": manifest.checkpoint_key,
            "walsink.sequence": str(manifest.sequence),
            "walsink.attempt-id": manifest.attempt_id,
            "walsink.epoch": str(ctx.epoch),
        }
        update = tx.update_snapshot(snapshot_properties=summary)
        producer = update.overwrite() if deletes else update.fast_append()
        if deletes:
            _one_manifest_evaluator_per_manifest(producer)
        with producer:
            for df in deletes:
                producer.delete_data_file(df)
            for df in data_files:
                producer.append_data_file(df)
        previous = list(marker.previous) if marker else []
        if marker and marker.attempt_id != manifest.attempt_id:
            previous.append(marker.attempt_id)
        value: dict[str, Any] = {
            "attempt_id": manifest.attempt_id,
            "epoch": ctx.epoch,
            "snapshot": str(producer.snapshot_id),
            "previous": previous[-20:],
            "files": len(data_files),
        }
        offsets = offsets_value(manifest)
        if offsets is not None:
            value["offsets"] = offsets
        props = {marker_property(manifest): json.dumps(value, sort_keys=True)}
        holder = json.dumps({"checkpoint": manifest.checkpoint_key, "attempt_id": manifest.attempt_id})
        for partition in replaced:
            props[partition_property(manifest.pipeline, partition)] = holder
        if table.metadata.name_mapping() is None:
            # Staged files carry no Iceberg field ids: readers map their columns by name.
            props[TableProperties.DEFAULT_NAME_MAPPING] = table.schema().name_mapping.model_dump_json()
        tx.set_properties(props)
        tx.commit_transaction()
        return producer.snapshot_id

    # ------------------------------------------------------------------ files

    def _data_files(
        self, table: Table, manifest: Manifest, locations: list[str], footers: list[Any]
    ) -> list[DataFile]:
        """One ``DataFile`` per staged file, from its footer; partition from its Hive path (identity) or stats."""
        schema = table.schema()
        spec = table.spec()
        columns = {f.name: f.type for f in schema_to_pyarrow(schema, include_field_ids=False)}
        plan = compute_statistics_plan(schema, table.metadata.properties)
        mapping = parquet_path_to_id_mapping(schema)
        fields = [(pf, schema.find_column_name(pf.source_id)) for pf in spec.fields]
        identity = {name for pf, name in fields if isinstance(pf.transform, IdentityTransform)}
        result = []
        for c, location, meta in zip(manifest.committables, locations, footers, strict=True):
            pairs = dict(partition_of_path(c.path))
            file_schema = meta.schema.to_arrow_schema()
            problems = schema_problems(columns, file_schema, pairs, int96=int96_columns(meta))
            lost = [col for col in pairs if col not in identity and col not in file_schema.names]
            if lost:
                problems.append(
                    f"partition directories {lost} are not identity partitions of the table and not in the file"
                )
            if problems:
                raise IcebergTargetError(
                    f"staged file {c.path} does not match Iceberg table {self.identifier}: "
                    f"{'; '.join(problems)}; table unchanged"
                )
            stats = data_file_statistics_from_parquet_metadata(
                parquet_metadata=meta, stats_columns=plan, parquet_column_mapping=mapping
            )
            from_stats: Record | None = None
            values = []
            for i, (pf, name) in enumerate(fields):
                if name in pairs and isinstance(pf.transform, IdentityTransform):
                    values.append(_from_path(pairs[name], schema.find_field(pf.source_id).field_type, c.path))
                else:
                    if from_stats is None:
                        from_stats = stats.partition(spec, schema)
                    values.append(from_stats[i])
            result.append(
                DataFile.from_args(
                    content=DataFileContent.DATA,
                    file_path=location,
                    file_format=FileFormat.PARQUET,
                    partition=Record(*values),
                    file_size_in_bytes=c.size,
                    sort_order_id=None,
                    spec_id=table.metadata.default_spec_id,
                    equality_ids=None,
                    key_metadata=None,
                    **stats.to_serialized_dict(),
                )
            )
        return result

    def _files_to_delete(
        self, table: Table, manifest: Manifest, marker: Marker | None, base: str, supersedes: str | None
    ) -> tuple[list[DataFile], list[str]]:
        """Files this commit removes, and the partitions it replaces (``overwrite``).

        ``overwrite`` replaces the interval's partitions and, for a reprocess, every partition
        the checkpoint holds (its holder property): whatever files maintenance put there, they
        hold only this checkpoint's rows. An older attempt's files of this checkpoint (a retry,
        or the committed version a reprocess supersedes) are removed too; for a reprocess with
        no partition to replace (``append``), :func:`check_retractable` first makes sure all of
        the superseded version's files are still live (identity by file survives no rewrite).
        """
        found: dict[str, DataFile] = {}
        replaced: list[str] = []
        held: list[str] = []
        if self.mode == "overwrite":
            replaced = list(manifest.replaced_partitions())
            if any(not p for p in replaced):
                raise LayoutError(
                    f"overwrite needs a partitioned table: {manifest.pipeline}/{manifest.checkpoint_key} has "
                    "files outside any partition directory"
                )
        if table.current_snapshot() is None:
            return [], replaced
        if self.mode == "overwrite":
            if supersedes:
                held = [p for p in self.partitions_held(table, manifest) if p not in replaced]
                replaced += held
            schema = table.schema()
            spec = table.spec()
            names = {schema.find_column_name(pf.source_id): pf for pf in spec.fields}
            records = set()
            predicates = []
            for partition in replaced:
                pairs = partition_of_path(partition + "/x")
                if [c for c, _ in pairs] != list(names) or not all(
                    isinstance(names[c].transform, IdentityTransform) for c, _ in pairs
                ):
                    raise LayoutError(
                        f"partition {partition!r} does not name the identity partition columns "
                        f"{list(names)} of Iceberg table {self.identifier}; table unchanged"
                    )
                typed = [_from_path(v, schema.find_field(c).field_type, partition) for c, v in pairs]
                records.add(tuple(typed))
                terms = [EqualTo(c, v) for (c, _), v in zip(pairs, typed, strict=True)]
                predicates.append(terms[0] if len(terms) == 1 else And(*terms))
            if predicates:
                row_filter = predicates[0] if len(predicates) == 1 else Or(*predicates)
                for task in table.scan(row_filter=row_filter).plan_files():
                    df = task.file
                    if tuple(df.partition) in records:
                        found[df.file_path] = df
        if supersedes or (marker is not None and marker.attempt_id != manifest.attempt_id):
            # Retract what an older attempt of this checkpoint published (rare: a full scan). Its
            # files are the live ones staged under this checkpoint's directory by another attempt
            # (files are added by path, never copied), plus, for a reprocess, those the snapshot
            # that committed the superseded version added, wherever they were staged.
            prefix = as_uri(base.rsplit("/", 1)[0]) + "/"  # <root>/<pipeline>/<key>/
            ours = as_uri(base) + "/"
            added = self._added_by(table, marker, manifest) if supersedes and marker else set()
            older: dict[str, DataFile] = {}
            for task in table.scan(row_filter=AlwaysTrue()).plan_files():
                df = task.file
                path = df.file_path
                if (path.startswith(prefix) and not path.startswith(ours)) or path in added:
                    older[path] = df
            if supersedes and marker is not None and marker.attempt_id == supersedes:
                recorded = marker.files
                live = len(older)
                if recorded is None and added:
                    # A marker from before the file count: the committing snapshot still lists its files.
                    recorded, live = len(added), len(added & older.keys())
                if self.mode == "append" or recorded is None:
                    check_retractable(
                        manifest, supersedes, recorded, live, f"Iceberg table {self.identifier}"
                    )
            found.update(older)
        return list(found.values()), replaced

    @staticmethod
    def _added_by(table: Table, marker: Marker, manifest: Manifest) -> set[str]:
        """Data files the snapshot that committed ``marker``'s attempt added (empty once it is expired)."""
        if marker.snapshot is None or not marker.snapshot.isdigit():
            return set()
        snapshot = table.snapshot_by_id(int(marker.snapshot))
        if snapshot is None or (snapshot.summary or {}).get("walsink.attempt-id") != marker.attempt_id:
            return set()
        added = set()
        for listed in snapshot.manifests(table.io):
            if listed.added_snapshot_id != snapshot.snapshot_id:
                continue
            for entry in listed.fetch_manifest_entry(table.io, discard_deleted=True):
                if entry.snapshot_id == snapshot.snapshot_id and entry.status.name == "ADDED":
                    added.add(entry.data_file.file_path)
        return added

    def _create(self, manifest: Manifest, footers: list[Any]) -> Table:
        """Create the table from the first staged file (plus path partition columns), if asked to."""
        if not self.create_table:
            raise IcebergTargetError(
                f"Iceberg table {self.identifier} does not exist in catalog {self.catalog_name}; create it, or set "
                'extra={"create_table": True} to create it from the staged files on the first commit'
            )
        import pyarrow as pa

        if not footers:
            raise IcebergTargetError(
                f"Iceberg table {self.identifier} does not exist and checkpoint "
                f"{manifest.pipeline}/{manifest.checkpoint_key} staged no file to take its schema from"
            )
        int96 = sorted({col for meta in footers for col in int96_columns(meta)})
        if int96:
            raise IcebergTargetError(
                f"staged files of {manifest.pipeline}/{manifest.checkpoint_key} hold INT96 timestamps {int96}, which "
                "Iceberg cannot read: make Spark write TIMESTAMP_MICROS "
                "(spark.sql.parquet.outputTimestampType=TIMESTAMP_MICROS); table not created"
            )
        file_schema = footers[0].schema.to_arrow_schema()
        columns = list(self.partition_by or manifest.partition_columns)
        fields = list(file_schema) + [pa.field(c, pa.string()) for c in columns if c not in file_schema.names]
        try:
            schema = Catalog._convert_schema_if_needed(pa.schema(fields))
        except (TypeError, ValueError, UnsupportedPyArrowTypeException) as e:  # no Iceberg equivalent
            raise IcebergTargetError(
                f"cannot create Iceberg table {self.identifier}: {e}; table not created"
            ) from e
        spec = PartitionSpec(
            *(
                PartitionField(
                    source_id=schema.find_field(c).field_id,
                    field_id=1000 + i,
                    transform=IdentityTransform(),
                    name=c,
                )
                for i, c in enumerate(columns)
            )
        )
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
        marker = self.marker_of(table, manifest) if table is not None else None
        if marker is None or marker.attempt_id != manifest.attempt_id:
            return []  # not (or no longer) ours in the table: leave everything to the committer's GC

        def held_now(attempt_id: str) -> bool:
            now = self.load_table()
            current = self.marker_of(now, manifest) if now is not None else None
            # No marker now (the table was replaced or dropped): keep, never guess.
            return current is None or attempt_id in (current.attempt_id, *current.previous)

        return staging_storage(self.storage, layout).remove_unreferenced_attempts(
            checkpoint_location(root, manifest), manifest, held_now, fence=fence
        )


def _one_manifest_evaluator_per_manifest(producer: Any) -> None:
    """Work around a race in pyiceberg's overwrite (0.12): give each manifest its own evaluator.

    To find the files to delete, the producer evaluates the parent snapshot's
    manifests in a thread pool with one shared evaluator per partition spec,
    and that evaluator keeps the manifest being evaluated in an attribute: two
    threads interleaving make it judge one manifest by another's partition
    bounds, skip files it must delete, and fail the commit with "Missing
    required files to delete" (safe, nothing committed, but a failed publish).
    Without the private hook this does nothing, and the conflict retry in
    :meth:`IcebergPublisher.publish` still recovers.
    """
    build = getattr(producer, "_build_manifest_evaluator", None)
    if build is None:
        return
    producer._build_manifest_evaluator = lambda spec_id: lambda manifest: build(spec_id)(manifest)


def _from_path(value: str, iceberg_type: Any, where: str) -> Any:
    """A Hive path's partition value as the Iceberg value of an identity partition."""
    if value == HIVE_NULL:
        return None
    try:
        if isinstance(iceberg_type, StringType):
            return value
        if isinstance(iceberg_type, (IntegerType, LongType)):
            return int(value)
        if isinstance(iceberg_type, DateType):
            return date_str_to_days(value)
        if isinstance(iceberg_type, BooleanType):
            return {"true": True, "false": False}[value.lower()]
    except (ValueError, KeyError):
        raise LayoutError(f"{where}: partition value {value!r} is not a valid {iceberg_type}") from None
    raise LayoutError(
        f"{where}: partition columns of type {iceberg_type} cannot be read from a directory name; "
        "write the column into the files instead"
    )
