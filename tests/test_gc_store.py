"""GC, abort and the fenced clean-up on an object-store staging root (moto's S3 server, and
fake-gcs-server and Azurite for the rules that hold on every object store: ``on_store``).

The committer table is real (SQLite and PostgreSQL); staging is a prefix in
the server's bucket, reached through ``StagingStore`` exactly as in production. What each
removes is checked key by key, and so is what it must leave: objects under
the same prefix that walsink did not stage, a sibling prefix that only starts
with the same letters, the attempts an open checkpoint still needs.
"""

from __future__ import annotations

import re
import time
import uuid
import zlib
from datetime import timedelta
from typing import Any

import pytest

from airflow_provider_walsink.core.commit.abort import CheckpointAborter
from airflow_provider_walsink.core.commit.aftercommit import committed_fence
from airflow_provider_walsink.core.commit.gc import collect_staging
from airflow_provider_walsink.core.protocol.errors import PathEscapeError
from airflow_provider_walsink.core.protocol.manifest import MANIFEST_NAME, Committable, build_manifest
from airflow_provider_walsink.core.staging.cleanup import (
    CleanupFencedError,
    open_object_store,
    remove_staged_attempts,
)
from airflow_provider_walsink.core.staging.layout import StagingLayout
from airflow_provider_walsink.core.staging.object_store import AttemptLocation, StagingStore
from airflow_provider_walsink.core.store.store import utcnow
from tests.helpers import ACTOR
from tests.table_fixtures import ACCESS_KEY, REGION, SECRET_KEY, s3_server  # noqa: F401

DAY = timedelta(days=1)


@pytest.fixture(params=["sqlite", "postgresql"])
def backend(request) -> str:
    """Overrides conftest's: the committer table on SQLite and PostgreSQL."""
    return request.param


def options(server) -> dict[str, str]:
    return {
        "endpoint_url": server.endpoint,
        "access_key": ACCESS_KEY,
        "secret_key": SECRET_KEY,
        "region": REGION,
    }


@pytest.fixture
def s3(s3_server):  # noqa: F811
    """(staging store, opener with the test's credentials, bucket prefix of this test)."""
    prefix = uuid.uuid4().hex[:12]

    def stores(root: str) -> StagingStore:
        return StagingStore.open(root, options(s3_server))

    return stores(f"s3://{s3_server.bucket}/{prefix}/staging"), stores, prefix


@pytest.fixture(params=["s3", "gs", "abfss"])
def on_store(request):
    """(staging store, opener, bucket prefix of this test, server) on S3 (moto), GCS
    (fake-gcs-server) or Azure (Azurite): the clean-up rules hold on every object store, so they
    run on each."""
    prefix = uuid.uuid4().hex[:12]
    if request.param == "gs":
        server = request.getfixturevalue("gcs_server")
        settings = server.options
    elif request.param == "abfss":
        server = request.getfixturevalue("azurite_server")
        settings = server.options
    else:
        server = request.getfixturevalue("s3_server")
        settings = options(server)

    def stores(root: str) -> StagingStore:
        return StagingStore.open(root, settings)

    return stores(uri(request.param, server, f"{prefix}/staging")), stores, prefix, server


def uri(store: StagingStore | str, server: Any, path: str) -> str:
    """``path`` in the server's bucket (container) as a root URI of the store's kind."""
    kind = store if isinstance(store, str) else store.kind
    if kind in ("abfs", "abfss"):  # abfss://<container>@<account>.dfs.core.windows.net/<path>
        return server.root(path)
    return f"{kind}://{server.bucket}/{path}"


def put(sstore: StagingStore, key: str, data: bytes = b"x\n") -> None:
    """Write an object at ``<bucket>/<key>``."""
    bucket = sstore.base.split("/", 1)[0]
    with sstore.filesystem.open_output_stream(f"{bucket}/{key}") as f:
        f.write(data)


def keys(server, prefix: str) -> list[str]:
    return sorted(k[len(prefix) + 1 :] for k in server.list(prefix + "/"))


def attempt_names(sstore: StagingStore, pipeline: str, key: str) -> list[str]:
    from airflow_provider_walsink.core.staging.cleanup import store_attempts

    return [loc.path.rsplit("/", 1)[-1] for loc in store_attempts(sstore, pipeline, key)]


