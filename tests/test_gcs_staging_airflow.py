"""Issue 48, GCS: a ``gs://`` staging root used from a DAG, against fake-gcs-server.

* The Google provider's ``google_cloud_platform`` connection (extra ``keyfile_dict`` or
  ``key_path``, ``project``, ``is_anonymous``, and walsink's ``endpoint_url`` for an emulator)
  becomes the :class:`GcsStagingStore` options; a key is in no log line and no ``repr``.
* The credentials come from that connection only: a ``gs://`` root without one (missing,
  ``staging_conn_id: ""``, or of another type) is refused naming the connection, and the write
  task refuses it before anything is recorded or Spark starts; so is a bucket that does not exist.
* A real spark-submit job stages to the emulator through the executors' writer, the seal is the
  service's create-only upload, and the durability sensor reads it back (``dag.test()``).
"""

from __future__ import annotations

import json
import logging
import uuid
from datetime import UTC, datetime
from types import SimpleNamespace
from typing import Any

import pytest

from airflow_provider_walsink.core.protocol import CheckpointState as S
from airflow_provider_walsink.core.protocol.manifest import MANIFEST_NAME
from airflow_provider_walsink.core.spark.args import storage_env, storage_options_from_env
from airflow_provider_walsink.core.staging.gcs import GcsStagingStore
from airflow_provider_walsink.core.staging.object_store import StagingStore, StagingStoreError
from airflow_provider_walsink.hooks.staging import StagingConnectionError, gcs_options_from_connection
from airflow_provider_walsink.hooks.walsink import WalsinkHook
from tests.test_preflight import assert_refused_before_spark, run_write_task

INTERVAL_START = datetime(2026, 4, 1, tzinfo=UTC)
KEY = "20260401T000000Z"
#: A service account's key as the console hands it out; its private key is a marker no log may show.
PRIVATE = "-----BEGIN PRIVATE KEY-----\nwalsink-test-not-a-real-key\n-----END PRIVATE KEY-----\n"
KEYFILE = {
    "type": "service_account",
    "project_id": "walsink-test",
    "private_key_id": "0" * 40,
    "private_key": PRIVATE,
    "client_email": "stager@walsink-test.iam.gserviceaccount.com",
    "token_uri": "https://oauth2.googleapis.com/token",
}


def gcp_conn(monkeypatch, conn_id: str, **extra: Any) -> None:
    monkeypatch.setenv(
        f"AIRFLOW_CONN_{conn_id.upper()}", json.dumps({"conn_type": "google_cloud_platform", "extra": extra})
    )


def emulator_conn(monkeypatch, conn_id: str, server) -> None:
    """The connection a test deployment gives fake-gcs-server: its endpoint, anonymous."""
    gcp_conn(monkeypatch, conn_id, endpoint_url=server.endpoint, is_anonymous=True, project="walsink-test")


def walsink_conn(monkeypatch, url: str, root: str, **extra: Any) -> None:
    monkeypatch.setenv(
        "AIRFLOW_CONN_WALSINK_DEFAULT",
        json.dumps({"conn_type": "walsink", "extra": {"url": url, "staging_root": root, **extra}}),
    )


def conn(conn_type: str = "google_cloud_platform", **extra: Any) -> SimpleNamespace:
    return SimpleNamespace(conn_id="c", conn_type=conn_type, login=None, password=None, extra_dejson=extra)


# ------------------------------------------------------------------ the google_cloud_platform connection


def test_a_google_cloud_platform_connection_becomes_the_stores_options(
    monkeypatch, caplog, capfd, database_urls, gcs_server
):
    caplog.set_level(logging.DEBUG)
    root = f"gs://{gcs_server.bucket}/{uuid.uuid4().hex[:8]}/staging"
    emulator_conn(monkeypatch, "gcs_stage", gcs_server)
    walsink_conn(monkeypatch, database_urls("sqlite"), root, staging_conn_id="gcs_stage")
    hook = WalsinkHook()
    credentials = hook.get_staging_credentials()
    assert credentials.conn_id == "gcs_stage"
    assert credentials.options == {
        "anonymous": "true",
        "project": "walsink-test",
        "endpoint_url": gcs_server.endpoint,
    }
    store = hook.get_staging_store()
    assert isinstance(store, GcsStagingStore) and store.base == root[len("gs://") :]
    store.check_writable()  # a probe object put and deleted on the emulator, with these options
    out, _err = capfd.readouterr()
    assert "credentials from connection 'gcs_stage' (anonymous, project walsink-test, endpoint_url " in (
        caplog.text + out
    )
    # The environment that carries them to the job, and the job's reading of it.
    env = storage_env(root, credentials.options)
    assert env["WALSINK_GCS_ENDPOINT_URL"] == gcs_server.endpoint
    assert storage_options_from_env(root, env) == credentials.options
    assert storage_options_from_env("s3://b/p", env) == {}


