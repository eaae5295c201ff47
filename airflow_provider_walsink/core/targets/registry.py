"""Target URI → publisher, as pyiceberg picks a catalog and fsspec a file system.

``resolve_target(target, ...)`` accepts a publisher object (returned as is) or
a URI whose scheme names the target kind:

=====================================  ==========================================
``/data/t``, ``file:///data/t``         a directory of files (:mod:`.files`)
``iceberg://<catalog>/<ns>.<table>``    an Apache Iceberg table (:mod:`.iceberg`)
``delta:///data/t``, ``delta+s3://b/t`` a Delta Lake table (:mod:`.delta`)
``sql://<conn_id>/<schema>.<table>``    a PostgreSQL/MySQL table (:mod:`.sql`)
=====================================  ==========================================

Each kind is one module with one subclass of
:class:`~airflow_provider_walsink.core.targets.base.Publisher` (its
``from_uri(uri, options)`` class method builds it) and one line in
:data:`KNOWN_TARGETS`; nothing else names a kind. Modules load lazily, so a missing
optional library costs nothing until its kind is used, and then the error
names the extra to install. Third parties add a kind without touching
walsink: an entry point in the ``walsink.targets`` group (``scheme =
"package.module:Class"``) or :func:`register_target`.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from importlib.metadata import entry_points
from typing import Any
from urllib.parse import urlsplit

from airflow_provider_walsink.core.protocol.errors import PreflightError, WalsinkError
from airflow_provider_walsink.core.staging.layout import StagingLayout
from airflow_provider_walsink.core.targets.archive import PropertyArchive
from airflow_provider_walsink.core.targets.base import Publisher

ENTRY_POINT_GROUP = "walsink.targets"

#: scheme → ("module:Class", extra that installs its libraries or None)
KNOWN_TARGETS: dict[str, tuple[str, str | None]] = {
    "file": ("airflow_provider_walsink.core.targets.files:FilePublisher", None),
    "iceberg": ("airflow_provider_walsink.core.targets.iceberg:IcebergPublisher", "iceberg"),
    "delta": ("airflow_provider_walsink.core.targets.delta:DeltaPublisher", "delta"),
    "sql": ("airflow_provider_walsink.core.targets.sql:SqlPublisher", "postgres"),
}

#: Looks up a named connection (an Airflow connection id in the Airflow faces)
#: and returns its fields: ``conn_type``, ``host``, ``port``, ``login``,
#: ``password``, ``schema``, ``extra`` (a dict), or ``None`` (or raises
#: ``LookupError``) when no such connection exists. Any other exception is a
#: failed lookup and propagates: it never means "not configured". The core
#: never imports Airflow.
ConnectionResolver = Callable[[str], Mapping[str, Any] | None]


class TargetError(WalsinkError):
    """A target URI cannot be resolved to a publisher; the message says why."""


class TargetNotConfiguredError(TargetError, PreflightError, ValueError):
    """A target names something (a catalog, a connection) that is not configured.

    Raised instead of falling back to a default: the message names what is
    missing and how to configure it.
    """


class TargetUnreachableError(TargetError, PreflightError):
    """A configured target cannot be reached with its connection: no credentials in it, a bucket
    that does not exist, a catalog or database that does not answer. Raised by a target's
    ``check_writable()`` before the write phase; the message names the connection to fix."""


def lookup_connection(options: TargetOptions, conn_id: str, *, needed_by: str) -> Mapping[str, Any] | None:
    """The fields of connection ``conn_id``, or ``None`` if it does not exist.

    Raises:
        TargetNotConfiguredError: ``options`` has no connection lookup (outside
            Airflow), so a named connection cannot be honoured.
        Exception: whatever a failing lookup raises (a secrets backend down...),
            never read as "no such connection".
    """
    if options.connections is None:
        raise TargetNotConfiguredError(
            f"{needed_by} names connection {conn_id!r}, but there is no connection lookup here "
            "(outside Airflow): pass its settings in the target options instead (docs/targets.md)"
        )
    try:
        fields = options.connections(conn_id)
    except LookupError:
        return None
    return fields or None


def connection_missing(conn_id: str, *, needed_by: str, how: str) -> TargetNotConfiguredError:
    """The error for a named connection that does not exist, saying how to create it."""
    return TargetNotConfiguredError(
        f"{needed_by}: connection {conn_id!r} does not exist. Create it (Admin > Connections, "
        f"`airflow connections add {conn_id} ...`, or the environment variable "
        f"AIRFLOW_CONN_{conn_id.upper()}) {how}; walsink never falls back to a default (docs/targets.md)"
    )


@dataclass(frozen=True)
class TargetOptions:
    """What every publisher is built with, besides its URI.

    Every field but ``extra`` means the same for every kind (files, Iceberg, Delta, SQL) and every
    staging store; ``layout`` and ``connections`` are read by the kinds that need them (a local
    staging root: files, SQL; a named connection: Iceberg's catalog, Delta's ``conn_id``, SQL).
    """

    mode: str
    layout: StagingLayout
    #: Declared partition columns (``()``: none declared).
    partition_by: Sequence[str] = ()
    #: Verify each staged committable's checksum against the sealed manifest before publishing.
    #: Enforced by the commit sequence for every kind, not by publishers
    #: (``CheckpointCommitter(verify_checksums=...)``, core/commit/checksums.py); the file
    #: target also re-checks a file a crashed try already moved into the target.
    verify_checksums: bool = False
    #: Allow an ``overwrite`` commit to replace a partition last written by a
    #: newer checkpoint key (off: such a late retry is refused, invariant 10).
    allow_older_overwrite: bool = False
    connections: ConnectionResolver | None = None
    #: Kind-specific settings (catalog properties, create-table flags...).
    extra: Mapping[str, Any] = field(default_factory=dict)
    #: Where a table target archives a pipeline's oldest markers (:mod:`.archive`): the committer
    #: store. ``None`` (tools, the write task's checks): nothing is archived.
    property_archive: PropertyArchive | None = None


#: The keys of ``target_options`` that name a connection (never a secret): recorded on the
#: pipeline's row when the write task registers it, so a later abort opens the target with the
#: same connections (Delta's ``conn_id``; Iceberg's catalog and SQL's connection are named in
#: the URI itself, which is recorded as the pipeline's target). Not ``storage_options``,
#: ``catalog`` or ``url``: those may hold keys and passwords.
CONNECTION_REFERENCES: tuple[str, ...] = ("conn_id",)


def connection_references(extra: Mapping[str, Any] | None) -> dict[str, str]:
    """The connection references of a target's options (:data:`CONNECTION_REFERENCES`), as strings."""
    return {key: str(extra[key]) for key in CONNECTION_REFERENCES if extra and extra.get(key)}


