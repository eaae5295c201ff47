"""Issue 35: the commit-state UI on S3 staging, with the walsink connection's own credentials.

Checkpoints staged on moto's S3 server (loopback) under an ``s3://`` root recorded on
their rows, as a table target on S3 stages them. The walsink connection names an ``aws``
connection (``staging_conn_id``) holding the keys and the endpoint; nothing ``AWS_*`` is in
the environment. Before the fix every such checkpoint page answered HTTP 500 ("staging
root 's3://…' is not a local or mounted path"). Now the page and the API list the
committables of a sealed or durable checkpoint, say "cleaned" for a committed one whose
staging is gone, and a store the connection cannot read is an "unavailable" notice
naming the problem, never a 500.
"""

from __future__ import annotations

import json
import uuid

import pytest
from airflow_stack import free_port
from ui_fixtures import build_world

from airflow_provider_walsink.core.commit.writer import CheckpointWriter
from airflow_provider_walsink.core.staging.object_store import StagingStore
from airflow_provider_walsink.core.store import Actor
from tests.table_fixtures import ACCESS_KEY, REGION, SECRET_KEY, s3_server  # noqa: F401

pytestmark = pytest.mark.airflow

AWS_CONN = "aws_ui_s3"
FILES = {"dt=2026-03-01/part-0.parquet": b"PAR1 not really\n", "dt=2026-03-01/part-1.parquet": b"x\ny\n"}
#: pipeline -> (state it is left in, its staging still there)
CHECKPOINTS = {
    "s3_durable": "DURABLE",
    "s3_sealed": "SEALED",
    "s3_committed": "COMMITTED",
    "s3_aborted": "ABORTED",
}
KEY = "20260301T000000Z"


def stage(store, staging: StagingStore, pipeline: str, actor: Actor) -> None:
    """Register with the s3:// root (as the write task does), write the objects, seal."""
    store.register(pipeline, KEY, mode="overwrite", actor=actor, staging_root=staging.root_uri)
    writer = CheckpointWriter(store, staging, pipeline, KEY, actor=actor)
    location = writer.begin()
    for rel, data in FILES.items():
        with staging.filesystem.open_output_stream(staging.committable(location, rel)) as out:
            out.write(data)
    writer.add_files(list(FILES), rows={rel: data.count(b"\n") for rel, data in FILES.items()}, writer="t")
    writer.seal()


@pytest.fixture(scope="module")
def world(airflow_db, tmp_path_factory, s3_server):  # noqa: F811
    tmp = tmp_path_factory.mktemp("ui-s3-staging")
    root = f"s3://{s3_server.bucket}/ui-{uuid.uuid4().hex[:8]}/_walsink_staging"
    staging = StagingStore.open(
        root,
        {
            "endpoint_url": s3_server.endpoint,
            "access_key": ACCESS_KEY,
            "secret_key": SECRET_KEY,
            "region": REGION,
        },
    )
    with pytest.MonkeyPatch.context() as mp:
        for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_ENDPOINT_URL", "AWS_PROFILE"):
            mp.delenv(name, raising=False)
        mp.setenv(f"AIRFLOW_CONN_{AWS_CONN.upper()}", json.dumps({
            "conn_type": "aws", "login": ACCESS_KEY, "password": SECRET_KEY,
            "extra": {"region_name": REGION, "endpoint_url": s3_server.endpoint},
        }))  # fmt: skip
        for world in build_world(f"sqlite:///{tmp}/committer.db", tmp, mp, {"staging_conn_id": AWS_CONN}):
            actor = Actor(name="write")
            for pipeline, state in CHECKPOINTS.items():
                stage(world.store, staging, pipeline, actor)
                if state != "SEALED":
                    world.store.mark_durable(pipeline, KEY, attempt=1, actor=actor)
            lease = world.store.acquire_lease(
                "s3_committed", KEY, owner="c", ttl=__import__("datetime").timedelta(minutes=5), actor=actor
            )
            world.store.mark_committed(lease, actor=actor)
            world.store.abort("s3_aborted", KEY, reason="INC-7", actor=actor)
            for pipeline in ("s3_committed", "s3_aborted"):  # clean-up after the commit / the abort
                staging.remove_attempt(
                    staging.attempt(pipeline, KEY, 1, world.store.require(pipeline, KEY).sealed_attempt_id)
                )
            yield world


def api(world, pipeline: str) -> dict:
    response = world.client.get(
        f"/walsink/api/pipelines/{pipeline}/checkpoints/{KEY}", headers=world.headers("admin")
    )
    assert response.status_code == 200, response.text
    return response.json()


@pytest.mark.parametrize("pipeline", ["s3_durable", "s3_sealed"])
def test_a_checkpoint_staged_on_s3_lists_its_committables_in_the_api_and_the_page(world, pipeline):
    body = api(world, pipeline)
    assert body["checkpoint"]["state"] == CHECKPOINTS[pipeline]
    assert body["checkpoint"]["staging_root"].startswith("s3://")
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


@pytest.mark.parametrize("pipeline", ["s3_committed", "s3_aborted"])
def test_a_committed_or_aborted_s3_checkpoint_whose_staging_is_gone_is_cleaned_not_an_error(world, pipeline):
    body = api(world, pipeline)
    assert body["checkpoint"]["state"] == CHECKPOINTS[pipeline]
    assert body["committables"]["status"] == "cleaned", body["committables"]
    assert body["history"][-1]["to_state"] == CHECKPOINTS[pipeline]


def test_a_store_the_connection_cannot_read_is_a_notice_not_a_server_error(world, monkeypatch):
    from airflow_provider_walsink.ui import app as ui_app

    monkeypatch.setenv(f"AIRFLOW_CONN_{AWS_CONN.upper()}", json.dumps({
        "conn_type": "aws", "login": ACCESS_KEY, "password": SECRET_KEY,
        "extra": {"region_name": REGION, "endpoint_url": f"http://127.0.0.1:{free_port()}"},  # nothing listens
    }))  # fmt: skip
    ui_app._hooks.clear()  # the UI caches the resolved connection for a minute
    try:
        committables = api(world, "s3_durable")["committables"]
    finally:
        ui_app._hooks.clear()
    assert committables["status"] == "unavailable", committables
    assert committables["message"]
