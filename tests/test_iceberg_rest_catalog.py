"""Iceberg through a REST catalog (issue 45): unknown commit outcomes decided by the table's marker,
the official Iceberg provider's ``iceberg`` connection, and refusals before anything is written.

The catalog is a real HTTP server speaking the Iceberg REST protocol over pyiceberg's
``SqlCatalog`` (``tests/iceberg_rest.py``), with faults injected per request: the commit applied
and then answered 500/502/504, the connection dropped after applying, an answer held past the
client's time-out, and, applied nothing: 503, 409 and an expired token. Each is committed through
the real commit sequence (``CheckpointCommitter``: lease and table fencing, alone and as a group)
from local and S3 (moto) staging, and must end with the checkpoint COMMITTED exactly once, each row
in the table once, one table commit per checkpoint, and every data file any snapshot references
still on storage.
"""

from __future__ import annotations

from collections import Counter
from datetime import timedelta
from pathlib import Path

import pytest
from pyiceberg.partitioning import PartitionField, PartitionSpec
from pyiceberg.schema import Schema
from pyiceberg.transforms import IdentityTransform
from pyiceberg.types import LongType, NestedField, StringType

from airflow_provider_walsink.core.commit import CheckpointCommitter
from airflow_provider_walsink.core.protocol import CheckpointState as S
from airflow_provider_walsink.core.protocol.manifest import digest_of
from airflow_provider_walsink.core.store import CommitterStore
from airflow_provider_walsink.core.targets.iceberg import IcebergPublisher
from airflow_provider_walsink.core.targets.iceberg.catalog import catalog_properties_from_connection
from airflow_provider_walsink.core.targets.iceberg.outcome import CommitOutcomeUnknownError
from airflow_provider_walsink.core.targets.iceberg.publisher import WRITE_PROBE_PROPERTY
from airflow_provider_walsink.core.targets.registry import (
    TargetNotConfiguredError,
    TargetOptions,
    TargetUnreachableError,
    resolve_target,
)
from tests.helpers import ACTOR
from tests.iceberg_rest import CLIENT_ID, CLIENT_SECRET, RestCatalogServer
from tests.table_fixtures import Place, s3_server, stage_attempt, staging_of  # noqa: F401

pytestmark = pytest.mark.slow

PIPELINE = "events"
#: The client's time-out in these tests, and how long a "slow" answer is held past it.
TIMEOUT_S = 1.0
SLOW_S = 3.0
APPLIED = ["500", "502", "504", "drop", "slow"]
NOT_APPLIED = ["503", "409", "401"]


def rows_of(i: int) -> list[tuple[str, int, str]]:
    day = f"2026-01-{i + 1:02d}"
    return [(day, 10 * i + n, f"r{i}-{n}") for n in range(3)]


def key_of(i: int) -> str:
    return f"2026010{i + 1}T000000Z"


# ----------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="session")
def rest_servers(tmp_path_factory):
    """One REST catalog per place (local tables; tables on the S3 server), started on first use."""
    servers: dict[str, RestCatalogServer] = {}

    def get(place: Place) -> RestCatalogServer:
        if place.kind not in servers:
            # The catalog's server chooses where tables live: on the S3 server for tables there.
            props = (
                {**place.s3.iceberg_properties(), "warehouse": place.uri("rest-warehouse")}
                if place.s3
                else {}
            )
            servers[place.kind] = RestCatalogServer(tmp_path_factory.mktemp(f"rest-{place.kind}"), props)
        return servers[place.kind]

    yield get
    for server in servers.values():
        server.stop()


@pytest.fixture(params=["local", "s3"])
def place(request, tmp_path) -> Place:
    if request.param == "local":
        return Place("local", (tmp_path / "tables").as_uri())
    server = request.getfixturevalue("s3_server")
    return Place("s3", f"s3://{server.bucket}/{tmp_path.name}", server)


@pytest.fixture
def rest(place, rest_servers) -> RestCatalogServer:
    server = rest_servers(place)
    server.clear()
    yield server
    server.clear()


