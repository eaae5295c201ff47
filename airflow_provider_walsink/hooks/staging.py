"""Object-store credentials for the staging root, from Airflow connections.

An ``s3://`` staging root is reached with the credentials of an Airflow
connection of the amazon provider's type ``aws``, read here field by field as
that provider reads them (the provider itself need not be installed):

* **Login** / **Password**: access key id / secret access key (else the extra's
  ``aws_access_key_id`` / ``aws_secret_access_key``);
* extra ``aws_session_token``, ``region_name``;
* extra ``endpoint_url`` (an S3-compatible store: MinIO, Ceph, moto...), or
  ``service_config.s3.endpoint_url``, which wins for S3 as in the provider.

A connection with no keys means the default credential chain of whatever opens
the store (instance profile, IRSA, ``AWS_*`` variables, ``~/.aws``), with the
region and endpoint from the connection. What the provider can do and a plain
key pair cannot (``role_arn`` assume-role, ``profile_name``) is refused with
an error naming the connection, never silently replaced by other credentials.

Nothing here logs a secret; :class:`StagingCredentials`' ``repr`` names only
the connection and which fields are set.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from airflow_provider_walsink.core.protocol.errors import PreflightError

log = logging.getLogger(__name__)

#: The amazon provider's connection type.
AWS_CONN_TYPE = "aws"
#: The connection an ``s3://`` root uses when the walsink connection names none (as the
#: amazon provider's hooks default to it); absent, the default credential chain.
DEFAULT_AWS_CONN_ID = "aws_default"
#: Extra keys of an ``aws`` connection that change which credentials are used and that a
#: key pair handed to the Spark job cannot express: refused, with the fix.
_UNSUPPORTED_EXTRA = {
    "role_arn": "assume-role is not supported for the staging root",
    "profile_name": "a shared-credentials profile is not supported for the staging root",
    "session_kwargs": "session_kwargs are not supported for the staging root",
    "host": "the extra 'host' is the old name of the endpoint",
}
#: Extra keys read here or harmless to leave out (the rest are ignored, named in the log).
_READ_EXTRA = frozenset(
    {
        "aws_access_key_id",
        "aws_secret_access_key",
        "aws_session_token",
        "region_name",
        "endpoint_url",
        "service_config",
    }
)
#: Extra keys another part of walsink reads from the same ``aws`` connection: not "ignored".
_READ_ELSEWHERE = frozenset({"storage_options"})  # a Delta target's conn_id (core/targets/delta.py)
#: ``(conn_id, ignored keys)`` already said in this process: the connection is read several times
#: per task (preflight, the store, the job's environment), the line is worth reading once.
_SAID_IGNORED: set[tuple[str | None, tuple[str, ...]]] = set()


class StagingConnectionError(PreflightError, ValueError):
    """The staging root's connection cannot give its credentials; the message says how to fix it."""


@dataclass(frozen=True)
class StagingCredentials:
    """How to open one staging root: ``options`` for :meth:`StagingStore.open`, and where they came from.

    ``conn_id`` is ``None`` for the default credential chain. ``options`` may hold
    secrets: ``repr`` shows only which options are set.
    """

    conn_id: str | None
    options: dict[str, str] = field(default_factory=dict, repr=False)

    def __repr__(self) -> str:
        return f"StagingCredentials(conn_id={self.conn_id!r}, options={sorted(self.options)})"

    def describe(self) -> str:
        """One line for a task log, without a secret."""
        if self.conn_id is None:
            where = "the default credential chain"
        else:
            keys = "keys" if self.options.get("access_key") else "no keys (default credential chain)"
            where = f"connection {self.conn_id!r} ({keys}"
            for name in ("region", "endpoint_url"):
                if self.options.get(name):
                    where += f", {name} {self.options[name]}"
            where += ")"
        return where


def staging_connection(walsink_conn_id: str, root: str, credentials: StagingCredentials | None) -> str:
    """Which connection a refusal of ``root`` names as the one to fix (no secret)."""
    if not is_object_store_root(root):
        return f"the staging_root of walsink connection {walsink_conn_id!r} (a local path)"
    if credentials is None or credentials.conn_id is None:
        return (
            f"the default credential chain of this host (walsink connection {walsink_conn_id!r} names no "
            "staging_conn_id: set it to an 'aws' connection)"
        )
    return (
        f"connection {credentials.conn_id!r} (staging_conn_id of walsink connection {walsink_conn_id!r}; "
        f"{credentials.describe()})"
    )