def test_a_key_path_or_keyfile_dict_is_the_key_and_never_shown(monkeypatch, tmp_path, caplog, database_urls):
    caplog.set_level(logging.DEBUG)
    key_file = tmp_path / "key.json"
    key_file.write_text(json.dumps(KEYFILE))
    by_path = gcs_options_from_connection(conn(key_path=str(key_file), project="p1"))
    by_dict = gcs_options_from_connection(
        conn(extra__google_cloud_platform__keyfile_dict=json.dumps(KEYFILE))
    )
    assert json.loads(by_path["keyfile_dict"]) == KEYFILE == json.loads(by_dict["keyfile_dict"])
    assert by_path["project"] == "p1"
    # The key reaches the job in the environment (a secret there: never on a command line).
    env = storage_env("gs://b/p", by_path)
    assert json.loads(env["WALSINK_GCS_KEYFILE_DICT"]) == KEYFILE
    from airflow_provider_walsink.hooks.spark_submit_runner import PLAIN_ENV

    assert "WALSINK_GCS_KEYFILE_DICT" not in PLAIN_ENV and "WALSINK_GCS_ENDPOINT_URL" in PLAIN_ENV

    gcp_conn(monkeypatch, "gcs_key", key_path=str(key_file))
    walsink_conn(monkeypatch, database_urls("sqlite"), "gs://b/staging", staging_conn_id="gcs_key")
    credentials = WalsinkHook().get_staging_credentials()
    shown = repr(credentials) + credentials.describe() + caplog.text
    assert "a service-account key" in credentials.describe() and "walsink-test-not-a-real-key" not in shown
    # pyarrow takes no key: it gets an access token for it from the key's token endpoint; this
    # key cannot sign one, and the refusal says so without showing the key.
    with pytest.raises(StagingStoreError, match="service-account key cannot be used|no access token") as info:
        StagingStore.open("gs://b/staging", credentials.options)
    assert "walsink-test-not-a-real-key" not in str(info.value)


def test_the_test_button_lists_a_gcs_root_with_its_connection(monkeypatch, database_urls, gcs_server):
    from tests.conftest import _migrated_store

    url = database_urls("sqlite")
    _migrated_store(url)
    emulator_conn(monkeypatch, "gcs_stage", gcs_server)
    walsink_conn(monkeypatch, url, f"gs://{gcs_server.bucket}/test-button", staging_conn_id="gcs_stage")
    ok, message = WalsinkHook().test_connection()
    assert ok, message
    assert (
        f"Staging root gs://{gcs_server.bucket}/test-button can be listed with connection 'gcs_stage'"
        in message
    )
    walsink_conn(monkeypatch, url, "gs://no-such-bucket/x", staging_conn_id="gcs_stage")
    ok, message = WalsinkHook().test_connection()
    assert not ok and "bucket no-such-bucket does not exist" in message, message


@pytest.fixture
def token_endpoint():
    """Google's OAuth token endpoint as a service account meets it, on a loopback port: it answers
    a signed JWT assertion with an access token, and records each assertion it was sent."""
    import threading
    import urllib.parse
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    assertions: list[str] = []

    class Token(BaseHTTPRequestHandler):
        def do_POST(self):  # noqa: N802 - http.server's name
            form = urllib.parse.parse_qs(self.rfile.read(int(self.headers["Content-Length"])).decode())
            assertions.append(form["assertion"][0])
            body = json.dumps(
                {"access_token": "walsink-access-token", "expires_in": 3600, "token_type": "Bearer"}
            )
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.end_headers()
            self.wfile.write(body.encode())

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Token)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/token", assertions
    finally:
        server.shutdown()
        server.server_close()


