"""The file target on an object store: refused before anything is written, naming the table targets.

A file target publishes by rename and directory swap on one file system; an
object store has neither, so walsink refuses a file target URI or a staging
root there instead of publishing non-atomically (docs/targets.md).
"""

from __future__ import annotations

import os

import pytest

from airflow_provider_walsink.core.staging.layout import StagingLayout
from airflow_provider_walsink.core.staging.object_store import StagingStore
from airflow_provider_walsink.core.targets.files import (
    FilePublisher,
    ObjectStoreFileTargetError,
    refuse_object_store,
)
from tests.table_fixtures import ACCESS_KEY, REGION, SECRET_KEY, s3_server  # noqa: F401


@pytest.mark.parametrize(
    "uri", ["s3://bucket/events", "gs://bucket/events", "abfs://c@acct.dfs.core.windows.net/t"]
)
def test_a_file_target_on_an_object_store_is_refused_naming_the_table_targets(tmp_path, monkeypatch, uri):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ObjectStoreFileTargetError) as caught:
        FilePublisher(uri, "append", layout=StagingLayout(tmp_path / "staging"))
    message = str(caught.value)
    assert uri in message and "Iceberg" in message and "Delta" in message and "atomic" in message, message
    # Before this refusal the URI was taken for a relative path: <cwd>/s3:/bucket/events.
    assert os.listdir(tmp_path) == []


def test_a_file_target_staging_on_an_object_store_is_refused(tmp_path, s3_server):  # noqa: F811
    options = {
        "endpoint_url": s3_server.endpoint,
        "access_key": ACCESS_KEY,
        "secret_key": SECRET_KEY,
        "region": REGION,
    }
    staging = StagingStore.open(f"s3://{s3_server.bucket}/files-staging", options)
    with pytest.raises(ObjectStoreFileTargetError, match="staging root 's3://.*Iceberg.*Delta"):
        FilePublisher(tmp_path / "target", "overwrite", layout=staging)
    # A local store is a local layout: accepted.
    FilePublisher(tmp_path / "target", "overwrite", layout=StagingStore.open(str(tmp_path / "staging")))


def test_the_pre_flight_check_refuses_an_object_store_staging_root(tmp_path):
    """``check_writable`` runs before any Spark job (operators/commit.py: target_staging_root)."""
    publisher = FilePublisher(tmp_path / "target", "append", layout=StagingLayout(tmp_path / "staging"))
    publisher.check_writable()  # local target and staging: fine
    publisher.check_writable(str(tmp_path / "staging"))
    publisher.check_writable(f"file://{tmp_path}/staging")
    with pytest.raises(ObjectStoreFileTargetError, match="s3://bucket/staging.*Iceberg"):
        publisher.check_writable("s3://bucket/staging")
    assert not (tmp_path / "target").exists()
    refuse_object_store(tmp_path / "t", tmp_path / "s")  # paths are never refused
