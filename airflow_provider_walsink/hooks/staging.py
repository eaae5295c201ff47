"""Object-store credentials for the staging root, from Airflow connections.

A ``gs://`` root takes a ``google_cloud_platform`` connection (the Google provider's type; the
provider itself need not be installed): :func:`gcs_options_from_connection`, below the S3 part.
An ``abfss://`` root takes a ``wasb`` or ``adls`` connection: ``hooks/azure_staging.py``.

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
#: The Google provider's connection type, and the connection a ``gs://`` root uses when the
#: walsink connection names none (as the provider's hooks default to it). It must exist: a
#: ``gs://`` root is never opened with credentials found in the process environment.
GCP_CONN_TYPE = "google_cloud_platform"
DEFAULT_GCP_CONN_ID = "google_cloud_default"
#: Extra fields of a ``google_cloud_platform`` connection that choose credentials staging cannot
#: use (the key must reach the Spark job as a key): refused, with the fix.
_GCP_UNSUPPORTED_EXTRA = {
    "key_secret_name": "a key in Secret Manager is not supported for the staging root",
    "credential_config_file": "workload identity federation is not supported for the staging root",
    "impersonation_chain": "impersonation is not supported for the staging root",
}
#: Extra fields read here (the rest, such as ``scope`` and ``num_retries``, are ignored, named in the log).
_GCP_READ_EXTRA = frozenset({"key_path", "keyfile_dict", "project", "is_anonymous", "endpoint_url"})
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
            if self.options.get("access_key"):
                keys = "keys"
            elif self.options.get("keyfile_dict"):
                keys = "a service-account key"
            elif self.options.get("anonymous"):
                keys = "anonymous"
            elif self.options.get("account_key"):
                keys = "an account key"
            else:
                keys = "no keys (default credential chain)"
            where = f"connection {self.conn_id!r} ({keys}"
            for name in ("region", "project", "endpoint_url"):
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
            "staging_conn_id: set it to an 'aws' connection for an s3:// root)"
        )
    return (
        f"connection {credentials.conn_id!r} (staging_conn_id of walsink connection {walsink_conn_id!r}; "
        f"{credentials.describe()})"
    )


def is_s3_root(root: str) -> bool:
    return urlsplit(root).scheme.lower() in ("s3", "s3a") if "://" in root else False


def is_gcs_root(root: str) -> bool:
    return urlsplit(root).scheme.lower() in ("gs", "gcs") if "://" in root else False


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
    say_ignored(conn_id, set(extra) - _READ_EXTRA - _READ_ELSEWHERE - set(_UNSUPPORTED_EXTRA))
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
        options["endpoint_url"] = checked_endpoint(conn_id, endpoint)
    return options


def provider_extra(
    conn: Any, conn_type: str, *, read: frozenset[str], unsupported: Mapping[str, str], fix: str
) -> dict[str, Any]:
    """A provider connection's extra as its provider reads it: bare names or the older
    ``extra__<conn_type>__<name>``. A field in ``unsupported`` (name -> why) is refused naming the
    connection, with ``fix``; fields neither read nor refused are said once in the log."""
    conn_id = getattr(conn, "conn_id", None)
    raw: Mapping[str, Any] = getattr(conn, "extra_dejson", None) or {}
    prefix = f"extra__{conn_type}__"
    extra = {k[len(prefix) :] if k.startswith(prefix) else k: v for k, v in raw.items()}
    for key, why in unsupported.items():
        if extra.get(key):
            raise StagingConnectionError(f"connection {conn_id!r} sets {key!r}: {why}; {fix}")
    say_ignored(conn_id, set(extra) - read - set(unsupported))
    return extra


def say_ignored(conn_id: str | None, names: set[str]) -> None:
    """Log once per process which extra fields of a connection staging does not read."""
    ignored = tuple(sorted(names))
    if ignored and (conn_id, ignored) not in _SAID_IGNORED:
        _SAID_IGNORED.add((conn_id, ignored))
        log.info("Connection %r: staging ignores the extra fields %s", conn_id, list(ignored))


def checked_endpoint(conn_id: str, endpoint: Any) -> str:
    """A connection's ``endpoint_url``, refused unless it is ``http(s)://host[:port]``."""
    parts = urlsplit(str(endpoint))
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise StagingConnectionError(
            f"connection {conn_id!r}: endpoint_url must look like http://host:port or "
            f"https://host, got {str(endpoint)!r}"
        )
    return str(endpoint)