def test_a_service_account_key_stages_with_tokens_it_signs_for(
    monkeypatch, tmp_path, database_urls, gcs_server, token_endpoint
):
    """The production route: a key file on the worker, a token for pyarrow (the executors' file
    system) and the service account's own credentials for the seal, both signed with that key."""
    import pickle

    import jwt
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import rsa

    token_uri, assertions = token_endpoint
    private = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    pem = private.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    ).decode()
    key_file = tmp_path / "stager.json"
    key_file.write_text(json.dumps({**KEYFILE, "private_key": pem, "token_uri": token_uri}))
    gcp_conn(monkeypatch, "gcs_key", key_path=str(key_file), endpoint_url=gcs_server.endpoint)
    root = f"gs://{gcs_server.bucket}/{uuid.uuid4().hex[:8]}/staging"
    walsink_conn(monkeypatch, database_urls("sqlite"), root, staging_conn_id="gcs_key")
    store = WalsinkHook().get_staging_store()
    # pyarrow got an access token for the key (one signed assertion, for the storage scope).
    assert len(assertions) == 1
    claims = jwt.decode(
        assertions[0], private.public_key(), algorithms=["RS256"], options={"verify_aud": False}
    )  # signed with the key's private key (verified with its public half)
    assert claims["iss"] == KEYFILE["client_email"] and claims["scope"].endswith("devstorage.read_write")
    assert "walsink-access-token" in repr(pickle.loads(pickle.dumps(store.filesystem)).__reduce__())
    # Staged, sealed once and deleted with those credentials.
    from tests.test_staging_store import ATTEMPT_ID, manifest_for, put

    location = store.attempt("events", "k1", 1, ATTEMPT_ID)
    put(store, f"{location.path}/dt=1/a.parquet", b"abc")
    manifest = manifest_for({"dt=1/a.parquet": b"abc"})
    store.seal(location, manifest)
    assert store.read_manifest(location) == manifest
    assert store.remove_attempt(location) and store.list_attempt(location) == {}
    # The seal's client (google-cloud-storage) signed its own assertions with the same key.
    assert len(assertions) > 1
    for assertion in assertions[1:]:
        signed = jwt.decode(
            assertion, private.public_key(), algorithms=["RS256"], options={"verify_aud": False}
        )
        assert signed["iss"] == KEYFILE["client_email"]


def test_the_google_providers_refusals_each_name_the_connection(tmp_path):
    (tmp_path / "notjson").write_text("not json")
    for bad, match in (
        (conn("aws"), "needs a connection of type 'google_cloud_platform'"),
        (conn(key_secret_name="k"), "Secret Manager is not supported"),
        (conn(credential_config_file="/x.json"), "federation is not supported"),
        (conn(key_path="/a", keyfile_dict="{}"), "both key_path and keyfile_dict"),
        (conn(key_path=str(tmp_path / "missing.json")), "cannot be read"),
        (conn(key_path=str(tmp_path / "notjson")), "the file at key_path is not JSON"),
        (conn(keyfile_dict="{nope"), "keyfile_dict is not JSON"),
        (conn(keyfile_dict={"type": "authorized_user"}), "not a service account's JSON key"),
        (conn(keyfile_dict=KEYFILE, is_anonymous=True), "anonymous and gives a key"),
        (conn(endpoint_url="127.0.0.1:4443"), "endpoint_url must look like"),
    ):
        with pytest.raises(StagingConnectionError, match=match) as info:
            gcs_options_from_connection(bad)
        assert "connection 'c'" in str(info.value) and "walsink-test-not-a-real-key" not in str(info.value)
    # No key and not anonymous: the hosts' default credentials, chosen by this connection.
    assert gcs_options_from_connection(conn(project="p")) == {"project": "p"}
    with pytest.raises(StagingStoreError, match="unknown GCS storage options"):
        StagingStore.open("gs://b/p", {"access_key": "x"})


def test_a_gs_root_is_opened_with_a_google_connection_only(monkeypatch, database_urls):
    url = database_urls("sqlite")
    monkeypatch.delenv("AIRFLOW_CONN_GOOGLE_CLOUD_DEFAULT", raising=False)
    # No staging_conn_id: google_cloud_default, which must exist (never the environment's credentials).
    walsink_conn(monkeypatch, url, "gs://b/staging")
    with pytest.raises(StagingConnectionError, match="connection 'google_cloud_default'.*does not exist"):
        WalsinkHook().get_staging_store()
    gcp_conn(monkeypatch, "google_cloud_default", project="p")
    assert WalsinkHook().get_staging_credentials().conn_id == "google_cloud_default"
    # "" (the default chain, on S3) is refused for gs://, naming the connection to set.
    walsink_conn(monkeypatch, url, "gs://b/staging", staging_conn_id="")
    with pytest.raises(StagingConnectionError, match="opens only with a 'google_cloud_platform' connection"):
        WalsinkHook().get_staging_store()
    # A connection of another type.
    monkeypatch.setenv(
        "AIRFLOW_CONN_AWS_STAGE", json.dumps({"conn_type": "aws", "login": "a", "password": "b"})
    )
    walsink_conn(monkeypatch, url, "gs://b/staging", staging_conn_id="aws_stage")
    with pytest.raises(StagingConnectionError, match="connection 'aws_stage' is of type 'aws'"):
        WalsinkHook().get_staging_store()


