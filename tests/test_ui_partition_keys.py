"""Issue 47: a partitioned run's checkpoint named by its partition key as the user wrote it.

A partitioned run's checkpoint key is the encoded ``pk=...`` form (docs/backfill.md,
"Partitioned runs"); the JSON API carries the key as written beside it (``partition_key``),
finds a checkpoint by it, and the pages show it. The checkpoints are registered through
the store with their encoded keys, as the write task registers them (no Spark needed).
"""

from __future__ import annotations

import re
from urllib.parse import quote

import pytest
from ui_fixtures import DAG_A, build_world

from airflow_provider_walsink.core.protocol.partition_keys import checkpoint_key_for_partition
from airflow_provider_walsink.core.protocol.partitions import partition_dir
from airflow_provider_walsink.core.store import Actor
from tests.helpers import stage_checkpoint

pytestmark = pytest.mark.airflow

#: Registered in this order, which is not the keys' order.
KEYS = ["münchen-ü", "eu west 1", "a=b"]
ENCODED = {key: checkpoint_key_for_partition(key) for key in KEYS}


@pytest.fixture(scope="module")
def world(airflow_db, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("ui-pk")
    with pytest.MonkeyPatch.context() as mp:
        for world in build_world(f"sqlite:///{tmp}/committer.db", tmp, mp):
            for i, key in enumerate(KEYS):
                actor = Actor(name="w", dag_id=DAG_A, run_id=f"pk-{i}", task_id="write", try_number=1)
                stage_checkpoint(
                    world.store,
                    world.layout,
                    "regions",
                    ENCODED[key],
                    {
                        f"{partition_dir(['k'], [key])}/part-0.csv": b"r\n"
                    },  # k=a%3Db for a=b, as Spark writes it
                    actor=actor,
                    durable=key != "a=b",
                )
            world.store.fail("regions", ENCODED["a=b"], error="checksum mismatch", actor=actor)
            yield world


def _get(world, url: str, **kwargs):
    return world.client.get(url, headers=world.headers("admin"), **kwargs)


def test_the_json_names_each_checkpoint_by_its_partition_key_as_written(world):
    assert ENCODED["münchen-ü"] == "pk=m+C3+BCnchen-+C3+BC" and ENCODED["a=b"] == "pk=a+3Db"
    listed = _get(world, "/walsink/api/pipelines/regions/checkpoints").json()["checkpoints"]
    assert {c["checkpoint_key"]: c["partition_key"] for c in listed} == {ENCODED[k]: k for k in KEYS}
    pipeline = _get(world, "/walsink/api/pipelines/regions").json()
    assert pipeline["last_error"]["partition_key"] == "a=b"
    assert pipeline["last_error"]["checkpoint_key"] == "pk=a+3Db"
    # A checkpoint that is not a partition's says so with null.
    interval = _get(world, "/walsink/api/pipelines/sales_a/checkpoints/20260104T000000Z").json()
    assert interval["checkpoint"]["partition_key"] is None


def test_the_api_finds_a_checkpoint_by_its_partition_key_as_written(world):
    for key in KEYS:
        for given in (key, ENCODED[key]):
            url = f"/walsink/api/pipelines/regions/checkpoints/{quote(given, safe='')}"
            detail = _get(world, url)
            assert detail.status_code == 200, (given, detail.text)
            checkpoint = detail.json()["checkpoint"]
            assert (checkpoint["checkpoint_key"], checkpoint["partition_key"]) == (ENCODED[key], key)
            history = _get(world, f"{url}/history").json()["transitions"]
            assert history[0]["to_state"] == "REGISTERED"
    assert _get(world, "/walsink/api/pipelines/regions/checkpoints/wien").status_code == 404

    # The pipeline page's search: by the key as written, to the checkpoint's page.
    found = _get(
        world, "/walsink/pipelines/regions/find", params={"key": "eu west 1"}, follow_redirects=False
    )
    assert found.status_code == 303
    assert found.headers["location"].endswith(f"/checkpoints/{quote(ENCODED['eu west 1'])}")
    missing = _get(world, "/walsink/pipelines/regions/find", params={"key": "wien"}, follow_redirects=False)
    assert missing.status_code == 404 and "'wien' or 'pk=wien'" in missing.text


def _html(world, url: str) -> str:
    response = _get(world, url)
    assert response.status_code == 200, response.text
    return response.text


def test_the_pages_show_the_keys_as_written_the_timeline_in_partition_order(world):
    from html import escape

    for key in KEYS:
        page = _html(world, f"/walsink/pipelines/regions/checkpoints/{quote(ENCODED[key], safe='')}")
        heading = page[page.index("<h1>") : page.index("</h1>")]
        assert f'<span class="key" id="checkpoint-key">{escape(key)}</span>' in heading
        assert f"({escape(ENCODED[key])})" in heading  # the encoded key beside it

    pipeline = _html(world, "/walsink/pipelines/regions")
    timeline = pipeline[pipeline.index('id="timeline"') : pipeline.index("<h2>Checkpoints</h2>")]
    cells = [ENCODED[k] for k in KEYS]
    positions = [timeline.index(f"/checkpoints/{quote(c)}") for c in cells]
    # Partition key order (a=b, eu west 1, münchen-ü), not registration order (münchen-ü first).
    assert [KEYS[i] for i in sorted(range(3), key=positions.__getitem__)] == ["a=b", "eu west 1", "münchen-ü"]
    for key in KEYS:
        assert f"{escape(key)}: " in timeline
    assert 'action="/walsink/pipelines/regions/find"' in pipeline

    overview = _html(world, "/walsink/")
    regions = overview[overview.index('href="/walsink/pipelines/regions"') :]
    regions = regions[: regions.index("</tr>")]
    assert f">{escape('a=b')}</a>:" in regions  # its last error, by the key as written
    table = overview[overview.index('id="uncommitted"') :]
    for key in KEYS:
        assert f">{escape(key)}</a></td>" in table  # the not-committed list
    # Interval pipelines keep their keys and their order (oldest left).
    sales = _html(world, "/walsink/pipelines/sales_a")
    sales_cells = sales[sales.index('id="timeline"') : sales.index("<h2>Checkpoints</h2>")]
    assert [sales_cells.index(f"2026010{d}T000000Z") for d in range(1, 6)] == sorted(
        sales_cells.index(f"2026010{d}T000000Z") for d in range(1, 6)
    )


def test_partitions_replaced_read_in_the_same_characters(world, monkeypatch):
    """Spark escapes ``=`` (``k=a%3Db``) but not ``ü`` (``k=münchen-ü``): the page decodes
    the escapes, so every key reads as written; the JSON keeps the directories as named."""
    import dataclasses

    from airflow_provider_walsink.core.store.store import CommitterStore

    replaced = ["k=a%3Db", "k=eu west 1", "k=münchen-ü"]
    publication = {"target": "/data/regions", "kind": "files", "files": [], "partitions_replaced": replaced}
    real_get = CommitterStore.get

    def get(self, pipeline, key):
        record = real_get(self, pipeline, key)
        if pipeline == "regions" and record is not None:
            return dataclasses.replace(record, publication=publication)
        return record

    monkeypatch.setattr(CommitterStore, "get", get)
    page = _html(world, f"/walsink/pipelines/regions/checkpoints/{quote(ENCODED['a=b'], safe='')}")
    row = page[page.index("Partitions replaced</dt>") :]
    row = row[: row.index("</dd>")]
    shown = re.findall(r'<span title="[^"]*">([^<]*)</span>', row)
    assert "k=a%3Db<" not in row and "k=a%3Db," not in row
    assert shown == ["k=a=b", "k=eu west 1", "k=münchen-ü"]
    assert 'title="k=a%3Db"' in row  # the directory as the target names it, on hover
    api = _get(world, f"/walsink/api/pipelines/regions/checkpoints/{quote(ENCODED['a=b'], safe='')}").json()
    assert api["checkpoint"]["publication"]["partitions_replaced"] == replaced
    # The staged committables' partition reads the same way (the directory on hover, and in the JSON).
    table = page[page.index('<table class="grid committables">') :]
    assert '<td class="path" title="k=a%3Db">k=a=b</td>' in table[: table.index("</table>")]
    assert api["committables"]["items"][0]["partition"] == "k=a%3Db"