def catalog_props(rest: RestCatalogServer, place: Place) -> dict[str, str]:
    extra = place.s3.iceberg_properties() if place.s3 else {}
    return rest.properties(
        warehouse=place.uri("warehouse"), **extra, **{"walsink.request-timeout": str(TIMEOUT_S)}
    )


def publisher_of(rest: RestCatalogServer, place: Place, identifier: str) -> IcebergPublisher:
    """The table's publisher; the table is created first (a REST catalog names a new table's
    location only when it creates it, and the write phase stages inside that location)."""
    publisher = IcebergPublisher(
        identifier,
        "overwrite",
        catalog_name="rest",
        catalog_properties=catalog_props(rest, place),
        partition_by=["dt"],
    )
    create_events_table(publisher)
    return publisher


def create_events_table(publisher: IcebergPublisher) -> None:
    catalog = publisher.catalog
    catalog.create_namespace_if_not_exists(publisher.namespace)
    schema = Schema(
        NestedField(1, "dt", StringType(), required=False),
        NestedField(2, "id", LongType(), required=False),
        NestedField(3, "name", StringType(), required=False),
    )
    spec = PartitionSpec(PartitionField(source_id=1, field_id=1000, transform=IdentityTransform(), name="dt"))
    catalog.create_table_if_not_exists(publisher.identifier, schema=schema, partition_spec=spec)


def stage(store: CommitterStore, publisher: IcebergPublisher, place: Place, key: str, rows) -> str:
    """Register, stage an attempt under the table (where the write phase stages), seal, DURABLE."""
    root = publisher.staging_root()
    assert root is not None
    store.register(PIPELINE, key, mode="overwrite", actor=ACTOR, target="table")
    record = store.start_attempt(PIPELINE, key, actor=ACTOR, staging_root=root)
    manifest, attempt_dir = stage_attempt(
        place,
        root,
        PIPELINE,
        key,
        rows,
        attempt=record.attempt,
        attempt_id=record.attempt_id,
        sequence=record.sequence,
    )
    store.seal_manifest(
        manifest,
        manifest_uri=f"{attempt_dir}/_manifest.json",
        manifest_digest=digest_of(manifest.to_bytes()),
        actor=ACTOR,
    )
    store.mark_durable(PIPELINE, key, attempt=record.attempt, actor=ACTOR)
    return root


def committer(store, root, place, publisher, *, fencing: str, group: int) -> CheckpointCommitter:
    return CheckpointCommitter(
        store,
        staging_of(root, place.s3),
        publisher,
        mode="overwrite",
        fencing=fencing,
        group_commit=group,
        lease_ttl=timedelta(minutes=10),
    )


def referenced_files_missing(publisher: IcebergPublisher) -> list[str]:
    """Data files that some snapshot of the table references but storage no longer has."""
    table = publisher.load_table()
    missing = []
    for snapshot in table.snapshots():
        for listed in snapshot.manifests(table.io):
            for entry in listed.fetch_manifest_entry(table.io, discard_deleted=False):
                if not table.io.new_input(entry.data_file.file_path).exists():
                    missing.append(entry.data_file.file_path)
    return missing


def walsink_commits(publisher: IcebergPublisher) -> int:
    """Snapshots a walsink commit added (a single commit's or a group's)."""
    return sum(
        1
        for s in publisher.load_table().snapshots()
        if "walsink.attempt-id" in (s.summary or {}) or "walsink.group" in (s.summary or {})
    )


def committed_transitions(store: CommitterStore, key: str) -> int:
    return sum(1 for h in store.history(PIPELINE, key) if h.to_state == S.COMMITTED.value)


# ----------------------------------------------------------------------------- unknown outcomes


