"""Retrying store operations on transient database errors (safe: every operation is idempotent)."""

from __future__ import annotations

import functools
import logging
import random
import time
from collections.abc import Callable
from typing import ParamSpec, TypeVar

from sqlalchemy.exc import DBAPIError, OperationalError

log = logging.getLogger("airflow_provider_walsink.core.store.store")

P = ParamSpec("P")
T = TypeVar("T")

_RETRY_DELAYS_S = (0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 4.0)
# PostgreSQL serialization failure / deadlock; MySQL deadlock / lock wait timeout.
_TRANSIENT_SQLSTATES = {"40001", "40P01"}
_TRANSIENT_MYSQL_CODES = {1205, 1213}


def is_transient(exc: BaseException) -> bool:
    """True for database errors after which repeating the whole transaction is safe."""
    if isinstance(exc, DBAPIError) and exc.connection_invalidated:
        return True
    orig = getattr(exc, "orig", None)
    # psycopg2 names the SQLSTATE pgcode, psycopg 3 sqlstate.
    if (getattr(orig, "pgcode", None) or getattr(orig, "sqlstate", None)) in _TRANSIENT_SQLSTATES:
        return True
    args = getattr(orig, "args", ())
    if args and isinstance(args[0], int) and args[0] in _TRANSIENT_MYSQL_CODES | {2003, 2006, 2013}:
        return True
    if isinstance(exc, OperationalError):
        text = str(orig).lower()
        return any(
            s in text
            for s in (
                "database is locked",
                "could not connect",
                "server closed",
                "connection refused",
                "terminating connection",
                "connection",
            )
        )
    return False


def retrying(fn: Callable[P, T]) -> Callable[P, T]:
    """Repeat a store operation on transient database errors, with jittered backoff.

    Safe because every operation is idempotent (see the module docstring).
    """

    @functools.wraps(fn)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> T:
        for delay in (*_RETRY_DELAYS_S, None):
            try:
                return fn(*args, **kwargs)
            except DBAPIError as exc:
                if delay is None or not is_transient(exc):
                    raise
                log.warning(
                    "committer database: %s; retrying %s in %.2fs",
                    str(exc).splitlines()[0],
                    fn.__name__,
                    delay,
                )
                time.sleep(delay * (1 + random.random()))
        raise AssertionError("unreachable")

    return wrapper
