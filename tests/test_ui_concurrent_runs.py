"""Issue 25 item 4: two runs write the same interval; the committing one is named, and the
loser's error says which run committed it.

``twice`` (overwrite), checkpoint ``20260201T000000Z``: the scheduled run of DAG B starts
attempt 1, a backfill run of the same DAG starts attempt 2, seals it and commits; then the
scheduled run's attempt 1 tries to seal (a pipeline belongs to one DAG). ``race``: the same, but A tries to seal while B's attempt is
still being written.
"""

from __future__ import annotations

import pytest
from ui_fixtures import DAG_B, build_world

from airflow_provider_walsink.core.commit import CheckpointCommitter
from airflow_provider_walsink.core.commit.writer import CheckpointWriter
from airflow_provider_walsink.core.store import Actor, StaleAttemptError
from airflow_provider_walsink.core.targets import FilePublisher
from tests.test_cli import walsink

pytestmark = pytest.mark.airflow

KEY = "20260201T000000Z"
A = Actor(name="a", dag_id=DAG_B, run_id="scheduled__2026-02-01", task_id="write", try_number=1)
B = Actor(name="b", dag_id=DAG_B, run_id="backfill__2026-02-01", task_id="write", try_number=1)
B_COMMIT = Actor(name="b", dag_id=DAG_B, run_id="backfill__2026-02-01", task_id="commit", try_number=1)


def _begin(store, layout, pipeline: str, actor: Actor) -> CheckpointWriter:
    store.register(pipeline, KEY, mode="overwrite", actor=actor)
    writer = CheckpointWriter(store, layout, pipeline, KEY, actor=actor)
    directory = writer.begin()
    (directory / "dt=2026-02-01").mkdir()
    (directory / "dt=2026-02-01/part-0.csv").write_bytes(b"x\n")
    writer.add_files(
        {"dt=2026-02-01/part-0.csv": b"x\n"}, rows={"dt=2026-02-01/part-0.csv": 1}, writer="test-0"
    )
    return writer


def _seal(store, pipeline: str, writer: CheckpointWriter) -> None:
    """What the write task records once its Spark job sealed the manifest (``seal_manifest``)."""
    store.seal(
        pipeline,
        KEY,
        attempt=writer.attempt,
        manifest_uri="file:///staged/manifest.json",
        manifest_digest="sha256:" + "0" * 64,
        committables=1,
        rows=1,
        bytes=2,
        actor=writer.actor,
        attempt_id=writer.record.attempt_id,
    )


def add_concurrent_runs(world, tmp) -> dict[str, str]:
    """``twice`` and ``race`` as the module's docstring says; the losers' errors by pipeline."""
    store, layout = world.store, world.layout
    errors = {}
    for pipeline in ("twice", "race"):
        loser = _begin(store, layout, pipeline, A)
        winner = _begin(store, layout, pipeline, B)
        if pipeline == "race":
            with pytest.raises(StaleAttemptError) as raised:
                _seal(store, pipeline, loser)
            errors[pipeline] = str(raised.value)
        winner.seal()
        store.mark_durable(pipeline, KEY, attempt=winner.attempt, actor=B)
        publisher = FilePublisher(tmp / f"target-{pipeline}", "overwrite", layout=layout)
        CheckpointCommitter(store, layout, publisher, mode="overwrite").commit(pipeline, KEY, actor=B_COMMIT)
        if pipeline == "twice":
            with pytest.raises(StaleAttemptError) as raised:
                _seal(store, pipeline, loser)
            errors[pipeline] = str(raised.value)
    return errors


@pytest.fixture(scope="module")
def world(airflow_db, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("ui-concurrent")
    url = f"sqlite:///{tmp}/committer.db"
    with pytest.MonkeyPatch.context() as mp:
        for world in build_world(url, tmp, mp):
            world.errors = add_concurrent_runs(world, tmp)
            world.url = url
            yield world


def test_the_losers_error_names_the_run_that_committed(world):
    error = world.errors["twice"]
    assert f"the interval was committed by run backfill__2026-02-01 of DAG {DAG_B}" in error
    assert "nothing to fix" in error


def test_the_losers_error_names_the_run_that_took_over_while_it_wrote(world):
    error = world.errors["race"]
    assert f"attempt 2 was started after it by run backfill__2026-02-01 of DAG {DAG_B}" in error
    assert "Let that run finish" in error


def test_the_row_and_the_ui_name_the_committing_run(world):
    record = world.store.require("twice", KEY)
    assert (record.state.value, record.dag_id, record.run_id) == ("COMMITTED", DAG_B, "backfill__2026-02-01")
    body = world.client.get(
        f"/walsink/api/pipelines/twice/checkpoints/{KEY}", headers=world.headers("admin")
    ).json()
    assert body["checkpoint"]["airflow"]["run"] == f"/dags/{DAG_B}/runs/backfill__2026-02-01"
    page = world.client.get(
        f"/walsink/pipelines/twice/checkpoints/{KEY}", headers=world.headers("admin")
    ).text
    assert 'class="af-run" href="/dags/ui_dag_b/runs/backfill__2026-02-01"' in page
    # The committing DAG's tab lists it.
    tab = world.client.get(f"/walsink/api/dags/{DAG_B}/checkpoints", headers=world.headers("admin")).json()
    assert ("twice", KEY) in {(c["pipeline"], c["checkpoint_key"]) for c in tab["checkpoints"]}


def test_the_cli_names_the_committing_run(world):
    result = walsink("checkpoints", "--url", world.url, "--pipeline", "twice")
    assert result.returncode == 0, result.stderr
    line = next(line for line in result.stdout.splitlines() if KEY in line)
    assert f"{DAG_B} / backfill__2026-02-01" in line
