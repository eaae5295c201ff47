"""S3-staged Delta and Iceberg checkpoints through the real api-server, in headless Chromium, with
only the pipeline's connections: every checkpoint page and API route, the UI's Abort, and
``walsink abort`` / ``walsink gc``.

Real parts: the session's Airflow stack (``tests/airflow_stack.py``: its api-server serves the
walsink plugin from this checkout, and its environment holds no ``AWS_*`` variable, checked
here in ``/proc``), the shared Chromium (``test_ui_layout.browser``), moto's S3 server (the
session's ``s3_server``) holding both tables and their staging (``<table>/_walsink_staging``),
deltalake and pyiceberg (SQL catalog on SQLite, warehouse on the bucket), and the ``walsink``
command run with the stack's environment (no ``AWS_*`` either).

The connections, created as a user does (the REST API, so in the metadata database): the
``aws`` connection ``aws_default`` (moto's keys and endpoint: the staging store of an
``s3://`` root is opened with it, since the walsink connection names no other, and the Delta
target names it as its ``conn_id``) and the Iceberg catalog's connection. moto's endpoint is
nowhere else: nothing but those connections can reach the bucket.

Two ``append`` pipelines (Delta, Iceberg), four checkpoints each, registered as their write task
registers them (the table's own staging root, the target's connection references):
``K1`` COMMITTED (published into the table; its staging cleaned), ``K2`` ABORTED (the Iceberg
one by ``walsink abort``, the Delta one by what that command runs, in-process), ``K3`` FAILED (its commit failed; its staged data kept), ``K4`` DURABLE and
BLOCKED by ``K3`` (the Delta one also keeps an orphaned attempt 1 of a killed write try).
The two ``walsink`` processes run while the browser checks the Delta pages, each awaited where
its effect is first needed. Screenshots go to
``test-artifacts/ui-s3-tables/``.
"""

from __future__ import annotations

import io
import json
import os
import re
import subprocess
import sys
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from test_ui_layout import browser  # noqa: F401 - the shared Chromium fixture

from airflow_provider_walsink.core.commit import CheckpointCommitter
from airflow_provider_walsink.core.commit.writer import CheckpointWriter
from airflow_provider_walsink.core.staging.object_store import StagingStore
from airflow_provider_walsink.core.store import Actor, CommitterStore
from airflow_provider_walsink.core.targets.registry import (
    TargetOptions,
    connection_references,
    resolve_target,
)
from airflow_provider_walsink.hooks.aborts import aborter_for
from tests.table_fixtures import ACCESS_KEY, REGION, SECRET_KEY, s3_server  # noqa: F401

pytestmark = [pytest.mark.e2e, pytest.mark.browser]

REPO = Path(__file__).resolve().parent.parent
ARTIFACTS = REPO / "test-artifacts" / "ui-s3-tables"
SCREEN = {"width": 1280, "height": 800}
TIMEOUT_MS = 30_000
DAG_ID = "walsink_s3_example"  # the example DAG writing both kinds (the stack parses it)
K1, K2, K3, K4 = (f"2026030{d}T000000Z" for d in range(1, 5))
#: checkpoint -> its state in the UI, and what its committables section says
STATES = {K1: ("COMMITTED", "cleaned"), K2: ("ABORTED", "cleaned"), K3: ("FAILED", "available"),
          K4: ("DURABLE", "available")}  # fmt: skip
FILE = "part-00000.parquet"
#: The checkpoint each pipeline's UI Abort ends: a FAILED one (Delta) and a DURABLE blocked one (Iceberg).
UI_ABORT = {"delta": K3, "iceberg": K4}


def rows_of(key: str) -> pa.Table:
    """A checkpoint's rows: they name the checkpoint, so a table can be asked what it holds of it."""
    return pa.table({"id": pa.array([1, 2, 3], pa.int64()), "checkpoint": pa.array([key] * 3, pa.string())})


def actor(key: str, task: str) -> Actor:
    return Actor(
        name=f"{DAG_ID}.{task}", dag_id=DAG_ID, run_id=f"scheduled__{key}", task_id=task, try_number=1
    )