@pytest.mark.parametrize("fault", APPLIED + NOT_APPLIED)
@pytest.mark.parametrize("how", ["lease", "table", "group"])
def test_a_commit_whose_outcome_the_catalog_did_not_report_is_decided_by_the_marker(
    fault, how, place, rest, sqlite_store, tmp_path
):
    """The fault hits the first table commit. One commit call ends COMMITTED (no error recorded, no
    retry by Airflow needed), exactly once; each row once; one table commit per checkpoint (never
    the same files added twice); nothing any snapshot references was deleted."""
    identifier = f"ns.t_{tmp_path.name[-20:].replace('-', '_')}"
    publisher = publisher_of(rest, place, identifier)
    count = 3 if how == "group" else 1
    for i in range(count):
        root = stage(sqlite_store, publisher, place, key_of(i), rows_of(i))
    applied_before = rest.commits_applied
    rest.inject(fault, table=identifier, delay=SLOW_S)

    c = committer(
        sqlite_store,
        root,
        place,
        publisher,
        fencing="table" if how == "table" else "lease",
        group=16 if how == "group" else 0,
    )
    summary = c.commit(PIPELINE, key_of(0), actor=ACTOR)

    assert [log.fault for log in rest.log if log.fault] == [fault], "the fault was injected once"
    for i in range(count):
        record = sqlite_store.get(PIPELINE, key_of(i))
        assert record.state is S.COMMITTED, (key_of(i), record.state, record.error)
        assert committed_transitions(sqlite_store, key_of(i)) == 1
    assert not summary.already_committed
    expected = Counter(r for i in range(count) for r in rows_of(i))
    arrow = publisher.load_table().scan().to_arrow()
    assert Counter((r["dt"], r["id"], r["name"]) for r in arrow.to_pylist()) == expected
    assert walsink_commits(publisher) == 1, "one table commit for the checkpoint(s): nothing added twice"
    applied = rest.commits_applied - applied_before
    assert applied == 1, f"{applied} commits applied"
    assert referenced_files_missing(publisher) == []


def test_an_unknown_outcome_with_the_catalog_gone_is_recorded_uncommitted_and_the_next_try_decides(
    rest_servers, sqlite_store, tmp_path
):
    """The catalog applies the commit, answers 500, and is then down: the checkpoint is left
    uncommitted with the unknown outcome recorded (nothing deleted, no COMMITTED guessed); the
    next try, with the catalog back, finds the marker and records COMMITTED without a second
    table commit."""
    place = Place("local", (tmp_path / "tables").as_uri())
    rest = rest_servers(place)
    rest.clear()
    identifier = "ns.gone"
    publisher = publisher_of(rest, place, identifier)
    root = stage(sqlite_store, publisher, place, key_of(0), rows_of(0))
    rest.inject("500", table=identifier, then_down=True)  # applied, 500, then every request 503
    c = committer(sqlite_store, root, place, publisher, fencing="lease", group=0)
    try:
        with pytest.raises(CommitOutcomeUnknownError, match="did not report whether the commit"):
            c.commit(PIPELINE, key_of(0), actor=ACTOR)
    finally:
        rest.unavailable = False
    record = sqlite_store.get(PIPELINE, key_of(0))
    assert record.state is not S.COMMITTED
    assert "Nothing was deleted" in (record.error or ""), record.error
    assert referenced_files_missing(publisher) == []

    again = committer(
        sqlite_store, root, place, publisher_of(rest, place, identifier), fencing="lease", group=0
    )
    again.commit(PIPELINE, key_of(0), actor=ACTOR)
    assert sqlite_store.get(PIPELINE, key_of(0)).state is S.COMMITTED
    assert walsink_commits(publisher) == 1
    assert sorted(
        (r["dt"], r["id"], r["name"]) for r in publisher.load_table().scan().to_arrow().to_pylist()
    ) == sorted(rows_of(0))
    rest.clear()


# ----------------------------------------------------------------------------- the iceberg connection


def iceberg_connection(rest: RestCatalogServer, *, login=CLIENT_ID, password=CLIENT_SECRET, **extra) -> dict:
    return {
        "conn_id": "lakehouse",
        "conn_type": "iceberg",
        "host": rest.uri + "/",
        "login": login,
        "password": password,
        "port": None,
        "schema": None,
        "extra": {"warehouse": "file:///ignored-by-the-test-catalog", **extra},
    }