def stage(
    committer, sstore: StagingStore, pipeline: str, key: str, *, seal: bool = True, durable: bool = True
):
    """One new attempt of ``pipeline/key`` staged on the store (two files), sealed and made durable."""
    committer.register(pipeline, key, mode="overwrite", actor=ACTOR, staging_root=sstore.root_uri)
    record = committer.start_attempt(pipeline, key, actor=ACTOR, staging_root=sstore.root_uri)
    location = sstore.attempt(pipeline, key, record.attempt, record.attempt_id)
    data = {f"dt={key}/part-0.csv": f"{key},0\n".encode(), f"dt={key}/part-1.csv": f"{key},1\n".encode()}
    for rel, body in data.items():
        with sstore.filesystem.open_output_stream(f"{location.path}/{rel}") as f:
            f.write(body)
    if not seal:
        return record, None, location
    manifest = build_manifest(
        pipeline=pipeline,
        checkpoint_key=key,
        sequence=record.sequence,
        attempt=record.attempt,
        attempt_id=record.attempt_id,
        file_format="csv",
        committables=[
            Committable(rel, len(body), 1, "crc32:" + format(zlib.crc32(body), "08x"))
            for rel, body in data.items()
        ],
    )
    digest = sstore.seal(location, manifest)
    committer.seal_manifest(
        manifest, manifest_uri=f"{location.uri}/{MANIFEST_NAME}", manifest_digest=digest, actor=ACTOR
    )
    if durable:
        committer.mark_durable(pipeline, key, attempt=record.attempt, actor=ACTOR)
    return committer.require(pipeline, key), manifest, location


def mark_committed(committer, pipeline: str, key: str):
    """Record the commit (what a committer does after its publish) without a target."""
    lease = committer.acquire_lease(pipeline, key, owner="test", ttl=timedelta(minutes=5), actor=ACTOR)
    return committer.mark_committed(lease, actor=ACTOR)


