"""Shared set-up for the commit-state UI tests: a real Airflow api app (plugins, auth
manager) in-process, real users logged in through ``POST /auth/token``, and a
committer table filled through the store as the tasks fill it.

Users (SimpleAuthManager, multi-team mode so access can differ per DAG):
``admin`` (admin), ``alice`` (viewer in team ``team_a``), ``bob`` (viewer in
team ``team_b``), ``carol`` (viewer in no team: may read no team's DAG). DAG
``ui_dag_a`` lives in a bundle owned by ``team_a`` and ``ui_dag_b`` in one owned
by ``team_b``: alice may read only ``ui_dag_a``.

Pipelines: ``sales_a`` (DAG A), ``sales_b`` (DAG B), ``shared`` (registered by
DAG A, then handed over to DAG B, which wrote one checkpoint: only readers of both see it) and
``notebook`` (no DAG: admins only).
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from helpers import stage_checkpoint

from airflow_provider_walsink.core.commit import CheckpointCommitter
from airflow_provider_walsink.core.staging.layout import StagingLayout
from airflow_provider_walsink.core.store import Actor, CommitterStore
from airflow_provider_walsink.core.targets import FilePublisher

DAG_A, DAG_B = "ui_dag_a", "ui_dag_b"
XSS = "<script>alert('walsink')</script>"
USERS = "admin:admin,alice:viewer:team_a,bob:viewer:team_b,carol:viewer"
USER_NAMES = ("admin", "alice", "bob", "carol")
#: Source offsets of the ``shared`` pipeline's checkpoints (start of each, end of the last).
SHARED_OFFSETS = [{"events": {"0": 0, "1": 0}}, {"events": {"0": 42, "1": 7}}, {"events": {"0": 50, "1": 9}}]


@dataclass
class UiWorld:
    client: object  # fastapi.testclient.TestClient on the whole Airflow api app
    store: CommitterStore
    layout: StagingLayout
    tokens: dict[str, str]
    app: object = None  # the Airflow api app itself (to serve it over HTTP for a browser)

    def headers(self, user: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.tokens[user]}"}


def ui_env(store_url: str, staging: Path, extra: dict | None = None) -> dict[str, str]:
    # A connection id of its own per world: the UI caches resolved connections by id.
    conn_id = f"walsink_ui_{uuid.uuid4().hex[:8]}"
    return {
        "AIRFLOW__CORE__MULTI_TEAM": "True",
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS": USERS,
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS": "False",
        "AIRFLOW__WALSINK__UI_CONN_ID": conn_id,
        f"AIRFLOW_CONN_{conn_id.upper()}": json.dumps(
            {
                "conn_type": "walsink",
                "extra": {"url": store_url, "staging_root": str(staging), **(extra or {})},
            }
        ),
    }


def register_team_dags() -> None:
    """Two teams, each owning a bundle with one DAG (rows in Airflow's metadata DB)."""
    from airflow.models.dag import DagModel
    from airflow.models.dagbundle import DagBundleModel
    from airflow.models.team import Team, dag_bundle_team_association_table
    from airflow.utils.session import create_session
    from sqlalchemy import insert, select

    with create_session() as session:
        for team, bundle, dag_id in (("team_a", "ui_bundle_a", DAG_A), ("team_b", "ui_bundle_b", DAG_B)):
            if session.scalar(select(Team).where(Team.name == team)) is None:
                session.add(Team(name=team))
            if session.get(DagBundleModel, bundle) is None:
                session.add(DagBundleModel(name=bundle))
            session.flush()
            if not session.execute(
                select(dag_bundle_team_association_table).where(
                    dag_bundle_team_association_table.c.dag_bundle_name == bundle
                )
            ).first():
                session.execute(
                    insert(dag_bundle_team_association_table).values(dag_bundle_name=bundle, team_name=team)
                )
            if session.get(DagModel, dag_id) is None:
                session.add(DagModel(dag_id=dag_id, bundle_name=bundle, fileloc=f"/nonexistent/{dag_id}.py"))


def fill(store: CommitterStore, layout: StagingLayout, target: Path) -> None:
    """Pipeline ``sales_a`` of DAG A: 3 committed, 1 durable, 1 failed with a hostile
    error; ``sales_b`` of DAG B: one committed. The same calls the tasks make."""
    publisher = FilePublisher(target, "overwrite", layout=layout)
    for pipeline, dag_id, keys in (
        ("sales_a", DAG_A, ["20260101T000000Z", "20260102T000000Z", "20260103T000000Z"]),
        ("sales_b", DAG_B, ["20260101T000000Z"]),
    ):
        committer = CheckpointCommitter(
            store,
            layout,
            publisher if pipeline == "sales_a" else FilePublisher(target / "b", "overwrite", layout=layout),
            mode="overwrite",
        )
        for i, key in enumerate(keys):
            actor = Actor(
                name=f"{dag_id}.write@run-{i}",
                dag_id=dag_id,
                run_id=f"run-{i}",
                task_id="write",
                try_number=1,
            )
            day = f"{key[:4]}-{key[4:6]}-{key[6:8]}"
            stage_checkpoint(store, layout, pipeline, key, {f"dt={day}/part-0.csv": b"a\nb\n"}, actor=actor)
            committer.commit(
                pipeline,
                key,
                actor=Actor(
                    name="committer", dag_id=dag_id, run_id=f"run-{i}", task_id="commit", try_number=1
                ),
            )
    durable_actor = Actor(name="w", dag_id=DAG_A, run_id="run-3", task_id="write", try_number=1)
    stage_checkpoint(
        store,
        layout,
        "sales_a",
        "20260104T000000Z",
        {"dt=2026-01-04/part-0.csv": b"x\n", "dt=2026-01-04/part-1.csv": b"y\nz\n"},
        actor=durable_actor,
    )
    hostile = Actor(
        name=f"writer {XSS}", dag_id=DAG_A, run_id=f"manual__{XSS}", task_id="write", try_number=2
    )
    stage_checkpoint(
        store,
        layout,
        "sales_a",
        "20260105T000000Z",
        {"dt=2026-01-05/part-0.csv": b"q\n"},
        actor=hostile,
        durable=False,
    )
    store.fail("sales_a", "20260105T000000Z", error=f"checksum mismatch in {XSS}", actor=hostile)
    for i, dag_id in enumerate((DAG_A, DAG_B)):
        if dag_id == DAG_B:
            store.reassign_pipeline("shared", DAG_B)  # DAG A renamed to DAG B: its pipeline handed over
        actor = Actor(name="w", dag_id=dag_id, run_id=f"shared-{i}", task_id="write", try_number=1)
        stage_checkpoint(
            store,
            layout,
            "shared",
            f"2026010{i + 1}T000000Z",
            {"part-0.csv": b"s\n"},
            actor=actor,
            start_offsets=SHARED_OFFSETS[i],
            end_offsets=SHARED_OFFSETS[i + 1],
        )
    # Ended by a user: not a failure, so never shown red.
    store.abort("shared", "20260102T000000Z", reason="aborted by hand", actor=actor)
    # Registered from a script or notebook: no DAG writes it.
    stage_checkpoint(
        store, layout, "notebook", "20260101T000000Z", {"part-0.csv": b"n\n"}, actor=Actor(name="nb")
    )


def login(client, user: str) -> str:
    """A JWT from Airflow's own login endpoint, with the password SimpleAuthManager generated."""
    from airflow.api_fastapi.auth.managers.simple.simple_auth_manager import SimpleAuthManager

    password = SimpleAuthManager.get_passwords()[user]
    response = client.post("/auth/token", json={"username": user, "password": password})
    assert response.status_code == 201, response.text
    return response.json()["access_token"]


def build_world(
    store_url: str, tmp: Path, monkeypatch, walsink_extra: dict | None = None
) -> Iterator[UiWorld]:
    from airflow.api_fastapi.app import create_app, purge_cached_app
    from fastapi.testclient import TestClient

    staging = tmp / "staging"
    for key, value in ui_env(store_url, staging, walsink_extra).items():
        monkeypatch.setenv(key, value)
    # A fresh password file for our users (SimpleAuthManager writes missing ones at init).
    monkeypatch.setenv("AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE", str(tmp / "passwords.json"))
    register_team_dags()
    store = CommitterStore.from_url(store_url)
    layout = StagingLayout(staging)
    fill(store, layout, tmp / "target")
    purge_cached_app()
    app = create_app(apps="core")
    with TestClient(app, base_url="http://127.0.0.1") as client:
        tokens = {u: login(client, u) for u in USER_NAMES}
        yield UiWorld(client, store, layout, tokens, app)
    purge_cached_app()
    store.dispose()


@contextmanager
def serve_on_loopback(app) -> Iterator[str]:
    """Serve ``app`` with uvicorn in a thread on a free loopback port; yields its base URL."""
    import socket
    import threading
    import time

    import uvicorn

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 60
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "uvicorn did not start"
        time.sleep(0.05)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=30)
