"""Issue 23 (issue 25, symptom 1): the UI reads a table target's checkpoint where it was staged.

An Iceberg or Delta target stages inside its table (``<location>/_walsink_staging``),
not under the connection's staging root. The write task records that root on the
checkpoint's row; the checkpoint page and API must list the committables of a
SEALED or DURABLE table checkpoint from there, not report its manifest missing.
"""

from __future__ import annotations

import pytest
from ui_fixtures import build_world

from airflow_provider_walsink.core.staging.layout import StagingLayout
from airflow_provider_walsink.core.store import Actor
from tests.helpers import stage_checkpoint
from tests.table_fixtures import local_table_spec
from tests.test_table_fence import make_publisher

pytestmark = pytest.mark.airflow

KEY = "20260301T000000Z"
#: kind -> (pipeline, state the checkpoint is left in)
TABLES = {"delta": ("lake_delta", "DURABLE"), "iceberg": ("lake_iceberg", "SEALED")}
FILES = {"dt=2026-03-01/part-0.parquet": b"PAR1 not really\n", "dt=2026-03-01/part-1.parquet": b"x\ny\n"}


@pytest.fixture(scope="module")
def world(airflow_db, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("ui-staging-root")
    with pytest.MonkeyPatch.context() as mp:
        for world in build_world(f"sqlite:///{tmp}/committer.db", tmp, mp):
            for kind, (pipeline, state) in TABLES.items():
                spec = local_table_spec(kind, tmp)
                table_root = StagingLayout(make_publisher(kind, spec, "overwrite").staging_root())
                assert table_root.root != world.layout.root
                actor = Actor(name="write")
                # As the write task registers it: with the root it stages under (the table's own).
                world.store.register(
                    pipeline,
                    KEY,
                    mode="overwrite",
                    actor=actor,
                    target=kind,
                    staging_root=str(table_root.root),
                )
                stage_checkpoint(world.store, table_root, pipeline, KEY, FILES, durable=state == "DURABLE")
                assert world.store.require(pipeline, KEY).state.value == state
            yield world


@pytest.mark.parametrize("kind", sorted(TABLES))
def test_the_api_lists_a_table_checkpoints_committables(world, kind):
    pipeline, state = TABLES[kind]
    body = world.client.get(
        f"/walsink/api/pipelines/{pipeline}/checkpoints/{KEY}", headers=world.headers("admin")
    ).json()
    assert body["checkpoint"]["state"] == state
    assert body["checkpoint"]["staging_root"].endswith("_walsink_staging")
    committables = body["committables"]
    assert committables["status"] == "available", committables["message"]
    assert sorted(i["path"] for i in committables["items"]) == sorted(FILES)
    assert committables["total"] == len(FILES)


@pytest.mark.parametrize("kind", sorted(TABLES))
def test_the_checkpoint_page_shows_no_missing_manifest_error(world, kind):
    pipeline, _ = TABLES[kind]
    page = world.client.get(
        f"/walsink/pipelines/{pipeline}/checkpoints/{KEY}",
        headers={**world.headers("admin"), "Accept": "text/html"},
    )
    assert page.status_code == 200
    assert "does not exist" not in page.text
    for path in FILES:
        assert path in page.text
