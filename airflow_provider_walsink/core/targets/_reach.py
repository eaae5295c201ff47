"""What the table targets' ``check_writable()`` share: reach a bucket or a catalog, quickly.

Used before the write phase (``core/commit/preflight.py``), so a wrong bucket, a connection
without credentials or a catalog that does not answer is refused before Spark starts, naming
the connection to fix (:class:`~.registry.TargetUnreachableError`). Nothing here writes.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from typing import Any, TypeVar
from urllib.parse import urlsplit

from airflow_provider_walsink.core.protocol.errors import NOTHING_DONE
from airflow_provider_walsink.core.targets._tables import S3Settings
from airflow_provider_walsink.core.targets.registry import TargetUnreachableError

T = TypeVar("T")

#: Seconds a check may wait for a store or a catalog before calling it unreachable.
REACH_TIMEOUT = 20.0
#: Storage options (upper-cased) that give deltalake credentials other than a key pair.
_OTHER_CREDENTIALS = (
    "AWS_PROFILE",
    "AWS_WEB_IDENTITY_TOKEN_FILE",
    "AWS_ROLE_ARN",
    "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI",
    "AWS_CONTAINER_CREDENTIALS_FULL_URI",
    "AWS_SKIP_SIGNATURE",
)


def within(seconds: float, call: Callable[[], T], *, what: str) -> T:
    """``call()``, or :class:`TimeoutError` naming ``what`` after ``seconds`` (the call is left to
    finish in a daemon thread: a client library without its own timeout cannot hang the task)."""
    outcome: dict[str, Any] = {}

    def run() -> None:
        try:
            outcome["value"] = call()
        except BaseException as exc:  # noqa: BLE001 - handed to the caller
            outcome["error"] = exc

    thread = threading.Thread(target=run, name="walsink-reach", daemon=True)
    thread.start()
    thread.join(seconds)
    if thread.is_alive():
        raise TimeoutError(f"{what} did not answer within {seconds:g}s")
    if "error" in outcome:
        raise outcome["error"]
    return outcome["value"]  # type: ignore[no-any-return]


def host_port(uri: str | None) -> str:
    """``host:port`` of a URI (a database URL or an endpoint), for a message; no credentials."""
    if not uri:
        return "(no uri)"
    parts = urlsplit(uri)
    if parts.scheme.startswith("sqlite"):
        return parts.path or uri
    try:
        port = parts.port
    except ValueError:
        port = None
    default = {"http": 80, "https": 443, "postgresql": 5432, "mysql": 3306}.get(parts.scheme.split("+")[0])
    return f"{parts.hostname or '?'}:{port or default or '?'}"


def one_line(exc: BaseException) -> str:
    text = str(getattr(exc, "orig", None) or exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__


def missing_credentials(options: Mapping[str, Any]) -> str | None:
    """What is missing from deltalake S3 storage options for them to hold credentials, or ``None``."""
    upper = {str(k).upper(): v for k, v in options.items()}
    key, secret = upper.get("AWS_ACCESS_KEY_ID"), upper.get("AWS_SECRET_ACCESS_KEY")
    if key and secret:
        return None
    if key or secret:
        return "only half an access key pair (login and password must both be set)"
    if any(upper.get(name) for name in _OTHER_CREDENTIALS):
        return None
    return "no credentials (its login/password, the access key pair, are empty and no AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY in its storage_options)"


def probe_filesystem(settings: S3Settings) -> Any:
    """A ``pyarrow`` S3 file system like ``settings.filesystem()``, with short timeouts and one retry."""
    import pyarrow.fs as pafs

    return settings.filesystem(
        connect_timeout=5,
        request_timeout=REACH_TIMEOUT,
        retry_strategy=pafs.AwsStandardS3RetryStrategy(max_attempts=2),
    )


def check_bucket(settings: S3Settings, location: str, *, target: str, connection: str) -> None:
    """The bucket of ``location`` (``s3://bucket/path``) exists and ``path`` can be looked up (a new
    table's directory need not exist) with ``settings``' credentials (:func:`check_location`)."""
    parts = urlsplit(location)
    where = f" at {settings.endpoint}" if settings.endpoint else ""
    check_location(
        lambda: probe_filesystem(settings),
        f"{parts.netloc}{parts.path}".rstrip("/"),
        location,
        target=target,
        connection=connection,
        where=where,
        fix="credentials, endpoint_url, region",
    )


def check_location(
    filesystem: Callable[[], Any],
    path: str,
    location: str,
    *,
    target: str,
    connection: str,
    where: str = "",
    fix: str = "credentials, endpoint_url",
) -> None:
    """``path``'s first component (the bucket or container) exists on ``filesystem()`` (a ``pyarrow``
    file system) and ``path`` can be looked up there (a new table's directory need not exist).

    Raises:
        TargetUnreachableError: naming ``target``, the bucket, what the store answered and ``connection``.
    """
    import pyarrow.fs as pafs

    bucket = path.split("/", 1)[0]
    try:
        fs = filesystem()
        found = within(REACH_TIMEOUT, lambda: fs.get_file_info(bucket).type, what=f"bucket {bucket}{where}")
        if found == pafs.FileType.NotFound:
            raise TargetUnreachableError(
                f"{target}: bucket {bucket!r}{where} does not exist (NoSuchBucket), or the credentials of "
                f"{connection} cannot see it: fix the target's bucket or that connection; {NOTHING_DONE}"
            )
        within(REACH_TIMEOUT, lambda: fs.get_file_info(path), what=f"{location}{where}")
    except TargetUnreachableError:
        raise
    except (OSError, TimeoutError) as exc:
        raise TargetUnreachableError(
            f"{target}: {location}{where} cannot be reached with {connection} ({one_line(exc)}): fix that "
            f"connection ({fix}); {NOTHING_DONE}"
        ) from None