def gcs_options_from_connection(conn: Any) -> dict[str, str]:
    """:meth:`StagingStore.open` options of a ``gs://`` root from a ``google_cloud_platform`` connection.

    Read as the Google provider reads them (bare extra names, or the older
    ``extra__google_cloud_platform__<name>``): ``keyfile_dict`` (the service account's JSON key)
    or ``key_path`` (a key file on the machine the task runs on, read here, so the job gets the
    key itself), ``project``, ``is_anonymous``; and walsink's own ``endpoint_url``
    (``http://host:port``: an emulator or a private endpoint). No key and not anonymous: Google's
    default credentials of the hosts (their attached service account), chosen by this connection.

    Raises:
        StagingConnectionError: a connection of another type, both or neither readable key given
            wrongly, a key file that cannot be read, a key that is not JSON, or a credential kind
            staging cannot carry to the job (Secret Manager, federation, impersonation).
    """
    import json

    conn_id = getattr(conn, "conn_id", None)
    if getattr(conn, "conn_type", None) != GCP_CONN_TYPE:
        raise StagingConnectionError(
            f"connection {conn_id!r} is of type {conn.conn_type!r}: a gs:// staging root needs a connection "
            f"of type {GCP_CONN_TYPE!r} (Google Cloud: extra keyfile_dict or key_path, project; "
            "docs/production.md)"
        )
    extra = provider_extra(
        conn,
        GCP_CONN_TYPE,
        read=_GCP_READ_EXTRA,
        unsupported=_GCP_UNSUPPORTED_EXTRA,
        fix="give the connection a service account's key (keyfile_dict or key_path), or no key so the "
        "hosts' default credentials are used",
    )
    options: dict[str, str] = {}
    key_path, keyfile = extra.get("key_path"), extra.get("keyfile_dict")
    if key_path and keyfile:
        raise StagingConnectionError(
            f"connection {conn_id!r} gives both key_path and keyfile_dict: give one service-account key"
        )
    if key_path:
        try:
            with open(str(key_path), encoding="utf-8") as f:
                keyfile = f.read()
        except OSError as e:
            raise StagingConnectionError(
                f"connection {conn_id!r}: key_path {str(key_path)!r} cannot be read ({e.strerror}); the key "
                "file must be on the machine the task runs on, or give its content as keyfile_dict"
            ) from None
    if keyfile:
        if isinstance(keyfile, str):
            try:
                keyfile = json.loads(keyfile)
            except ValueError:
                where = "the file at key_path" if key_path else "keyfile_dict"
                raise StagingConnectionError(
                    f"connection {conn_id!r}: {where} is not JSON (a service account's key file)"
                ) from None
        if not isinstance(keyfile, Mapping) or keyfile.get("type") != "service_account":
            raise StagingConnectionError(
                f"connection {conn_id!r}: the key is not a service account's JSON key (its 'type' must be "
                "'service_account')"
            )
        options["keyfile_dict"] = json.dumps(dict(keyfile))
    anonymous = extra.get("is_anonymous")
    if isinstance(anonymous, str):
        anonymous = anonymous.strip().lower() in ("1", "true", "yes")
    if anonymous:
        if "keyfile_dict" in options:
            raise StagingConnectionError(
                f"connection {conn_id!r} is anonymous and gives a key: give one or the other"
            )
        options["anonymous"] = "true"
    if extra.get("project"):
        options["project"] = str(extra["project"])
    endpoint = extra.get("endpoint_url")
    if endpoint:
        options["endpoint_url"] = checked_endpoint(conn_id, endpoint)
    return options
