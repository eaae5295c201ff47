"""A commit whose outcome the catalog did not report: decided from the table's own marker.

A REST catalog can apply a commit and then answer 500, 502, 503 or 504, or the connection
can drop (or time out) before its answer arrives. pyiceberg then raises
``CommitStateUnknownException`` (or the HTTP client's error): the commit *may* have landed.
Writers that cleaned up there deleted the files of what had become the current snapshot
(ClickHouse PRs 115390/115580, duckdb-iceberg PR 1120), and writers that simply retried
added the same files twice (redpanda-data/connect PR 4591); Iceberg has no client-side
reconciliation for REST (apache/iceberg issue 13866).

walsink's commit carries its marker (pipeline, checkpoint, attempt id, fencing token and the
snapshot id it adds), so the answer is in the table: on an unknown outcome the commit
sequence deletes and retracts nothing, reloads the table and reads the marker.

* The marker names this attempt → the commit landed: it is recorded COMMITTED (reported as
  published by this try when the marker names the snapshot this try built).
* It does not → the commit did not land *as of that load*; the next try is based on the state
  just loaded and asserts its branch head, exactly like any other retry. A commit still in
  flight at the catalog (a time-out) asserted an older head: at most one of the two lands, and
  whichever does, the next load finds its marker.
* The table cannot be loaded → :class:`CommitOutcomeUnknownError`, recorded on the checkpoint
  (uncommitted, retryable); nothing was deleted, and the next try decides the same way.

A 409 (``CommitFailedException``) and pyiceberg's ``ValidationException`` are not unknown: they
guarantee nothing landed (the normal conflict retry). Errors that say the request itself is
wrong (400, 403, 422) are raised as they are: retrying cannot help.
"""

from __future__ import annotations

import functools
import logging
from typing import Any

from pyiceberg.exceptions import CommitStateUnknownException, ServerError, ServiceUnavailableError

from airflow_provider_walsink.core.protocol.errors import WalsinkError
from airflow_provider_walsink.core.targets.iceberg.files import IcebergTargetError

log = logging.getLogger("airflow_provider_walsink.core.targets.iceberg")

#: Catalog property (walsink's, never sent to the catalog) bounding every request of a REST
#: catalog client, in seconds: pyiceberg sets no time-out, so a catalog that never answers
#: would hold the commit task for ever. A request past it is an unknown outcome.
REQUEST_TIMEOUT_PROPERTY = "walsink.request-timeout"
DEFAULT_REQUEST_TIMEOUT = 120.0


class CommitOutcomeUnknownError(WalsinkError):
    """The catalog did not report a commit's outcome and the table could not be loaded to decide it."""


class UnknownCommitOutcome(Exception):
    """Raised by a publisher's commit step: ``cause`` left the outcome unknown; the commit built
    ``snapshot_id`` (its marker names it if it landed)."""

    def __init__(self, cause: BaseException, snapshot_id: int | None) -> None:
        super().__init__(str(cause))
        self.cause = cause
        self.snapshot_id = snapshot_id


@functools.cache
def unknown_outcome_errors() -> tuple[type[BaseException], ...]:
    """What a commit call raises when the catalog may have applied it (module docstring); built once."""
    errors: list[type[BaseException]] = [CommitStateUnknownException, ServiceUnavailableError, ServerError]
    try:  # the REST client's transport: a dropped connection, a time-out
        import requests

        errors.append(requests.RequestException)
    except ImportError:  # pragma: no cover - pyiceberg's REST catalog needs requests
        pass
    try:  # a SQL catalog's database connection lost during its COMMIT
        from sqlalchemy.exc import DBAPIError

        errors.append(DBAPIError)
    except ImportError:  # pragma: no cover
        pass
    return tuple(errors)


def describe(exc: BaseException) -> str:
    """One line naming what left the outcome unknown (never the request's headers)."""
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text[:300]}" if text else type(exc).__name__


def bound_requests(catalog: Any, timeout: float) -> None:
    """Give every request of a REST catalog's HTTP session ``timeout`` seconds (module docstring of
    :data:`REQUEST_TIMEOUT_PROPERTY`); a catalog of another kind is left as it is."""
    session = getattr(catalog, "_session", None)  # pyiceberg's RestCatalog keeps a requests.Session
    if session is None or getattr(session, "_walsink_timeout", None) is not None:
        return
    request = session.request

    @functools.wraps(request)
    def with_timeout(method: str, url: str, **kwargs: Any) -> Any:
        kwargs.setdefault("timeout", timeout)
        return request(method, url, **kwargs)

    session.request = with_timeout
    session._walsink_timeout = timeout


def request_timeout(properties: dict[str, str]) -> float:
    """The configured :data:`REQUEST_TIMEOUT_PROPERTY` (popped: pyiceberg never sees it)."""
    raw = properties.pop(REQUEST_TIMEOUT_PROPERTY, None)
    if raw is None:
        return DEFAULT_REQUEST_TIMEOUT
    try:
        value = float(raw)
    except ValueError:
        value = 0.0
    if value <= 0:
        raise IcebergTargetError(
            f"catalog property {REQUEST_TIMEOUT_PROPERTY}={raw!r} must be a positive number of seconds"
        )
    return value