@pytest.mark.airflow
def test_the_write_task_refuses_a_gs_root_before_spark_missing_connection_or_bucket(
    airflow_db, sqlite_store, database_urls, monkeypatch, tmp_path, capfd, gcs_server
):
    """Refused by the write task itself (``dag.test()``): nothing recorded, spark-submit never run."""
    url = database_urls("sqlite")
    monkeypatch.setenv(
        "AIRFLOW_CONN_WALSINK_PF_TEST",
        json.dumps({"conn_type": "walsink", "extra": {
            "url": url, "staging_root": "gs://walsink/pf", "staging_conn_id": "gcs_nowhere"}}),
    )  # fmt: skip
    capfd.readouterr()
    states = run_write_task(tmp_path, None)
    out = capfd.readouterr().out
    assert_refused_before_spark(tmp_path, sqlite_store, states, out)
    assert (
        "connection 'gcs_nowhere' (staging_conn_id of walsink connection 'walsink_pf_test') does not exist"
        in out
    )

    emulator_conn(monkeypatch, "gcs_stage", gcs_server)
    monkeypatch.setenv(
        "AIRFLOW_CONN_WALSINK_PF_TEST",
        json.dumps({"conn_type": "walsink", "extra": {
            "url": url, "staging_root": "gs://no-such-staging-bucket/pf", "staging_conn_id": "gcs_stage"}}),
    )  # fmt: skip
    states = run_write_task(tmp_path, None)
    out = capfd.readouterr().out
    assert_refused_before_spark(tmp_path, sqlite_store, states, out)
    assert "bucket 'no-such-staging-bucket' does not exist" in out
    assert "connection 'gcs_stage' (staging_conn_id of walsink connection 'walsink_pf_test'" in out


# ------------------------------------------------------------------ a real write phase on GCS

# Stages 42 rows with the executors' writer into the gs:// root, the options read from the
# environment the write task gave the job (CheckpointJob.from_argv).
JOB = """
import os

from pyspark.sql import SparkSession

from airflow_provider_walsink.core.spark import CheckpointJob

spark = SparkSession.builder.getOrCreate()
with CheckpointJob.from_argv(spark) as job:
    assert job.store.kind == "gs" and os.environ["WALSINK_GCS_ENDPOINT_URL"], job.store
    job.stage(spark.range(42).selectExpr("id", "'2026-04-01' AS dt"), replace_partitions=["dt=2026-04-01"])
spark.stop()
"""


@pytest.mark.spark
@pytest.mark.airflow
@pytest.mark.slow
def test_a_dag_run_stages_on_gcs_through_spark_submit_and_its_sensor_reads_it(
    airflow_db, monkeypatch, sqlite_store, database_urls, gcs_server, tmp_path
):
    """dag.test(): the write task (a real task run) stages on fake-gcs-server through spark-submit
    (the executors write the committables, the driver seals with a create-only upload); the
    sensor reads the root the write task pushed and marks the checkpoint DURABLE."""
    from airflow.sdk import DAG

    from airflow_provider_walsink.operators.write import WalWriteOperator
    from airflow_provider_walsink.sensors.durable import CheckpointDurableSensor

    prefix = f"{uuid.uuid4().hex[:8]}/staging"
    root = f"gs://{gcs_server.bucket}/{prefix}"
    emulator_conn(monkeypatch, "gcs_stage", gcs_server)
    walsink_conn(monkeypatch, database_urls("sqlite"), root, staging_conn_id="gcs_stage")
    job = tmp_path / "job.py"
    job.write_text(JOB)
    with DAG("walsink_gcs_staging_test", schedule="@daily", start_date=INTERVAL_START, catchup=False) as dag:
        write = WalWriteOperator(
            task_id="write",
            application=str(job),
            pipeline="gcsevents",
            partition_by=["dt"],
            master="local[2]",
        )
        durable = CheckpointDurableSensor(
            task_id="durable",
            pipeline="gcsevents",
            staging_root="{{ ti.xcom_pull(task_ids='write', key='staging_root') or '' }}",
            poke_interval=1,
            timeout=120,
        )
        write >> durable
    dr = dag.test(logical_date=INTERVAL_START)
    states = {ti.task_id: ti.state for ti in dr.get_task_instances()}
    assert states == {"write": "success", "durable": "success"}, states
    record = sqlite_store.require("gcsevents", KEY)
    assert (record.state, record.rows, record.staging_root) == (S.DURABLE, 42, root)
    attempt = f"{root}/gcsevents/{KEY}/attempt-1-{record.attempt_id}"
    assert record.manifest_uri == f"{attempt}/{MANIFEST_NAME}"
    # On the service: the manifest and every committable, each with the CRC32C GCS keeps.
    store = StagingStore.open(root, gcs_server.options)
    listed = store.stored_checksums(store.attempt("gcsevents", KEY, 1, record.attempt_id))
    assert MANIFEST_NAME in listed and len(listed) == record.committables + 1, listed
    assert all(checksum.startswith("crc32c:") and len(checksum) == 15 for _s, checksum in listed.values())
