"""Issue 35 (S3) and issue 48 (GCS, Azure): the commit-state UI on object-store staging, with the
walsink connection's own credentials only.

Checkpoints staged under an object-store root recorded on their rows, as a table target on that
store stages them: ``s3://`` on moto's S3 server, ``gs://`` on fake-gcs-server, ``abfss://`` on
Azurite (each on loopback; one module's worlds per store). The walsink connection names the
store's connection (``staging_conn_id``: an ``aws``, ``google_cloud_platform`` or ``wasb`` one)
holding its credentials and endpoint; nothing ``AWS_*``/``GOOGLE_*``/``AZURE_*`` is in the
environment. Before issue 35 every such checkpoint page answered HTTP 500 ("staging root '…' is not
a local or mounted path"). Now the page and the API list the committables of a sealed or durable
checkpoint, say "cleaned" for a committed one whose staging is gone, the Abort (the API behind the
page's button) ends a durable one and removes its staged objects from the store, and a store the
connection cannot read is an "unavailable" notice naming the problem, never a 500.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from typing import Any

import pytest
from airflow_stack import free_port
from ui_fixtures import build_world

from airflow_provider_walsink.core.commit.writer import CheckpointWriter
from airflow_provider_walsink.core.staging.object_store import StagingStore
from airflow_provider_walsink.core.store import Actor
from tests.table_fixtures import ACCESS_KEY, REGION, SECRET_KEY, s3_server  # noqa: F401

pytestmark = pytest.mark.airflow

STORE_CONN = "ui_store"
FILES = {"dt=2026-03-01/part-0.parquet": b"PAR1 not really\n", "dt=2026-03-01/part-1.parquet": b"x\ny\n"}
#: pipeline -> the state it is left in
CHECKPOINTS = {
    "st_durable": "DURABLE",
    "st_sealed": "SEALED",
    "st_committed": "COMMITTED",
    "st_aborted": "ABORTED",
    "st_to_abort": "DURABLE",  # aborted through the UI's API by the test
}
KEY = "20260301T000000Z"
#: Variables that would give a store's client credentials from the environment: none may be set.
CREDENTIAL_VARIABLES = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_ENDPOINT_URL", "AWS_PROFILE",
                        "GOOGLE_APPLICATION_CREDENTIALS", "STORAGE_EMULATOR_HOST", "AZURE_STORAGE_KEY",
                        "AZURE_STORAGE_CONNECTION_STRING")  # fmt: skip


@dataclass
class Store:
    """One object store of the tests: a root on it, its options, its connection (and one to nowhere)."""

    kind: str
    root: str
    options: dict[str, Any]
    connection: dict[str, Any]
    unreachable: dict[str, Any]
    server: Any

    def keys(self, prefix: str) -> list[str]:
        return self.server.list(prefix)


def store_for(kind: str, request) -> Store:
    tag = f"ui-{uuid.uuid4().hex[:8]}/_walsink_staging"
    if kind == "s3":
        server = request.getfixturevalue("s3_server")
        extra = {"region_name": REGION, "endpoint_url": server.endpoint}
        conn = {"conn_type": "aws", "login": ACCESS_KEY, "password": SECRET_KEY, "extra": extra}
        options = {"endpoint_url": server.endpoint, "access_key": ACCESS_KEY, "secret_key": SECRET_KEY,
                   "region": REGION}  # fmt: skip
        return Store(kind, f"s3://{server.bucket}/{tag}", options, conn,
                     {**conn, "extra": {**extra, "endpoint_url": f"http://127.0.0.1:{free_port()}"}},  # nothing listens
                     server)  # fmt: skip
    if kind == "gs":
        server = request.getfixturevalue("gcs_server")
        extra = {"is_anonymous": True, "project": "walsink-test", "endpoint_url": server.endpoint}
        conn = {"conn_type": "google_cloud_platform", "extra": extra}
        # Not a dead port: pyarrow's GCS client retries a refused connection for up to 15 minutes
        # (its default retry limit). A server that is not GCS answers its requests with errors.
        other = request.getfixturevalue("s3_server").endpoint
        return Store(kind, f"gs://{server.bucket}/{tag}", server.options, conn,
                     {**conn, "extra": {**extra, "endpoint_url": other}}, server)  # fmt: skip
    server = request.getfixturevalue("azurite_server")
    conn = {"conn_type": "wasb", "host": server.endpoint, "login": server.account, "password": server.key}
    # A dead port (Azure's client retries it for about 5 s). Not another server: pyarrow 26's Azure
    # client aborts the whole process (SIGABRT) on a non-Azure answer to its manifest read (seen here
    # with moto's S3 server as the endpoint).
    nowhere = f"http://127.0.0.1:{free_port()}"
    return Store(kind, server.root(tag), server.options, conn,
                 {**conn, "host": f"{nowhere}/{server.account}"}, server)  # fmt: skip


def stage(store, staging: StagingStore, pipeline: str, actor: Actor) -> None:
    """Register with the store's root (as the write task does), write the objects, seal."""
    store.register(pipeline, KEY, mode="overwrite", actor=actor, staging_root=staging.root_uri)
    writer = CheckpointWriter(store, staging, pipeline, KEY, actor=actor)
    location = writer.begin()
    for rel, data in FILES.items():
        with staging.filesystem.open_output_stream(staging.committable(location, rel)) as out:
            out.write(data)
    writer.add_files(list(FILES), rows={rel: data.count(b"\n") for rel, data in FILES.items()}, writer="t")
    writer.seal()


