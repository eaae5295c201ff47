"""An Iceberg REST catalog for the tests: the REST protocol served over pyiceberg's ``SqlCatalog``.

No catalog server installs here, so the tests serve the protocol themselves, as Iceberg's own
Java tests serve ``RESTCatalogAdapter`` over JDBC: a real HTTP server on a loopback port
speaking the REST catalog API (config, OAuth2 client-credentials tokens, namespaces, tables:
list, exists, load, create, commit with requirements and updates, drop), whose every table
operation is pyiceberg's ``SqlCatalog`` on an SQLite file. The wire format is pyiceberg's own
pydantic models of the REST spec, so what the client sends is parsed as the spec says.

Faults are injected here, at the adapter, per request (:meth:`RestCatalogServer.inject`):

* ``"500"``, ``"502"``, ``"504"`` after applying the commit (the catalog committed, then
  answered an error: pyiceberg raises ``CommitStateUnknownException``);
* ``"drop"``: the connection closed after applying, with no answer;
* ``"slow"``: the answer held back after applying, past the client's time-out;
* ``"409"``: another writer won (nothing applied);
* ``"503"``: the service unavailable *before* applying (nothing applied);
* ``"401"``: the token expired (nothing applied; the token is revoked, so the client fetches a
  new one and tries again).

It starts on port 0 (the OS picks a free one) in a daemon thread and stops with :meth:`stop`.
"""

from __future__ import annotations

import json
import secrets
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

import pytest
from pyiceberg.catalog.rest import CreateTableRequest
from pyiceberg.catalog.sql import SqlCatalog
from pyiceberg.exceptions import (
    CommitFailedException,
    NamespaceAlreadyExistsError,
    NoSuchNamespaceError,
    NoSuchTableError,
    TableAlreadyExistsError,
)
from pyiceberg.partitioning import UNPARTITIONED_PARTITION_SPEC
from pyiceberg.table import CommitTableRequest, CommitTableResponse
from pyiceberg.table.sorting import UNSORTED_SORT_ORDER

CLIENT_ID = "walsink-test-client"
CLIENT_SECRET = "walsink-test-secret-not-logged"

#: The faults :meth:`RestCatalogServer.inject` knows, and whether the commit is applied first.
APPLIED_FAULTS = {"500": 500, "502": 502, "504": 504, "drop": None, "slow": 200}
REFUSED_FAULTS = {"409": 409, "503": 503, "401": 401, "403": 403}

_ENDPOINTS = [
    "GET /v1/{prefix}/namespaces",
    "POST /v1/{prefix}/namespaces",
    "GET /v1/{prefix}/namespaces/{namespace}",
    "HEAD /v1/{prefix}/namespaces/{namespace}",
    "DELETE /v1/{prefix}/namespaces/{namespace}",
    "GET /v1/{prefix}/namespaces/{namespace}/tables",
    "POST /v1/{prefix}/namespaces/{namespace}/tables",
    "GET /v1/{prefix}/namespaces/{namespace}/tables/{table}",
    "HEAD /v1/{prefix}/namespaces/{namespace}/tables/{table}",
    "POST /v1/{prefix}/namespaces/{namespace}/tables/{table}",
    "DELETE /v1/{prefix}/namespaces/{namespace}/tables/{table}",
]


@dataclass
class Fault:
    kind: str
    #: Only commits to this table (``ns.table``); ``None``: any table.
    table: str | None = None
    times: int = 1
    #: ``"slow"``: seconds the answer is held back.
    delay: float = 5.0
    #: After this fault the catalog is down (every request answered 503) until ``unavailable`` is reset.
    then_down: bool = False


@dataclass
class RequestLog:
    method: str
    path: str
    status: int | None
    fault: str | None = None


