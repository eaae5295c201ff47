"""Issue 48, Azure: an ``abfss://`` staging root opened with Airflow connections, against Azurite.

* The Azure provider's ``wasb`` connection (login = account, password = key, host = the account
  URL, or a connection string) and ``adls`` connection (host = account, password = key, extra
  ``account_url``) become the :class:`AdlsStagingStore` options; a key is in no log line and no
  ``repr``, and reaches the job in the environment, never on a command line.
* The credentials come from that connection only: an ``abfss://`` root without one (missing,
  ``staging_conn_id: ""``, or of another type), with a SAS token, a service principal or a
  managed identity, or for another account is refused naming the connection, and the write
  phase's staging check refuses it before anything is recorded or Spark starts; so is a container
  that does not exist.
"""

from __future__ import annotations

import json
import logging
import uuid
from types import SimpleNamespace
from typing import Any

import pytest

from airflow_provider_walsink.core.protocol.errors import PreflightError
from airflow_provider_walsink.core.spark.args import storage_env, storage_options_from_env
from airflow_provider_walsink.core.staging.adls import AdlsStagingStore
from airflow_provider_walsink.core.staging.probe import StagingNotWritableError
from airflow_provider_walsink.hooks.azure_staging import azure_options_from_connection
from airflow_provider_walsink.hooks.staging import StagingConnectionError
from airflow_provider_walsink.hooks.walsink import WalsinkHook

ROOT = "abfss://walsink@walsinkdev.dfs.core.windows.net/staging"
#: A key's stand-in no log or message may show (base64, as a storage account key is).
KEY = "V0FMU0lOSy1URVNULU5PVC1BLVJFQUwtS0VZ"


def azure_conn(monkeypatch, conn_id: str, conn_type: str = "wasb", **fields: Any) -> None:
    monkeypatch.setenv(f"AIRFLOW_CONN_{conn_id.upper()}", json.dumps({"conn_type": conn_type, **fields}))


def emulator_conn(monkeypatch, conn_id: str, server) -> None:
    """The ``wasb`` connection a test deployment gives Azurite: account, key, the account's URL."""
    azure_conn(monkeypatch, conn_id, login=server.account, password=server.key, host=server.endpoint)


def walsink_conn(monkeypatch, url: str, root: str, **extra: Any) -> None:
    monkeypatch.setenv(
        "AIRFLOW_CONN_WALSINK_DEFAULT",
        json.dumps({"conn_type": "walsink", "extra": {"url": url, "staging_root": root, **extra}}),
    )


def conn(conn_type: str = "wasb", **fields: Any) -> SimpleNamespace:
    base = dict(conn_id="c", conn_type=conn_type, login=None, password=None, host=None, extra_dejson={})
    return SimpleNamespace(**{**base, **fields})


def test_a_wasb_or_adls_connection_becomes_the_stores_options(
    monkeypatch, caplog, capfd, database_urls, azurite_server
):
    caplog.set_level(logging.DEBUG)
    root = azurite_server.root(f"{uuid.uuid4().hex[:8]}/staging")
    emulator_conn(monkeypatch, "azure_stage", azurite_server)
    walsink_conn(monkeypatch, database_urls("sqlite"), root, staging_conn_id="azure_stage")
    hook = WalsinkHook()
    credentials = hook.get_staging_credentials()
    assert credentials.conn_id == "azure_stage"
    assert credentials.options == {"account_key": azurite_server.key, "endpoint_url": azurite_server.endpoint}
    store = hook.get_staging_store()
    assert isinstance(store, AdlsStagingStore) and store.base == "walsink/" + root.split("/", 3)[3]
    store.check_writable()  # a probe blob put and deleted on Azurite, with these options
    assert azurite_server.list(store.base.split("/", 1)[1]) == []  # and nothing left, no marker
    out, _err = capfd.readouterr()
    shown = caplog.text + out + repr(credentials)
    assert (
        "credentials from connection 'azure_stage' (an account key, endpoint_url http://127.0.0.1:" in shown
    )
    assert azurite_server.key not in shown
    # The environment that carries them to the job (the key a secret there), and the job's reading of it.
    env = storage_env(root, credentials.options)
    assert env == {
        "WALSINK_AZURE_ACCOUNT_KEY": azurite_server.key,
        "WALSINK_AZURE_ENDPOINT_URL": azurite_server.endpoint,
    }
    assert storage_options_from_env(root, env) == credentials.options
    from airflow_provider_walsink.hooks.spark_submit_runner import PLAIN_ENV

    assert "WALSINK_AZURE_ACCOUNT_KEY" not in PLAIN_ENV and "WALSINK_AZURE_ENDPOINT_URL" in PLAIN_ENV
    # The adls type gives the same options (host = account, extra account_url), and so does a
    # wasb connection string.
    adls = conn("adls", host=azurite_server.account, password=azurite_server.key,
                extra_dejson={"account_url": azurite_server.endpoint})  # fmt: skip
    assert azure_options_from_connection(adls, root) == credentials.options
    text = f"AccountName={azurite_server.account};AccountKey={azurite_server.key};BlobEndpoint={azurite_server.endpoint}"
    by_string = conn(extra_dejson={"connection_string": text})
    assert azure_options_from_connection(by_string, root) == credentials.options
    # A wrong key is refused by the service before anything is staged.
    wrong = AdlsStagingStore.open_root(root, {**credentials.options, "account_key": KEY})
    with pytest.raises(StagingNotWritableError, match="staging root abfss://"):
        wrong.check_writable()