class Pipeline:
    """One pipeline into a table on the bucket, registered as its write task registers it."""

    def __init__(self, kind: str, name: str, target: str, target_options: dict, resolver: Any, store_options):
        self.kind, self.name, self.target, self.target_options = kind, name, target, target_options
        self.publisher = resolve_target(
            target, TargetOptions(mode="append", layout=None, connections=resolver, extra=target_options)
        )
        self.root = self.publisher.staging_root()
        assert self.root and self.root.startswith("s3://") and self.root.endswith("/_walsink_staging")
        self.staging = StagingStore.open(self.root, store_options)

    def stage(self, store: CommitterStore, key: str, *, seal: bool = True) -> Any:
        store.register(self.name, key, mode="append", actor=actor(key, "write"), target=self.target,
                       staging_root=self.root, target_connections=connection_references(self.target_options))  # fmt: skip
        writer = CheckpointWriter(store, self.staging, self.name, key, actor=actor(key, "write"))
        location = writer.begin()
        buf = io.BytesIO()
        pq.write_table(rows_of(key), buf)
        with self.staging.filesystem.open_output_stream(self.staging.committable(location, FILE)) as out:
            out.write(buf.getvalue())
        if seal:
            writer.add_files([FILE], rows={FILE: 3}, writer="executor-0")
            writer.seal()
            store.mark_durable(self.name, key, attempt=writer.attempt, actor=actor(key, "durable"))
        return location

    def table_rows(self) -> list[tuple[int, str]]:
        table = self.publisher.load_table()
        arrow = table.scan().to_arrow() if self.kind == "iceberg" else table.to_pyarrow_table()
        return sorted((r["id"], r["checkpoint"]) for r in arrow.to_pylist())

    def prefix(self, key: str) -> str:
        """The bucket prefix of a checkpoint's staged attempts."""
        return f"{self.root.split('/', 3)[3]}/{self.name}/{key}/"


def api_connection(conn_id: str, body: dict) -> dict:
    return {"connection_id": conn_id, **{k: v for k, v in body.items() if k != "extra"},
            "extra": json.dumps(body.get("extra") or {})}  # fmt: skip