def register_target(scheme: str, implementation: str | type, *, extra: str | None = None) -> None:
    """Add (or replace) a target kind: ``implementation`` is a class or ``"module:Class"``."""
    if isinstance(implementation, type):
        implementation = f"{implementation.__module__}:{implementation.__qualname__}"
    KNOWN_TARGETS[scheme] = (implementation, extra)


def target_scheme(target: str) -> str:
    """The kind named by a target URI; a bare absolute path is ``file``."""
    if os.path.isabs(target):
        return "file"
    scheme = urlsplit(target).scheme.lower()
    if not scheme:
        raise TargetError(
            f"target {target!r} is neither an absolute path nor a URI (file:///..., iceberg://..., "
            "delta:///..., sql://...)"
        )
    return scheme.split("+", 1)[0]


def publisher_class(scheme: str) -> type[Publisher]:
    """Load the class of a target kind, naming the extra to install when its library is missing."""
    spec = KNOWN_TARGETS.get(scheme)
    if spec is None:
        for ep in entry_points(group=ENTRY_POINT_GROUP):
            if ep.name == scheme:
                spec = (ep.value, None)
                break
    if spec is None:
        known = ", ".join(sorted(KNOWN_TARGETS))
        raise TargetError(
            f"no target kind {scheme!r}: known kinds are {known} (add one with the "
            f"{ENTRY_POINT_GROUP!r} entry point group or register_target())"
        )
    path, extra = spec
    module_name, _, class_name = path.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        hint = f'pip install "airflow-provider-walsink[{extra}]"' if extra else "install its package"
        raise TargetError(f"target kind {scheme!r} needs {exc.name or exc}: {hint}") from exc
    cls = getattr(module, class_name)
    if not (isinstance(cls, type) and issubclass(cls, Publisher)):
        # Callers read the contract's declared capabilities off the class: refuse anything else here.
        raise TargetError(
            f"target kind {scheme!r}: {path} is not a subclass of {Publisher.__module__}.Publisher"
        )
    return cls


def resolve_target(target: str | Publisher, options: TargetOptions) -> Publisher:
    """A publisher for ``target``: a publisher object as is, or one built from a URI."""
    if not isinstance(target, str):
        if not isinstance(target, Publisher):
            raise TargetError(
                f"target {target!r} is neither a URI nor a {Publisher.__module__}.Publisher (subclass it)"
            )
        return target
    cls = publisher_class(target_scheme(target))
    return cls.from_uri(target, options)