@dataclass
class RestCatalogServer:
    """A running REST catalog (module docstring). ``properties()`` are what a client passes to pyiceberg."""

    root: Path
    backend_properties: dict[str, str] = field(default_factory=dict)
    host: str = "127.0.0.1"
    port: int = 0

    def __post_init__(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        props = {
            "uri": f"sqlite:///{self.root / 'rest-catalog.db'}",
            "warehouse": (self.root / "warehouse").as_uri(),
            **self.backend_properties,
        }
        self.catalog = SqlCatalog("rest-backend", **props)
        self.lock = threading.Lock()
        self.faults: list[Fault] = []
        self.tokens: set[str] = set()
        #: Tables whose commits and creation are forbidden (a token that may only read them).
        self.read_only: set[str] = set()
        self.log: list[RequestLog] = []
        #: Exceptions the adapter itself raised (a test of the adapter asserts there are none).
        self.errors: list[Exception] = []
        self.commits_applied = 0
        #: The catalog is down: every request, tokens included, is answered 503.
        self.unavailable = False
        server = self

        class Handler(_Handler):
            catalog_server = server

        self._httpd = ThreadingHTTPServer((self.host, self.port), Handler)
        self._httpd.daemon_threads = True
        self.port = self._httpd.server_address[1]
        self._thread = threading.Thread(target=self._httpd.serve_forever, name="iceberg-rest", daemon=True)
        self._thread.start()

    @property
    def uri(self) -> str:
        return f"http://{self.host}:{self.port}"

    def properties(self, **extra: str) -> dict[str, str]:
        """pyiceberg catalog properties of a client with the right OAuth2 credential."""
        return {"type": "rest", "uri": self.uri, "credential": f"{CLIENT_ID}:{CLIENT_SECRET}", **extra}

    def inject(
        self,
        kind: str,
        *,
        table: str | None = None,
        times: int = 1,
        delay: float = 5.0,
        then_down: bool = False,
    ) -> None:
        if kind not in APPLIED_FAULTS and kind not in REFUSED_FAULTS:
            raise ValueError(f"unknown fault {kind!r}")
        with self.lock:
            self.faults.append(Fault(kind, table, times, delay, then_down))

    def clear(self) -> None:
        with self.lock:
            self.faults.clear()
            self.read_only.clear()
            self.log.clear()
            self.unavailable = False

    @contextmanager
    def fault(self, kind: str, **kwargs: Any) -> Iterator[None]:
        self.inject(kind, **kwargs)
        try:
            yield
        finally:
            self.clear()

    def take_fault(self, table: str) -> Fault | None:
        with self.lock:
            for f in self.faults:
                if f.table in (None, table) and f.times > 0:
                    f.times -= 1
                    if f.times == 0:
                        self.faults.remove(f)
                    return f
        return None

    def stop(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(timeout=10)
        self.catalog.engine.dispose()


def _namespace(raw: str) -> tuple[str, ...]:
    return tuple(unquote(raw).split("\x1f"))


class _Handler(BaseHTTPRequestHandler):
    catalog_server: RestCatalogServer
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base class's name
        pass  # the tests read server.log, not stderr

    # ------------------------------------------------------------------ plumbing

    def _body(self) -> bytes:
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length) if length else b""

    def _send(
        self, status: int, payload: Any = None, *, fault: str | None = None, logged: bool = True
    ) -> None:
        data = (
            b""
            if payload is None
            else (payload if isinstance(payload, bytes) else json.dumps(payload).encode())
        )
        self.send_response(status)
        if data:
            self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if data and self.command != "HEAD":
            self.wfile.write(data)
        if logged:
            self.catalog_server.log.append(RequestLog(self.command, self.path, status, fault))

    def _error(self, status: int, kind: str, message: str, *, fault: str | None = None) -> None:
        self._send(status, {"error": {"message": message, "type": kind, "code": status}}, fault=fault)

    def _authorized(self) -> bool:
        header = self.headers.get("Authorization", "")
        token = header.removeprefix("Bearer ").strip()
        if token and token in self.catalog_server.tokens:
            return True
        self._error(401, "NotAuthorizedException", "Not authorized: token missing, unknown or expired")
        return False

    def _route(self) -> tuple[str, list[str]]:
        path = urlsplit(self.path).path.rstrip("/")
        parts = [p for p in path.split("/") if p]
        if parts[:1] != ["v1"]:
            return "", []
        return "/".join(parts[1:]), parts[1:]

    # ------------------------------------------------------------------ verbs

    def do_GET(self) -> None:  # noqa: N802 - http.server's names
        self._dispatch("GET")

    def do_HEAD(self) -> None:  # noqa: N802
        self._dispatch("HEAD")

    def do_POST(self) -> None:  # noqa: N802
        self._dispatch("POST")

    def do_DELETE(self) -> None:  # noqa: N802
        self._dispatch("DELETE")

    def _dispatch(self, method: str) -> None:
        body = self._body() if method in ("POST", "DELETE") else b""
        path, parts = self._route()
        server = self.catalog_server
        try:
            if server.unavailable:
                return self._error(503, "ServiceUnavailableException", "the catalog is down")
            if path == "config" and method == "GET":
                return self._send(200, {"defaults": {}, "overrides": {}, "endpoints": _ENDPOINTS})
            if path == "oauth/tokens" and method == "POST":
                return self._token(body)
            if not self._authorized():
                return None
            if parts[:1] == ["namespaces"]:
                with server.lock:
                    if len(parts) == 1:
                        return self._namespaces(method, body)
                    namespace = _namespace(parts[1])
                    if len(parts) == 2:
                        return self._one_namespace(method, namespace)
                    if len(parts) == 3 and parts[2] == "tables":
                        return self._tables(method, namespace, body)
                if len(parts) == 4 and parts[2] == "tables":
                    return self._table(method, namespace, unquote(parts[3]), body)
            return self._error(404, "NotFoundException", f"no route {method} {self.path}")
        except NoSuchTableError as exc:
            return self._error(404, "NoSuchTableException", str(exc))
        except NoSuchNamespaceError as exc:
            return self._error(404, "NoSuchNamespaceException", str(exc))
        except (TableAlreadyExistsError, NamespaceAlreadyExistsError) as exc:
            return self._error(409, "AlreadyExistsException", str(exc))
        except CommitFailedException as exc:
            return self._error(409, "CommitFailedException", str(exc))
        except Exception as exc:  # noqa: BLE001 - a bug of the adapter: said, not swallowed
            server.errors.append(exc)
            return self._error(500, "AdapterError", f"{type(exc).__name__}: {exc}")

    def _token(self, body: bytes) -> None:
        form = {k: v[0] for k, v in parse_qs(body.decode()).items()}
        if (form.get("client_id"), form.get("client_secret")) != (CLIENT_ID, CLIENT_SECRET):
            return self._send(
                401, {"error": "invalid_client", "error_description": "unknown client or wrong secret"}
            )
        token = secrets.token_hex(16)
        self.catalog_server.tokens.add(token)
        return self._send(200, {"access_token": token, "token_type": "bearer", "expires_in": 3600})

    def _namespaces(self, method: str, body: bytes) -> None:
        catalog = self.catalog_server.catalog
        if method == "GET":
            return self._send(200, {"namespaces": [list(ns) for ns in catalog.list_namespaces()]})
        request = json.loads(body or b"{}")
        namespace = tuple(request["namespace"])
        catalog.create_namespace(namespace, request.get("properties") or {})
        return self._send(200, {"namespace": list(namespace), "properties": request.get("properties") or {}})

    def _one_namespace(self, method: str, namespace: tuple[str, ...]) -> None:
        catalog = self.catalog_server.catalog
        if method == "DELETE":
            catalog.drop_namespace(namespace)
            return self._send(204)
        properties = catalog.load_namespace_properties(namespace)  # NoSuchNamespaceError: 404
        if method == "HEAD":
            return self._send(204)
        return self._send(200, {"namespace": list(namespace), "properties": properties})

    def _tables(self, method: str, namespace: tuple[str, ...], body: bytes) -> None:
        server = self.catalog_server
        if method == "GET":
            found = server.catalog.list_tables(namespace)
            return self._send(
                200, {"identifiers": [{"namespace": list(t[:-1]), "name": t[-1]} for t in found]}
            )
        raw = json.loads(body)
        for optional in ("location", "partition-spec", "write-order"):  # the client leaves out None
            raw.setdefault(optional, None)
        request = CreateTableRequest.model_validate(raw)
        if ".".join((*namespace, request.name)) in server.read_only:
            return self._error(403, "ForbiddenException", "this token may not create tables here")
        table = server.catalog.create_table(
            (*namespace, request.name),
            schema=request.table_schema,
            location=request.location,
            partition_spec=request.partition_spec or UNPARTITIONED_PARTITION_SPEC,
            sort_order=request.write_order or UNSORTED_SORT_ORDER,
            properties=request.properties,
        )
        return self._send(200, _load_result(table))

    def _table(self, method: str, namespace: tuple[str, ...], name: str, body: bytes) -> None:
        server = self.catalog_server
        identifier = (*namespace, name)
        if method != "POST":
            with server.lock:
                if method == "DELETE":
                    server.catalog.drop_table(identifier)
                    return self._send(204)
                table = server.catalog.load_table(identifier)
            return self._send(204) if method == "HEAD" else self._send(200, _load_result(table))
        return self._commit(identifier, body)

    def _commit(self, identifier: tuple[str, ...], body: bytes) -> None:
        server = self.catalog_server
        dotted = ".".join(identifier)
        request = CommitTableRequest.model_validate_json(body)
        fault = server.take_fault(dotted)
        kind = fault.kind if fault else None
        if dotted in server.read_only:
            return self._error(403, "ForbiddenException", f"this token may not write to table {dotted}")
        if kind in REFUSED_FAULTS:
            if kind == "401":
                server.tokens.clear()  # expired: the client must fetch a new token
            messages = {
                409: "Requirement failed: another writer committed first",
                503: "Service unavailable, try again later",
                401: "Token expired",
                403: "Forbidden",
            }
            status = REFUSED_FAULTS[kind]
            return self._error(status, "InjectedFault", messages[status], fault=kind)
        with server.lock:  # one commit at a time, as a catalog's compare-and-swap is
            table = server.catalog.load_table(identifier)
            response: CommitTableResponse = server.catalog.commit_table(
                table, request.requirements, request.updates
            )
            server.commits_applied += 1
            if fault is not None and fault.then_down:
                server.unavailable = True
        if kind is None:
            return self._send(200, response.model_dump_json().encode())
        if kind == "drop":
            # Applied, then the connection is gone before any answer: the client cannot know.
            server.log.append(RequestLog("POST", self.path, None, kind))
            self.close_connection = True
            self.connection.shutdown(socket.SHUT_RDWR)
            return None
        if kind == "slow":
            server.log.append(RequestLog("POST", self.path, 200, kind))
            time.sleep(fault.delay)  # past the client's time-out; the answer goes nowhere
            try:
                return self._send(200, response.model_dump_json().encode(), logged=False)
            except OSError:
                return None
        status = APPLIED_FAULTS[kind]
        assert status is not None
        return self._error(
            status, "InjectedFault", f"Internal error after the commit was applied ({status})", fault=kind
        )


def _load_result(table: Any) -> bytes:
    return json.dumps(
        {
            "metadata-location": table.metadata_location,
            "metadata": json.loads(table.metadata.model_dump_json()),
            "config": {},
        }
    ).encode()


@pytest.fixture(scope="session")
def rest_catalog(tmp_path_factory) -> Iterator[RestCatalogServer]:
    """One REST catalog on local files for the test session (tables live under its warehouse)."""
    server = RestCatalogServer(tmp_path_factory.mktemp("iceberg-rest"))
    yield server
    server.stop()