def environ_of(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    return dict(item.decode(errors="replace").split("=", 1) for item in raw if b"=" in item)


def walsink(stack, *args: str) -> subprocess.Popen:
    """Start the ``walsink`` command as an operator runs it on an Airflow host of the stack: the
    stack's environment (its metadata database holds the connections), no ``AWS_*`` variable.
    Started, not waited for: it runs while this process does other work (CI time)."""
    env = {k: v for k, v in stack.env.items() if not k.startswith("AWS_")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    script = Path(sys.executable).with_name("walsink")
    command = (
        [str(script)] if script.exists() else [sys.executable, "-m", "airflow_provider_walsink.cli.commands"]
    )
    return subprocess.Popen(
        [*command, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=REPO
    )


def finished(proc: subprocess.Popen) -> Any:
    """The command's JSON result, once it ended with status 0."""
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err
    return json.loads(out)


@pytest.fixture(scope="module")
def lake(airflow_stack, s3_server, tmp_path_factory):  # noqa: F811
    stack, tmp, tag = airflow_stack, tmp_path_factory.mktemp("ui-s3-tables"), uuid.uuid4().hex[:8]
    bucket, prefix = s3_server.bucket, f"ui-s3-tables-{tag}"
    catalog = f"walsink_ui_lake_{tag}"
    connections = {
        # deltalake commits on S3 by conditional put (the store supports it), as docs/production.md says
        "aws_default": {"conn_type": "aws", "login": ACCESS_KEY, "password": SECRET_KEY,
                        "extra": {"region_name": REGION, "endpoint_url": s3_server.endpoint,
                                  "storage_options": {"aws_conditional_put": "etag"}}},
        catalog: {"conn_type": "generic", "extra": {"type": "sql", "uri": f"sqlite:///{tmp}/catalog.db",
                                                     "warehouse": f"s3://{bucket}/{prefix}/warehouse",
                                                     **s3_server.iceberg_properties()}},
    }  # fmt: skip
    admin = stack.client("admin")
    for conn_id, body in connections.items():
        admin.delete(f"/api/v2/connections/{conn_id}")  # another test's copy (same server), or none
        created = admin.post("/api/v2/connections", json=api_connection(conn_id, body))
        assert created.status_code == 201, created.text

    def resolver(conn_id: str) -> dict | None:  # the same connections, for this process's table clients
        body = connections.get(conn_id)
        return None if body is None else {"conn_id": conn_id, "host": None, "port": None, "schema": None,
                                          "login": None, "password": None, **body}  # fmt: skip

    options = {"endpoint_url": s3_server.endpoint, "access_key": ACCESS_KEY, "secret_key": SECRET_KEY,
               "region": REGION}  # fmt: skip
    pipelines = {
        "delta": Pipeline("delta", f"ui_s3_delta_{tag}", f"delta+s3://{bucket}/{prefix}/delta_events?create_table=true",
                          {"conn_id": "aws_default"}, resolver, options),
        "iceberg": Pipeline("iceberg", f"ui_s3_iceberg_{tag}", f"iceberg://{catalog}/ui.events_{tag}?create_table=true",
                            {}, resolver, options),
    }  # fmt: skip
    # The api-server's committer table: the embedded default (no walsink connection on the stack).
    store = CommitterStore.from_url(f"sqlite:///{stack.home}/walsink/committer.db")
    cli_abort = None
    for p in (pipelines["iceberg"], pipelines["delta"]):
        for key in (K1, K2, K3):
            p.stage(store, key)
        CheckpointCommitter(store, p.staging, p.publisher, mode="append").commit(
            p.name, K1, actor=actor(K1, "commit")
        )
        if p.kind == "iceberg":  # `walsink abort` as an operator runs it (awaited by `settled`)
            cli_abort = walsink(stack, "abort", p.name, K2, "--reason", "INC-7: wrong day", "--json")
        else:  # what that command runs, in this process, with the same connections
            outcome = aborter_for(store, p.name, staging_root=str(tmp), checkpoint_key=K2, connections=resolver,
                                  stores=lambda root: StagingStore.open(root, options)).abort(
                p.name, K2, reason="INC-7: wrong day", actor=Actor(name="oncall")).to_dict()  # fmt: skip
            assert (outcome["previous_state"], outcome["state"]) == ("DURABLE", "ABORTED"), outcome
            assert outcome["staging_removed"], outcome
            p.stage(store, K4, seal=False)  # a write try killed before it sealed: attempt 1 is orphaned
        p.stage(store, K4)
        store.fail(p.name, K3, error="PublishError: the table's commit timed out", actor=actor(K3, "commit"))
    # `walsink gc` reads the world while `walsink abort` ends the Iceberg K2 and the browser checks
    # the pages (they only read it); the UI's aborts wait for its report.
    before = {p.kind: sorted(s3_server.list(p.root.split("/", 3)[3] + "/")) for p in pipelines.values()}
    gc = walsink(stack, "gc", "--retention", "0s", "--json",
                 *[arg for p in pipelines.values() for arg in ("--pipeline", p.name)])  # fmt: skip
    world = World(stack, pipelines, store, s3_server, cli_abort, gc, before)
    try:
        yield world
    finally:
        for proc in (world.cli_abort, world.gc):
            if proc is not None and proc.poll() is None:
                proc.kill()
                proc.communicate()
        store.dispose()


@dataclass
class World:
    stack: Any
    pipelines: dict[str, Pipeline]
    store: CommitterStore
    s3: Any
    #: ``walsink abort`` of the Iceberg ``K2`` and ``walsink gc``: both run while the browser
    #: checks the Delta pages (CI time); each is awaited where its effect is first needed.
    cli_abort: subprocess.Popen
    gc: subprocess.Popen
    #: The bucket's objects of each pipeline when gc started.
    bucket_before_gc: dict[str, list[str]]


@pytest.fixture(scope="module")
def settled(lake) -> World:
    """The Iceberg ``K2`` aborted by ``walsink abort``."""
    outcome = finished(lake.cli_abort)
    assert (outcome["previous_state"], outcome["state"]) == ("DURABLE", "ABORTED"), outcome
    assert outcome["staging_removed"], outcome
    return lake


@pytest.fixture(scope="module")
def gc_report(lake) -> dict:
    """``walsink gc``'s report: waited for before anything changes the world."""
    return finished(lake.gc)


def test_the_api_server_holds_no_aws_variable(lake):
    stack = lake.stack
    for pid in stack.pids()["api-server"]:
        try:
            names = sorted(k for k in environ_of(pid) if k.startswith("AWS_"))
        except (FileNotFoundError, ProcessLookupError):
            continue  # a short-lived child
        assert names == [], f"api-server process {pid} has {names} in its environment"


@pytest.fixture(scope="module")
def page(lake, browser):  # noqa: F811
    stack = lake.stack
    context = browser.new_context(viewport=SCREEN, base_url=stack.base_url)
    context.set_default_timeout(TIMEOUT_MS)
    context.add_cookies([stack.login_cookie("admin")])
    try:
        yield context.new_page()
    finally:
        context.close()


def get(page, path: str, **params: Any) -> Any:
    """An API route through the browser's session (its login cookie), which must answer 200."""
    response = page.request.get(path, params=params or None)
    assert response.status == 200, f"{path}: {response.status} {response.text()[:500]}"
    return response.json()


@pytest.mark.parametrize("kind", ["delta", "iceberg"])
def test_every_checkpoint_page_and_api_route_answers_for_each_state(lake, page, kind, request):
    from playwright.sync_api import expect

    if kind == "iceberg":
        request.getfixturevalue("settled")  # its K2 aborted by `walsink abort`
    stack, p = lake.stack, lake.pipelines[kind]
    base = f"/walsink/api/pipelines/{p.name}"
    summary = get(page, base)
    assert summary["target"] == p.target and summary["mode"] == "append"
    assert {s: n for s, n in summary["counts"].items() if n} == {"COMMITTED": 1, "ABORTED": 1, "FAILED": 1,
                                                                 "DURABLE": 1}  # fmt: skip
    listed = {c["checkpoint_key"]: c["state"] for c in get(page, f"{base}/checkpoints")["checkpoints"]}
    assert listed == {k: s for k, (s, _) in STATES.items()}
    stuck = {
        c["checkpoint_key"]
        for c in get(page, "/walsink/api/checkpoints")["checkpoints"]
        if c["pipeline"] == p.name
    }
    assert stuck == {K3, K4}
    stack.wait_for_dag(DAG_ID)
    by_dag = get(page, f"/walsink/api/dags/{DAG_ID}/checkpoints", run_id=f"scheduled__{K4}")["checkpoints"]
    assert {(c["pipeline"], c["checkpoint_key"]) for c in by_dag} >= {(p.name, K4)}
    for key, (state, committables) in STATES.items():
        detail = get(page, f"{base}/checkpoints/{key}")
        assert detail["checkpoint"]["state"] == state
        assert detail["checkpoint"]["staging_root"] == p.root
        assert detail["committables"]["status"] == committables, detail["committables"]
        assert get(page, f"{base}/checkpoints/{key}/committables") == detail["committables"]
        assert get(page, f"{base}/checkpoints/{key}/history")["transitions"][-1]["to_state"] == state
        waiting = detail["checkpoint"]["waiting"]
        assert (waiting or {}).get("status") == ("blocked" if key == K4 else None), waiting
        if key == K4:
            assert waiting["blocked_by"]["checkpoint_key"] == K3
        log = page.request.get(f"/walsink/pipelines/{p.name}/checkpoints/{key}/log", max_redirects=0)
        assert log.status == 303, log.text()

        response = page.goto(f"/walsink/pipelines/{p.name}/checkpoints/{key}")
        assert response is not None and response.status == 200
        expect(page.locator("h1 .badge").first).to_have_text(state)
        assert "Internal Server Error" not in page.locator("body").inner_text()
        expect(page.locator(".status-unavailable")).to_have_count(0)
        if committables == "cleaned":
            expect(page.locator("#committables-status")).to_contain_text(
                "was cleaned after the checkpoint was"
            )
        else:
            assert page.locator("#committables-status").count() == 0
            rows = page.locator("table.committables tbody tr")
            expect(rows).to_have_count(1)
            expect(rows.first).to_contain_text(FILE)
        if key == K4:
            expect(page.locator("h1 .badge.wait")).to_have_text(f"BLOCKED by {K3}")
        expect(page.locator("#abort")).to_have_count(1 if state in ("FAILED", "DURABLE") else 0)
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(ARTIFACTS / f"{kind}-{state.lower()}.png"), full_page=True)
    for path in (f"/walsink/pipelines/{p.name}", "/walsink/", f"/walsink/dags/{DAG_ID}"):
        response = page.goto(path)
        assert response is not None and response.status == 200, path
    expect(page.locator("table.checkpoints").first).to_be_visible()


def test_walsink_gc_reads_the_table_staging_on_the_bucket_and_leaves_it_to_the_table(settled, gc_report):
    """``walsink gc`` lists both pipelines' staging on the bucket through the connections alone and
    removes nothing of it: a table target's staged files are table data once committed, so even an
    orphaned attempt is left to the table's own maintenance (gc.py, docs/targets.md)."""
    lake = settled
    delta, iceberg, s3 = lake.pipelines["delta"], lake.pipelines["iceberg"], lake.s3
    assert gc_report["attempts_removed"] == [] and gc_report["checkpoint_dirs_removed"] == [], gc_report
    # Every checkpoint on the bucket was found there (read with the connections) and left alone; the
    # Iceberg K2 only if gc listed it before `walsink abort` removed it.
    skipped = {entry.split(":")[0] for entry in gc_report["skipped"]}
    assert all(e.endswith(": staging of a table target, left to the table") for e in gc_report["skipped"])
    assert skipped - {f"{iceberg.name}/{K2}"} == {
        f"{p.name}/{k}" for p in (delta, iceberg) for k in (K1, K3, K4)
    }
    after = {p.kind: sorted(s3.list(p.root.split("/", 3)[3] + "/")) for p in lake.pipelines.values()}
    gone = f"/{iceberg.name}/{K2}/"  # removed by `walsink abort`
    assert after == {kind: [k for k in keys if gone not in k] for kind, keys in lake.bucket_before_gc.items()}
    # The killed write try's orphaned attempt 1 of the Delta checkpoint is still there, next to attempt 2.
    assert sorted({k.split("/")[-2].split("-")[1] for k in s3.list(delta.prefix(K4))}) == ["1", "2"]


@pytest.mark.parametrize("kind", ["delta", "iceberg"])
def test_abort_in_the_browser_removes_the_staged_objects_and_leaves_the_table_without_it(
    lake, page, settled, gc_report, kind
):
    from playwright.sync_api import expect

    store, s3 = lake.store, lake.s3
    p, key = lake.pipelines[kind], UI_ABORT[kind]
    state = STATES[key][0]
    staged = [k for k in s3.list(p.prefix(key)) if k.endswith(FILE)]
    assert staged, "the checkpoint's staged objects are on the bucket before the abort"
    reason = f"INC-{kind}: the partner resent the day"
    url = f"/walsink/pipelines/{p.name}/checkpoints/{key}"
    page.goto(url)
    expect(page.locator("h1 .badge").first).to_have_text(state)
    page.locator("#abort summary").click()
    page.fill("#abort-reason", reason)
    page.get_by_label(re.compile("I understand")).check()
    page.get_by_role("button", name="Abort checkpoint").click()
    expect(page).to_have_url(re.compile(re.escape(url) + "$"))
    expect(page.locator("h1 .badge").first).to_have_text("ABORTED")
    expect(page.locator("#error")).to_have_text(reason)
    expect(page.locator("#committables-status")).to_contain_text(
        "was cleaned after the checkpoint was aborted"
    )
    page.screenshot(path=str(ARTIFACTS / f"{kind}-aborted-in-the-ui.png"), full_page=True)

    record = store.require(p.name, key)
    assert record.state.value == "ABORTED" and record.error == reason
    history = store.history(p.name, key)
    assert [
        (h.from_state, h.actor) for h in history if h.to_state == "ABORTED" and h.from_state != "ABORTED"
    ] == [(state, "admin (walsink UI)")]
    assert f"staging removed: {p.name}/{key}/attempt-" in history[-1].detail
    assert s3.list(p.prefix(key)) == [], "its staged objects are gone from the bucket"
    assert p.table_rows() == [(i, K1) for i in (1, 2, 3)], "the table holds the committed checkpoint only"