def test_gc_on_an_object_store_root_removes_only_walsink_attempts_after_retention(store, on_store):
    sstore, stores, prefix, server = on_store
    # Committed with a superseded attempt 1 and the committed attempt 2; its committer died
    # before cleaning up: both are garbage once the retention has passed.
    stage(store, sstore, "p", "c1")
    stage(store, sstore, "p", "c1")
    mark_committed(store, "p", "c1")
    # Committed, and someone else's object under the checkpoint's prefix: never walsink's.
    stage(store, sstore, "p", "c2")
    mark_committed(store, "p", "c2")
    put(sstore, f"{prefix}/staging/p/c2/not-an-attempt/x")
    # Aborted: garbage.
    stage(store, sstore, "p", "a1", durable=False)
    store.abort("p", "a1", reason="bad interval", actor=ACTOR)
    # Open (DURABLE) with an orphaned attempt 1 and its sealed current attempt 2.
    stage(store, sstore, "p", "o1")
    stage(store, sstore, "p", "o1")
    # A checkpoint the committer table does not know, made of attempts only: garbage.
    put(sstore, f"{prefix}/staging/p/ghost/attempt-1/part-0.csv")
    # An unknown checkpoint holding an object named like an attempt: not walsink's layout.
    put(sstore, f"{prefix}/staging/p/ghost2/attempt-1")
    # Not walsink's at all: another team's files under the root, a sibling prefix with the
    # same leading letters as the root, and names that are not identifiers.
    put(sstore, f"{prefix}/staging/other-team/file")
    put(sstore, f"{prefix}/staging-old/p/c1/attempt-1/part-0.csv")
    put(sstore, f"{prefix}/staging/not a pipeline/k/attempt-1/x")
    put(sstore, f"{prefix}/staging/p/not a key/attempt-1/x")
    before = keys(server, prefix)

    # Younger than the retention period: everything kept, with its reason.
    young = collect_staging(store, StagingLayout(f"/nonexistent-{prefix}"), retention=DAY, stores=stores)
    assert young.attempts_removed == [] and young.checkpoint_dirs_removed == []
    assert keys(server, prefix) == before
    reasons = "\n".join(young.kept)
    assert "p/c1: COMMITTED" in reasons and "retention 1d" in reasons, reasons
    assert "p/a1: ABORTED" in reasons, reasons
    assert "p/ghost: unknown to the committer table, changed" in reasons, reasons

    later = lambda: utcnow() + 2 * DAY  # noqa: E731 - rows and objects look two days old
    dry = collect_staging(
        store,
        StagingLayout(f"/nonexistent-{prefix}"),
        retention=DAY,
        stores=stores,
        clock=later,
        dry_run=True,
    )
    assert keys(server, prefix) == before  # a dry run removes nothing
    report = collect_staging(
        store, StagingLayout(f"/nonexistent-{prefix}"), retention=DAY, stores=stores, clock=later
    )

    for each in (dry, report):
        assert sorted(each.checkpoint_dirs_removed) == ["p/a1", "p/c1", "p/ghost"], each
        assert sorted(re.sub(r"-[0-9a-f]{32}$", "", n) for n in each.attempts_removed) == [
            "p/c2/attempt-1",
            "p/o1/attempt-1",
        ], each.attempts_removed
    # Kept with its reason: the sealed current attempt of the open checkpoint.
    assert any(
        k.startswith("p/o1/attempt-2-") and "current attempt of a DURABLE checkpoint" in k
        for k in report.kept
    )
    assert any("ghost2" in s and "'attempt-1'" in s and "left alone" in s for s in report.skipped), (
        report.skipped
    )
    assert any("other-team" in s and "no pipeline" in s for s in report.skipped), report.skipped
    assert any("not a pipeline id" in s for s in report.skipped)
    assert any("not a checkpoint key" in s for s in report.skipped)
    left = keys(server, prefix)
    assert [k for k in left if k.startswith("staging/p/o1/")] == [
        k for k in before if k.startswith("staging/p/o1/attempt-2-")
    ]
    assert sorted(set(before) - set(left)) == sorted(
        k
        for k in before
        if k.startswith(("staging/p/c1/", "staging/p/a1/", "staging/p/ghost/", "staging/p/o1/attempt-1-"))
        or (k.startswith("staging/p/c2/attempt-"))
    )
    # Nothing left behind for a second run to report (no empty "directory" marker objects).
    again = collect_staging(
        store, StagingLayout(f"/nonexistent-{prefix}"), retention=DAY, stores=stores, clock=later
    )
    assert again.attempts_removed == [] and again.checkpoint_dirs_removed == [], again
    assert not [k for k in left if k.endswith("/")], left
    for untouched in (
        "staging/p/c2/not-an-attempt/x",
        "staging/p/ghost2/attempt-1",
        "staging/other-team/file",
        "staging-old/p/c1/attempt-1/part-0.csv",
        "staging/not a pipeline/k/attempt-1/x",
        "staging/p/not a key/attempt-1/x",
    ):
        assert untouched in left, untouched


def test_gc_on_an_object_store_root_is_fenced_by_the_row_it_read(store, on_store, monkeypatch):
    """A reprocess that begins while GC works on a committed checkpoint stops it: nothing more goes."""
    import airflow_provider_walsink.core.commit.gc as gc

    sstore, stores, _prefix, _server = on_store
    stage(store, sstore, "p", "c1")
    stage(store, sstore, "p", "c1")
    mark_committed(store, "p", "c1")
    removed = []
    real = StagingStore.remove_attempt

    def remove_then_reprocess(self, location):
        removed.append(location.path)
        done = real(self, location)
        store.begin_version("p", "c1", token="reprocess#1", actor=ACTOR, reason="late data")
        return done

    monkeypatch.setattr(StagingStore, "remove_attempt", remove_then_reprocess)
    report = gc.collect_staging(
        store, StagingLayout("/nonexistent"), retention=DAY, stores=stores, clock=lambda: utcnow() + 2 * DAY
    )
    assert len(removed) == 1, removed  # the first attempt went; the fence stopped the second
    assert any("changed since gc read it" in s for s in report.skipped), report.skipped
    assert len(attempt_names(sstore, "p", "c1")) == 1