def is_s3_root(root: str) -> bool:
    return urlsplit(root).scheme.lower() in ("s3", "s3a") if "://" in root else False


def is_object_store_root(root: str) -> bool:
    """A URI other than ``file://``: staged through ``pyarrow.fs``, never through local directories."""
    return "://" in root and urlsplit(root).scheme.lower() != "file"


def s3_options_from_connection(conn: Any) -> dict[str, str]:
    """:meth:`StagingStore.open` options of an ``s3://`` root from an ``aws`` connection.

    ``conn`` is an Airflow ``Connection`` (``conn_id``, ``conn_type``, ``login``,
    ``password``, ``extra_dejson``). Raises :class:`StagingConnectionError` for a
    connection of another type, half a key pair, or a setting a key pair cannot
    carry (``role_arn``, ``profile_name``).
    """
    conn_id = getattr(conn, "conn_id", None)
    if getattr(conn, "conn_type", None) != AWS_CONN_TYPE:
        raise StagingConnectionError(
            f"connection {conn_id!r} is of type {conn.conn_type!r}: an s3:// staging root needs a connection "
            f"of type {AWS_CONN_TYPE!r} (Amazon Web Services: login = access key id, password = secret "
            "access key, extra region_name / endpoint_url); docs/production.md"
        )
    extra: Mapping[str, Any] = getattr(conn, "extra_dejson", None) or {}
    for key, why in _UNSUPPORTED_EXTRA.items():
        if extra.get(key):
            fix = (
                "set endpoint_url in the extra instead"
                if key == "host"
                else "give the connection an access key pair, or leave it without keys so the hosts' "
                "default credential chain is used"
            )
            raise StagingConnectionError(f"connection {conn_id!r} sets {key!r}: {why}; {fix}")
    ignored = tuple(sorted(set(extra) - _READ_EXTRA - _READ_ELSEWHERE - set(_UNSUPPORTED_EXTRA)))
    if ignored and (conn_id, ignored) not in _SAID_IGNORED:
        _SAID_IGNORED.add((conn_id, ignored))
        log.info("Connection %r: staging ignores the extra fields %s", conn_id, list(ignored))
    options: dict[str, str] = {}
    login, password = getattr(conn, "login", None), getattr(conn, "password", None)
    if login or password:
        if not (login and password):
            raise StagingConnectionError(
                f"connection {conn_id!r} has only half an access key pair: give both the login (access key "
                "id) and the password (secret access key), or neither"
            )
        options["access_key"], options["secret_key"] = str(login), str(password)
    elif extra.get("aws_access_key_id") or extra.get("aws_secret_access_key"):
        if not (extra.get("aws_access_key_id") and extra.get("aws_secret_access_key")):
            raise StagingConnectionError(
                f"connection {conn_id!r} has only half an access key pair in its extra: give both "
                "aws_access_key_id and aws_secret_access_key (or use login and password)"
            )
        options["access_key"] = str(extra["aws_access_key_id"])
        options["secret_key"] = str(extra["aws_secret_access_key"])
    if extra.get("aws_session_token"):
        if "access_key" not in options:
            raise StagingConnectionError(
                f"connection {conn_id!r} has a session token but no access key pair: give both"
            )
        options["session_token"] = str(extra["aws_session_token"])
    if extra.get("region_name"):
        options["region"] = str(extra["region_name"])
    service = extra.get("service_config") or {}
    s3_config = service.get("s3") if isinstance(service, Mapping) else None
    endpoint = (s3_config or {}).get("endpoint_url") or extra.get("endpoint_url")
    if endpoint:
        parts = urlsplit(str(endpoint))
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise StagingConnectionError(
                f"connection {conn_id!r}: endpoint_url must look like http://host:port or "
                f"https://host, got {str(endpoint)!r}"
            )
        options["endpoint_url"] = str(endpoint)
    return options