@pytest.fixture(scope="module", params=["s3", "gs", "abfss"])
def world(request, airflow_db, tmp_path_factory):
    objects = store_for(request.param, request)
    tmp = tmp_path_factory.mktemp(f"ui-{objects.kind}-staging")
    staging = StagingStore.open(objects.root, objects.options)
    with pytest.MonkeyPatch.context() as mp:
        for name in CREDENTIAL_VARIABLES:
            mp.delenv(name, raising=False)
        mp.setenv(f"AIRFLOW_CONN_{STORE_CONN.upper()}", json.dumps(objects.connection))
        for world in build_world(f"sqlite:///{tmp}/committer.db", tmp, mp, {"staging_conn_id": STORE_CONN}):
            actor = Actor(name="write")
            for pipeline, state in CHECKPOINTS.items():
                stage(world.store, staging, pipeline, actor)
                if state != "SEALED":
                    world.store.mark_durable(pipeline, KEY, attempt=1, actor=actor)
            lease = world.store.acquire_lease(
                "st_committed", KEY, owner="c", ttl=__import__("datetime").timedelta(minutes=5), actor=actor
            )
            world.store.mark_committed(lease, actor=actor)
            world.store.abort("st_aborted", KEY, reason="INC-7", actor=actor)
            for pipeline in ("st_committed", "st_aborted"):  # clean-up after the commit / the abort
                staging.remove_attempt(
                    staging.attempt(pipeline, KEY, 1, world.store.require(pipeline, KEY).sealed_attempt_id)
                )
            world.objects, world.staging = objects, staging
            yield world


def api(world, pipeline: str) -> dict:
    response = world.client.get(
        f"/walsink/api/pipelines/{pipeline}/checkpoints/{KEY}", headers=world.headers("admin")
    )
    assert response.status_code == 200, response.text
    return response.json()


@pytest.mark.parametrize("pipeline", ["st_durable", "st_sealed"])
def test_a_checkpoint_staged_on_an_object_store_lists_its_committables_in_the_api_and_the_page(
    world, pipeline
):
    body = api(world, pipeline)
    assert body["checkpoint"]["state"] == CHECKPOINTS[pipeline]
    assert body["checkpoint"]["staging_root"] == world.objects.root
    committables = body["committables"]
    assert committables["status"] == "available", committables["message"]
    assert sorted(i["path"] for i in committables["items"]) == sorted(FILES)
    page = world.client.get(
        f"/walsink/pipelines/{pipeline}/checkpoints/{KEY}",
        headers={**world.headers("admin"), "Accept": "text/html"},
    )
    assert page.status_code == 200, page.text
    assert "not a local or mounted path" not in page.text
    for path in FILES:
        assert path in page.text


@pytest.mark.parametrize("pipeline", ["st_committed", "st_aborted"])
def test_a_committed_or_aborted_checkpoint_whose_staging_is_gone_is_cleaned_not_an_error(world, pipeline):
    body = api(world, pipeline)
    assert body["checkpoint"]["state"] == CHECKPOINTS[pipeline]
    assert body["committables"]["status"] == "cleaned", body["committables"]
    assert body["history"][-1]["to_state"] == CHECKPOINTS[pipeline]


def test_the_ui_aborts_a_durable_checkpoint_and_removes_its_staged_objects_from_the_store(world):
    """The Abort behind the page's button, through the API: the recorded root opened with the
    walsink connection's staging connection, the checkpoint ABORTED, its attempt's objects gone."""
    record = world.store.require("st_to_abort", KEY)
    prefix = world.staging.attempt("st_to_abort", KEY, 1, record.sealed_attempt_id).path.split("/", 1)[1]
    assert len(world.objects.keys(prefix)) == len(FILES) + 1  # the committables and the manifest
    response = world.client.post(
        f"/walsink/api/pipelines/st_to_abort/checkpoints/{KEY}/abort",
        json={"reason": "INC-48: wrong day", "attempt": 1},
        headers=world.headers("admin"),
    )
    assert response.status_code == 200, response.text
    outcome = response.json()
    assert (outcome["state"], outcome["previous_state"]) == ("ABORTED", "DURABLE"), outcome
    assert world.store.require("st_to_abort", KEY).state.value == "ABORTED"
    assert world.objects.keys(prefix) == []
    assert api(world, "st_to_abort")["committables"]["status"] == "cleaned"


def test_a_store_the_connection_cannot_read_is_a_notice_not_a_server_error(world, monkeypatch):
    from airflow_provider_walsink.ui import app as ui_app

    monkeypatch.setenv(f"AIRFLOW_CONN_{STORE_CONN.upper()}", json.dumps(world.objects.unreachable))
    ui_app._hooks.clear()  # the UI caches the resolved connection for a minute
    try:
        committables = api(world, "st_durable")["committables"]
    finally:
        ui_app._hooks.clear()
    assert committables["status"] == "unavailable", committables
    assert committables["message"]