def test_gc_refuses_a_recorded_root_that_is_not_a_plain_prefix(store, on_store):
    """A row naming ``..`` in its object-store root: skipped, nothing under either prefix touched."""
    sstore, stores, prefix, server = on_store
    sneaky = uri(sstore, server, f"{prefix}/staging/../victim")
    store.register("p", "k1", mode="overwrite", actor=ACTOR, staging_root=sneaky)
    store.start_attempt("p", "k1", actor=ACTOR)
    store.abort("p", "k1", reason="test", actor=ACTOR)
    put(sstore, f"{prefix}/victim/p/k1/attempt-1/part-0.csv")
    before = keys(server, prefix)
    report = collect_staging(
        store,
        StagingLayout("/nonexistent"),
        retention=timedelta(0),
        stores=stores,
        clock=lambda: utcnow() + DAY,
    )
    assert report.attempts_removed == [] and report.checkpoint_dirs_removed == []
    assert any("not a bucket and a plain prefix" in s for s in report.skipped), report.skipped
    assert keys(server, prefix) == before


def test_a_store_deletes_nothing_outside_its_root(on_store):
    """A location from elsewhere (a manifest, a row) naming ``..`` or another bucket is refused."""
    sstore, stores, prefix, server = on_store
    put(sstore, f"{prefix}/elsewhere/p/k/attempt-1/x")
    attempt_id = "a" * 32
    for path in (
        f"{sstore.base}/p/k/../../elsewhere/p/k/attempt-1",
        f"other-bucket/{prefix}/staging/p/k/attempt-1-{attempt_id}",
        f"{server.bucket}/{prefix}/elsewhere/p/k/attempt-1",
    ):
        forged = AttemptLocation("p", "k", 1, None, path, f"{sstore.kind}://" + path)
        with pytest.raises(PathEscapeError, match="refusing to delete"):
            sstore.remove_attempt(forged)
    with pytest.raises(PathEscapeError, match="plain prefix"):
        open_object_store(uri(sstore, server, f"{prefix}/staging/../elsewhere"), stores)
    with pytest.raises(PathEscapeError, match="refusing to delete"):
        # An opener that hands back a store for another root is not trusted either.
        open_object_store(
            uri(sstore, server, f"{prefix}/staging"),
            lambda _r: stores(uri(sstore, server, f"{prefix}")),
        )
    assert keys(server, prefix) == ["elsewhere/p/k/attempt-1/x"]


def test_remove_attempt_on_an_object_store_leaves_attempts_sharing_its_name_prefix(on_store):
    """``attempt-1`` is a prefix of ``attempt-10`` and ``attempt-1-<id>`` as strings: only it goes."""
    sstore, _stores, prefix, server = on_store
    for name in ("attempt-1", "attempt-10", "attempt-10-" + "c" * 32):
        put(sstore, f"{prefix}/staging/p/k/{name}/x")
    put(sstore, f"{prefix}/staging/p/k/attempt-1.json")
    assert sstore.remove_attempt(sstore.attempt("p", "k", 1)) is True
    assert keys(server, prefix) == [
        "staging/p/k/attempt-1.json",
        "staging/p/k/attempt-10-" + "c" * 32 + "/x",
        "staging/p/k/attempt-10/x",
    ]
    # Through the fenced clean-up: attempts up to 1 only; an unnumbered ``attempt-2`` beside a named
    # one is ambiguous to the store (it refuses), and is left, not an error.
    for name in ("attempt-1-" + "b" * 32, "attempt-2", "attempt-2-" + "d" * 32):
        put(sstore, f"{prefix}/staging/p/k/{name}/x")
    assert remove_staged_attempts(sstore, "p", "k", up_to=1, fence=lambda: None) == ["attempt-1-" + "b" * 32]
    assert remove_staged_attempts(sstore, "p", "k", up_to=2, fence=lambda: None) == ["attempt-2-" + "d" * 32]
    assert keys(server, prefix) == [
        "staging/p/k/attempt-1.json",
        "staging/p/k/attempt-10-" + "c" * 32 + "/x",
        "staging/p/k/attempt-10/x",
        "staging/p/k/attempt-2/x",
    ]