def test_an_iceberg_connection_is_read_as_the_iceberg_provider_reads_it():
    conn = {
        "conn_id": "lakehouse",
        "conn_type": "iceberg",
        "host": "https://catalog.example.invalid/api/catalog/",
        "login": "client",
        "password": "s3cret",
        "extra": {"uri": "https://stale.invalid", "warehouse": "analytics", "scope": "PRINCIPAL_ROLE:ALL",
                  "header.X-Iceberg-Access-Delegation": "vended-credentials"},
    }  # fmt: skip
    props = catalog_properties_from_connection(conn)
    assert props == {
        "uri": "https://catalog.example.invalid/api/catalog",  # the host wins, as IcebergHook's
        "type": "rest",
        "credential": "client:s3cret",
        "warehouse": "analytics",
        "scope": "PRINCIPAL_ROLE:ALL",
        "header.X-Iceberg-Access-Delegation": "vended-credentials",
    }
    # Not a REST catalog (Glue through the same connection type): no OAuth2 credential made up.
    glue = catalog_properties_from_connection({**conn, "host": None, "extra": {"type": "glue"}})
    assert "credential" not in glue and glue["type"] == "glue"


def test_a_table_configured_only_by_an_iceberg_connection_commits_and_never_shows_its_secret(
    rest_servers, sqlite_store, tmp_path
):
    place = Place("local", (tmp_path / "tables").as_uri())
    rest = rest_servers(place)
    rest.clear()
    conn = iceberg_connection(rest, warehouse=place.uri("warehouse"))
    options = TargetOptions(
        mode="overwrite",
        layout=None,
        partition_by=("dt",),
        extra={"create_table": True},
        connections=lambda conn_id: conn if conn_id == "lakehouse" else None,
    )
    publisher = resolve_target("iceberg://lakehouse/ns.by_connection", options)
    create_events_table(publisher)
    assert publisher.catalog_source == "connection 'lakehouse'"
    assert CLIENT_SECRET not in publisher.describe()
    before = publisher.load_table().metadata_location
    publisher.check_writable()  # its write probe (a commit that cannot apply) passes and changes nothing
    assert publisher.load_table().metadata_location == before
    assert WRITE_PROBE_PROPERTY not in publisher.load_table().properties
    root = stage(sqlite_store, publisher, place, key_of(0), rows_of(0))
    committer(sqlite_store, root, place, publisher, fencing="lease", group=0).commit(
        PIPELINE, key_of(0), actor=ACTOR
    )
    record = sqlite_store.get(PIPELINE, key_of(0))
    assert record.state is S.COMMITTED
    recorded = repr(record) + "".join(repr(h) for h in sqlite_store.history(PIPELINE, key_of(0)))
    assert CLIENT_SECRET not in recorded


@pytest.mark.parametrize("problem", ["wrong secret", "unreachable", "read-only token"])
def test_a_catalog_that_refuses_or_does_not_answer_is_refused_before_anything_is_written(
    problem, rest_servers, tmp_path
):
    place = Place("local", (tmp_path / "tables").as_uri())
    rest = rest_servers(place)
    rest.clear()
    conn = iceberg_connection(rest, password="not-the-secret")
    if problem != "wrong secret":
        conn = iceberg_connection(rest, warehouse=place.uri("warehouse"))
    if problem == "unreachable":
        conn["host"] = "http://127.0.0.1:9"  # discard port: nothing listens
    options = TargetOptions(
        mode="overwrite", layout=None, connections=lambda conn_id: conn if conn_id == "lakehouse" else None
    )
    publisher = resolve_target("iceberg://lakehouse/ns.refused", options)
    metadata = None
    if problem == "read-only token":  # the table exists and the token may read it, not write it
        create_events_table(publisher)
        rest.read_only.add("ns.refused")
        metadata = publisher.load_table().metadata_location
    expected = TargetUnreachableError if problem == "unreachable" else TargetNotConfiguredError
    with pytest.raises(expected) as refused:
        publisher.check_writable()
    message = str(refused.value)
    assert "connection 'lakehouse'" in message
    assert "not-the-secret" not in message and CLIENT_SECRET not in message
    if metadata is None:
        assert not Path(tmp_path / "tables").exists()
    else:
        assert "read the table but not write it" in message
        assert publisher.load_table().metadata_location == metadata  # nothing written