def test_the_azure_providers_refusals_each_name_the_connection():
    for bad, match in (
        (conn("aws"), "needs a connection of type 'wasb'"),
        (conn(password=KEY, extra_dejson={"tenant_id": "t"}), "service principal .* is not supported"),
        (conn(extra_dejson={"managed_identity_client_id": "m"}), "managed identity is not supported"),
        (conn(), "holds no storage account key"),
        (conn(login="walsinkdev", extra_dejson={"sas_token": "sv=x"}), "a SAS token is not supported"),
        (
            conn(extra_dejson={"connection_string": "AccountName=walsinkdev;SharedAccessSignature=sv=x"}),
            "'sharedaccesssignature' is not supported",
        ),
        (conn(password=KEY, extra_dejson={"connection_string": f"AccountKey={KEY}"}), "and a key: give one"),
        (conn(login="otheracct", password=KEY), "is for storage account 'otheracct'"),
        (conn("adls", host="otheracct", password=KEY), "is for storage account 'otheracct'"),
        (conn(password=KEY, host="http://127.0.0.1:10000"), "neither Azure's"),
        (conn(extra_dejson={"connection_string": "UseDevelopmentStorage=true"}), "'usedevelopmentstorage'"),
        (conn(extra_dejson={"connection_string": "nonsense"}), "not Name=value pairs"),
    ):
        with pytest.raises(StagingConnectionError, match=match) as info:
            azure_options_from_connection(bad, ROOT)
        assert "connection 'c'" in str(info.value) and KEY not in str(info.value)
    # Azure's own account URL is the root's: no endpoint option.
    ok = conn(login="walsinkdev", password=KEY, host="https://walsinkdev.blob.core.windows.net/")
    assert azure_options_from_connection(ok, ROOT) == {"account_key": KEY}


def test_an_abfss_root_is_opened_with_an_azure_connection_only(monkeypatch, database_urls, azurite_server):
    from tests.conftest import _migrated_store

    url = database_urls("sqlite")
    monkeypatch.delenv("AIRFLOW_CONN_WASB_DEFAULT", raising=False)
    # No staging_conn_id: wasb_default, which must exist (never the environment's credentials).
    walsink_conn(monkeypatch, url, ROOT)
    with pytest.raises(StagingConnectionError, match="connection 'wasb_default'.*does not exist"):
        WalsinkHook().get_staging_store()
    azure_conn(monkeypatch, "wasb_default", login="walsinkdev", password=KEY)
    assert WalsinkHook().get_staging_credentials().conn_id == "wasb_default"
    # "" (the default chain, on S3) is refused for abfss://, naming the connection to set.
    walsink_conn(monkeypatch, url, ROOT, staging_conn_id="")
    with pytest.raises(StagingConnectionError, match="opens only with a 'wasb' or 'adls' connection"):
        WalsinkHook().get_staging_store()
    azure_conn(monkeypatch, "aws_stage", "aws", login="a", password="b")
    walsink_conn(monkeypatch, url, ROOT, staging_conn_id="aws_stage")
    with pytest.raises(StagingConnectionError, match="connection 'aws_stage' is of type 'aws'"):
        WalsinkHook().get_staging_store()
    # The connection form's Test button lists the root with its connection; a missing container is said.
    _migrated_store(url)
    emulator_conn(monkeypatch, "azure_stage", azurite_server)
    walsink_conn(monkeypatch, url, azurite_server.root("test-button"), staging_conn_id="azure_stage")
    ok, message = WalsinkHook().test_connection()
    assert ok and "can be listed with connection 'azure_stage' (an account key" in message, message
    walsink_conn(monkeypatch, url, azurite_server.root("x", container="no-such-container"),
                 staging_conn_id="azure_stage")  # fmt: skip
    ok, message = WalsinkHook().test_connection()
    assert not ok and "bucket no-such-container does not exist" in message, message


def test_the_write_tasks_staging_check_refuses_a_missing_connection_or_container(
    monkeypatch, database_urls, azurite_server
):
    """The staging check the write phase runs before it records anything or starts Spark
    (``WalsinkHook._check_staging``, the write phase's ``check_staging``) refuses an ``abfss://``
    root whose connection does not exist, or whose container does not exist, naming the
    connection. How the write task turns that refusal into a failed task with nothing recorded and
    no spark-submit is the same for every root, and run with ``dag.test()`` on S3 and GCS
    (test_preflight, test_gcs_staging_airflow): not again here, to spare CI an Airflow run."""
    url = database_urls("sqlite")

    def check(root: str, conn_id: str) -> str:
        monkeypatch.setenv("AIRFLOW_CONN_WALSINK_PF_TEST", json.dumps({"conn_type": "walsink", "extra": {
            "url": url, "staging_root": root, "staging_conn_id": conn_id}}))  # fmt: skip
        with pytest.raises(PreflightError) as refused:
            WalsinkHook("walsink_pf_test")._check_staging(root)
        return str(refused.value)

    assert (
        "connection 'azure_nowhere' (staging_conn_id of walsink connection 'walsink_pf_test') does not exist: "
        "create it, of type 'wasb' or 'adls'" in check(azurite_server.root("pf"), "azure_nowhere")
    )
    emulator_conn(monkeypatch, "azure_stage", azurite_server)
    message = check(azurite_server.root("pf", container="no-such-container"), "azure_stage")
    assert "bucket 'no-such-container' does not exist" in message
    assert "connection 'azure_stage' (staging_conn_id of walsink connection 'walsink_pf_test'" in message
    assert azurite_server.key not in message