def test_post_commit_cleanup_on_an_object_store_is_fenced(store, on_store):
    """The committer's clean-up after COMMITTED: a fenced-out committer (a reprocess began since)
    deletes nothing; the committer still in place removes its version's attempts, and never a
    later attempt or an object that is not an attempt."""
    sstore, _stores, prefix, server = on_store
    stage(store, sstore, "p", "k1")
    _record, manifest, _location = stage(store, sstore, "p", "k1")
    mark_committed(store, "p", "k1")
    put(sstore, f"{prefix}/staging/p/k1/not-an-attempt/x")
    fence = committed_fence(store, manifest)

    store.begin_version("p", "k1", token="reprocess#1", actor=ACTOR, reason="late data")
    before = keys(server, prefix)
    with pytest.raises(CleanupFencedError, match="moved on"):
        remove_staged_attempts(sstore, "p", "k1", up_to=manifest.attempt, fence=fence)
    assert keys(server, prefix) == before

    # The same clean-up by a committer still in place (the row still its COMMITTED version).
    stage(store, sstore, "q", "k1")
    _record, manifest, _location = stage(store, sstore, "q", "k1")
    mark_committed(store, "q", "k1")
    put(sstore, f"{prefix}/staging/q/k1/attempt-3/x")  # a later attempt: not this version's
    put(sstore, f"{prefix}/staging/q/k1/not-an-attempt/x")
    removed = remove_staged_attempts(
        sstore, "q", "k1", up_to=manifest.attempt, fence=committed_fence(store, manifest)
    )
    assert len(removed) == 2 and all(n.startswith(("attempt-1-", "attempt-2-")) for n in removed), removed
    assert [k for k in keys(server, prefix) if k.startswith("staging/q/")] == [
        "staging/q/k1/attempt-3/x",
        "staging/q/k1/not-an-attempt/x",
    ]


def test_abort_of_a_checkpoint_staged_on_an_object_store_removes_its_attempts_only(store, on_store, tmp_path):
    from airflow_provider_walsink.hooks.aborts import aborter_for

    sstore, stores, prefix, server = on_store
    stage(store, sstore, "p", "k1")
    stage(store, sstore, "p", "k1")  # attempt 2, sealed and durable
    stage(store, sstore, "p", "k2")  # another checkpoint: untouched
    put(sstore, f"{prefix}/staging/p/k1/not-an-attempt/x")
    put(sstore, f"{prefix}/staging/other-team/file")
    before = keys(server, prefix)

    aborter = aborter_for(
        store, "p", staging_root=str(tmp_path / "conn-root"), checkpoint_key="k1", stores=stores
    )
    assert isinstance(aborter, CheckpointAborter)
    outcome = aborter.abort("p", "k1", reason="bad interval", actor=ACTOR)

    assert outcome.state == "ABORTED" and outcome.warnings == [], outcome
    assert sorted(n.split("-")[1] for n in outcome.staging_removed) == ["1", "2"], outcome.staging_removed
    left = keys(server, prefix)
    assert sorted(set(before) - set(left)) == sorted(
        k for k in before if k.startswith("staging/p/k1/attempt-")
    )
    assert "staging/p/k1/not-an-attempt/x" in left and "staging/other-team/file" in left
    assert any(k.startswith("staging/p/k2/attempt-1-") for k in left)


def test_abort_refuses_a_recorded_root_with_dot_dot(store, on_store, tmp_path):
    """A row whose recorded root names ``..``: the abort is recorded, its staging is not touched."""
    from airflow_provider_walsink.hooks.aborts import aborter_for

    sstore, stores, prefix, server = on_store
    sneaky = uri(sstore, server, f"{prefix}/staging/../victim")
    store.register("p", "k1", mode="overwrite", actor=ACTOR, staging_root=sneaky)
    store.start_attempt("p", "k1", actor=ACTOR)
    put(sstore, f"{prefix}/victim/p/k1/attempt-1/x")
    with pytest.raises(PathEscapeError, match="plain prefix"):
        aborter_for(store, "p", staging_root=str(tmp_path), checkpoint_key="k1", stores=stores)
    assert keys(server, prefix) == ["victim/p/k1/attempt-1/x"]


def test_abort_cleanup_on_an_object_store_stops_when_a_new_run_takes_the_checkpoint(
    store, on_store, monkeypatch
):
    """The abort's clean-up is fenced by its token on an object store too: a new run that reaches
    COMMITTING before the first delete stops it, and nothing is deleted."""
    import airflow_provider_walsink.core.staging.cleanup as cleanup

    sstore, stores, prefix, server = on_store
    stage(store, sstore, "p", "k1")
    stage(store, sstore, "p", "k1")
    started = []

    def a_new_run_commits_first(name: str) -> None:
        if name == "cleanup.before_delete" and not started:
            started.append(stage(store, sstore, "p", "k1"))  # ABORTED -> WRITING, attempt 3, durable
            store.acquire_lease("p", "k1", owner="try-2", ttl=timedelta(minutes=5), actor=ACTOR)

    monkeypatch.setattr(cleanup, "crashpoint", a_new_run_commits_first)
    from airflow_provider_walsink.hooks.aborts import aborter_for

    aborter = aborter_for(store, "p", staging_root="/nonexistent", checkpoint_key="k1", stores=stores)
    outcome = aborter.abort("p", "k1", reason="bad interval", actor=ACTOR)

    assert started and outcome.state == "ABORTED" and outcome.staging_removed == [], outcome
    assert any("moved on" in w for w in outcome.warnings), outcome.warnings
    assert sorted(n.split("-")[1] for n in attempt_names(sstore, "p", "k1")) == ["1", "2", "3"]
    assert store.require("p", "k1").state.value == "COMMITTING"


def test_the_gc_operator_opens_a_recorded_s3_root_with_the_staging_connection(
    store,
    db_url,
    s3,
    s3_server,  # noqa: F811
    monkeypatch,
    tmp_path,
):
    """The maintenance task collects a root the write task staged on S3 with the credentials
    of the walsink connection's ``staging_conn_id`` (here the only way in: the environment
    has no AWS keys, so the default credential chain would be refused by the server)."""
    import json

    from airflow_provider_walsink.operators.gc import WalGarbageCollectOperator

    sstore, _stores, prefix = s3
    stage(store, sstore, "p", "c1")
    stage(store, sstore, "p", "c1")
    mark_committed(store, "p", "c1")
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv(
        "AIRFLOW_CONN_MOTO_STAGING",
        json.dumps({"conn_type": "aws", "login": ACCESS_KEY, "password": SECRET_KEY,
                    "extra": {"region_name": REGION, "endpoint_url": s3_server.endpoint}}),
    )  # fmt: skip
    monkeypatch.setenv(
        "AIRFLOW_CONN_WALSINK_GC_TEST",
        json.dumps({"conn_type": "walsink", "extra": {"url": db_url, "staging_root": str(tmp_path / "local"),
                                                      "staging_conn_id": "moto_staging"}}),
    )  # fmt: skip
    assert attempt_names(sstore, "p", "c1") != []
    report = WalGarbageCollectOperator(
        task_id="gc", walsink_conn_id="walsink_gc_test", retention=timedelta(0), history_retention=None
    ).execute({})
    assert attempt_names(sstore, "p", "c1") == [], report
    assert not [k for k in keys(s3_server, prefix) if k.startswith("staging/p/c1/attempt-")], report


def test_walsink_gc_on_an_s3_staging_root_uses_the_walsink_connections_staging_credentials(
    store,
    db_url,
    s3,
    s3_server,  # noqa: F811
    tmp_path,
    monkeypatch,
):
    """`walsink gc` with a connection whose staging root is on S3 (issue 35: it failed, reading
    the root as a local path, and ignored the ``aws`` connection). With no AWS keys in the
    environment, only the connection's ``staging_conn_id`` opens the bucket."""
    import json
    import os

    from tests.test_cli import walsink

    sstore, _stores, prefix = s3
    stage(store, sstore, "p", "c1")
    stage(store, sstore, "p", "c1")  # attempt 1 orphaned by attempt 2
    mark_committed(store, "p", "c1")
    for name in [k for k in os.environ if k.startswith("AWS_")]:
        monkeypatch.delenv(name)  # walsink() starts from this environment
    env = dict(
        AWS_SHARED_CREDENTIALS_FILE=str(tmp_path / "none"),
        AWS_CONFIG_FILE=str(tmp_path / "none"),
        AIRFLOW_CONN_MOTO_CLI=json.dumps({"conn_type": "aws", "login": ACCESS_KEY, "password": SECRET_KEY,
                                          "extra": {"region_name": REGION, "endpoint_url": s3_server.endpoint}}),
        AIRFLOW_CONN_WALSINK_S3_CLI=json.dumps({"conn_type": "walsink", "extra": {
            "url": db_url, "staging_root": sstore.root_uri, "staging_conn_id": "moto_cli"}}),
    )  # fmt: skip
    assert attempt_names(sstore, "p", "c1") != []
    time.sleep(1.5)  # older than --retention 1s
    result = walsink("--conn-id", "walsink_s3_cli", "gc", "--retention", "1s", "--json", env=env)
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["staging_root"] == sstore.root_uri and not report["skipped"], report
    assert attempt_names(sstore, "p", "c1") == [], report
    assert not [k for k in keys(s3_server, prefix) if k.startswith("staging/p/c1/attempt-")], report


@pytest.mark.parametrize("backend", ["sqlite"])  # the claim is the staging connection's, not the table's
@pytest.mark.parametrize("kind", ["gs", "abfss"])
def test_walsink_gc_on_a_gcs_or_azure_staging_root_opens_it_with_the_pipelines_connection_only(
    store, db_url, request, kind
):
    """`walsink gc` on a ``gs://`` (fake-gcs-server) or ``abfss://`` (Azurite) staging root, with
    only the pipeline's connections configured: the walsink connection's ``staging_conn_id``
    names the ``google_cloud_platform`` or ``wasb`` connection; naming one that does not exist
    fails, naming it."""
    import json

    from tests.test_cli import walsink

    if kind == "gs":
        server = request.getfixturevalue("gcs_server")
        staging = {"conn_type": "google_cloud_platform",
                   "extra": {"endpoint_url": server.endpoint, "is_anonymous": True}}  # fmt: skip
    else:
        server = request.getfixturevalue("azurite_server")
        staging = {
            "conn_type": "wasb",
            "login": server.account,
            "password": server.key,
            "host": server.endpoint,
        }
    sstore = StagingStore.open(uri(kind, server, f"{uuid.uuid4().hex[:12]}/staging"), server.options)
    stage(store, sstore, "p", "c1")
    stage(store, sstore, "p", "c1")  # attempt 1 orphaned by attempt 2
    mark_committed(store, "p", "c1")

    def walsink_conn(staging_conn_id: str) -> str:
        return json.dumps({"conn_type": "walsink", "extra": {
            "url": db_url, "staging_root": sstore.root_uri, "staging_conn_id": staging_conn_id}})  # fmt: skip

    env = dict(AIRFLOW_CONN_STAGE_CLI=json.dumps(staging), AIRFLOW_CONN_WALSINK_CLI=walsink_conn("nowhere"))
    time.sleep(1.5)  # older than --retention 1s
    refused = walsink("--conn-id", "walsink_cli", "gc", "--retention", "1s", "--json", env=env)
    # Reported, never guessed around: the root is skipped, naming the connection, nothing removed.
    skipped = json.loads(refused.stdout)["skipped"]
    assert skipped and all("connection 'nowhere'" in s and "does not exist" in s for s in skipped), skipped
    assert len(attempt_names(sstore, "p", "c1")) == 2  # nothing removed

    env["AIRFLOW_CONN_WALSINK_CLI"] = walsink_conn("stage_cli")
    result = walsink("--conn-id", "walsink_cli", "gc", "--retention", "1s", "--json", env=env)
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["staging_root"] == sstore.root_uri and not report["skipped"], report
    assert attempt_names(sstore, "p", "c1") == [], report
    assert not [k for k in server.list(sstore.base.split("/", 1)[1] + "/p/c1/attempt-")], report
    assert "password" not in staging or server.key not in result.stdout + result.stderr + refused.stdout


def test_walsink_abort_of_an_s3_delta_table_reads_the_connection_its_target_options_name(
    store,
    db_url,
    s3_server,  # noqa: F811
    tmp_path,
    monkeypatch,
):
    """`walsink abort` of a checkpoint staged (DURABLE, not committed) in a Delta table on S3
    whose write task named ``target_options={"conn_id": ...}`` (issue 35: the abort built the
    publisher from the registered URI alone, so deltalake fell back to this process's
    environment and needed AWS_* exported by hand). With no AWS keys in the environment, the
    connection references recorded at registration open the table; no secret is recorded."""
    import json
    import os

    from airflow_provider_walsink.core.targets.registry import connection_references
    from tests.test_cli import walsink

    prefix = uuid.uuid4().hex[:12]
    target = f"delta+s3://{s3_server.bucket}/{prefix}/events"
    root = f"s3://{s3_server.bucket}/{prefix}/events/_walsink_staging"
    sstore = StagingStore.open(root, options(s3_server))
    from deltalake import write_deltalake

    from tests.table_fixtures import events_table

    # The table exists (it carries the abort's tombstone); the checkpoint is not in it.
    write_deltalake(target.replace("delta+s3", "s3"), events_table([("d0", 0, "a")]),
                    storage_options=s3_server.delta_options())  # fmt: skip
    target_options = {"conn_id": "moto_lake", "storage_options": {"AWS_SECRET_ACCESS_KEY": "not-recorded"}}
    store.register(
        "p",
        "k1",
        mode="overwrite",
        actor=ACTOR,
        target=target,
        staging_root=root,
        target_connections=connection_references(target_options),
    )
    assert store.get_pipeline("p")["target_connections"] == {"conn_id": "moto_lake"}
    record, _manifest, _location = stage(store, sstore, "p", "k1")
    assert record.state.value == "DURABLE"
    assert any(k.startswith("events/_walsink_staging/p/k1/attempt-") for k in keys(s3_server, prefix))

    for name in [k for k in os.environ if k.startswith("AWS_")]:
        monkeypatch.delenv(name)  # walsink() starts from this environment
    env = dict(
        AWS_SHARED_CREDENTIALS_FILE=str(tmp_path / "none"),
        AWS_CONFIG_FILE=str(tmp_path / "none"),
        AWS_EC2_METADATA_DISABLED="true",
        AIRFLOW_CONN_MOTO_LAKE=json.dumps({"conn_type": "aws", "login": ACCESS_KEY, "password": SECRET_KEY,
                                           "extra": {"region_name": REGION, "endpoint_url": s3_server.endpoint}}),
        AIRFLOW_CONN_WALSINK_S3_ABORT=json.dumps({"conn_type": "walsink", "extra": {
            "url": db_url, "staging_root": str(tmp_path / "local"), "staging_conn_id": "moto_lake"}}),
    )  # fmt: skip
    result = walsink("--conn-id", "walsink_s3_abort", "abort", "p", "k1", "--reason", "x", "--json", env=env)
    assert result.returncode == 0, result.stderr
    outcome = json.loads(result.stdout)
    assert outcome["state"] == "ABORTED" and outcome["previous_state"] == "DURABLE", outcome
    assert store.require("p", "k1").state.value == "ABORTED"
    assert not [k for k in keys(s3_server, prefix) if k.startswith("events/_walsink_staging/p/k1/attempt-")]


def test_a_pipelines_target_connections_follow_its_registrations(store):
    """Recorded on the first registration, replaced when a later one brings other references
    (a DAG edit, also for a checkpoint registered before), kept when a caller says nothing."""
    store.register("p", "k1", mode="overwrite", actor=ACTOR, target="delta:///t", target_connections={})
    assert store.get_pipeline("p")["target_connections"] == {}
    store.register("p", "k2", mode="overwrite", actor=ACTOR, target_connections={"conn_id": "a"})
    assert store.get_pipeline("p")["target_connections"] == {"conn_id": "a"}
    store.register("p", "k2", mode="overwrite", actor=ACTOR, target_connections={"conn_id": "b"})
    assert store.get_pipeline("p")["target_connections"] == {"conn_id": "b"}
    store.register("p", "k3", mode="overwrite", actor=ACTOR)
    assert store.get_pipeline("p")["target_connections"] == {"conn_id": "b"}
    store.register("p", "k4", mode="overwrite", actor=ACTOR, target_connections={})
    assert store.get_pipeline("p")["target_connections"] == {}
