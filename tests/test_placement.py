"""Staging placement: a non-local Spark master needs a staging root every node sees."""

from __future__ import annotations

import json

import pytest

from airflow_provider_walsink.operators.placement import (
    StagingPlacementError,
    check_operator_placement,
    check_staging_placement,
    filesystem_of,
    is_same_host_master,
    read_mounts,
    spark_master_of,
)

LOCAL_DISK = [("/", "ext4")]


@pytest.mark.parametrize(
    "master",
    [
        "local",
        "local[*]",
        "local[2]",
        "local[2,3]",
        "local-cluster[2,1,1024]",
        "spark://127.0.0.1:7077",
        "spark://localhost:7077",
        "spark://[::1]:7077",
        "spark://127.0.0.1:7077,127.0.0.2:7078",
    ],
)
def test_a_master_on_this_host_accepts_a_local_staging_root(master, tmp_path):
    assert is_same_host_master(master)
    assert "this host" in check_staging_placement(tmp_path / "staging", master, mounts=LOCAL_DISK)


@pytest.mark.parametrize(
    "master",
    [
        "spark://spark-master:7077",
        "spark://127.0.0.1:7077,10.0.0.5:7077",
        "yarn",
        "k8s://https://10.0.0.1:6443",
        "mesos://zk.example:5050",
        "spark://10.1.2.3:7077",
    ],
)
def test_a_cluster_master_refuses_a_local_staging_root_naming_the_fix(master, tmp_path):
    assert not is_same_host_master(master)
    with pytest.raises(StagingPlacementError) as err:
        check_staging_placement(tmp_path / "staging", master, mounts=LOCAL_DISK)
    message = str(err.value)
    assert "\n" not in message
    assert str(tmp_path / "staging") in message and master in message
    assert "local ext4 file system mounted at /" in message
    assert '"staging_shared": true' in message


def test_a_declared_shared_root_is_accepted(tmp_path):
    reason = check_staging_placement(tmp_path, "spark://spark-master:7077", shared=True, mounts=LOCAL_DISK)
    assert "declared shared" in reason


@pytest.mark.parametrize(
    "root",
    [
        "hdfs://namenode:8020/walsink/staging",
        "s3a://bucket/staging",
        "gs://b/s",
        "abfss://c@a.dfs.core.windows.net/s",
    ],
)
def test_a_distributed_or_object_store_root_is_accepted(root):
    assert "reachable from every node" in check_staging_placement(root, "yarn", mounts=LOCAL_DISK)


def test_a_file_uri_is_a_local_path():
    with pytest.raises(StagingPlacementError, match="file:///data/staging"):
        check_staging_placement("file:///data/staging", "yarn", mounts=LOCAL_DISK)


@pytest.mark.parametrize(
    "fstype", ["nfs4", "nfs", "cifs", "ceph", "glusterfs", "lustre", "fuse.s3fs", "fuse.juicefs"]
)
def test_a_network_mount_is_recognised_from_the_mount_table(fstype, tmp_path):
    share = tmp_path / "share"
    share.mkdir()
    mounts = [("/", "ext4"), (str(share), fstype)]
    # The staging root need not exist yet: its nearest existing ancestor decides.
    reason = check_staging_placement(
        share / "walsink" / "staging", "spark://spark-master:7077", mounts=mounts
    )
    assert fstype in reason and str(share) in reason


def test_the_longest_mount_point_decides_and_symlinks_are_followed(tmp_path):
    share, local = tmp_path / "share", tmp_path / "share" / "local"
    local.mkdir(parents=True)
    mounts = [("/", "ext4"), (str(share), "nfs4"), (str(local), "tmpfs")]
    with pytest.raises(StagingPlacementError, match="tmpfs"):
        check_staging_placement(local / "staging", "yarn", mounts=mounts)
    link = tmp_path / "link"
    link.symlink_to(share)
    assert filesystem_of(link / "staging", mounts) == (str(share), "nfs4")
    assert filesystem_of(tmp_path / "elsewhere", mounts) == ("/", "ext4")


def test_fuse_programs_that_are_not_shared_stores_do_not_count(tmp_path):
    mounts = [("/", "fuse.portal")]
    with pytest.raises(StagingPlacementError, match="fuse.portal"):
        check_staging_placement(tmp_path, "yarn", mounts=mounts)


def test_the_mount_table_is_parsed_with_its_escapes(tmp_path):
    table = tmp_path / "mounts"
    table.write_text(
        "/dev/sda1 / ext4 rw 0 0\nserver:/export /mnt/my\\040share nfs4 rw,relatime 0 0\ngarbage\n"
    )
    assert read_mounts(table) == [("/", "ext4"), ("/mnt/my share", "nfs4")]
    assert read_mounts(tmp_path / "missing") == []
    assert "/" in {point for point, _ in read_mounts()}  # this machine's own table


class _Conn:
    def __init__(self, conn_type, host, port=None):
        self.conn_type, self.host, self.port = conn_type, host, port


@pytest.mark.parametrize(
    ("conn", "master"),
    [
        (_Conn("spark", "spark://spark-master", 7077), "spark://spark-master:7077"),  # UI or JSON form
        (_Conn("spark", "spark-master", 7077), "spark://spark-master:7077"),  # URI form
        (_Conn("spark", "yarn"), "yarn"),
        (_Conn("spark", "local[3]"), "local[3]"),
        (_Conn("k8s", "https://10.0.0.1", 6443), "k8s://https://10.0.0.1:6443"),
    ],
)
def test_the_master_of_a_spark_connection_is_the_spark_providers(conn, master):
    assert spark_master_of(conn) == master


def test_the_provider_hook_agrees_on_the_connection_master(monkeypatch):
    from airflow.providers.apache.spark.hooks.spark_submit import SparkSubmitHook
    from airflow.sdk import BaseHook

    for uri in (
        "spark://spark-master:7077",
        json.dumps({"conn_type": "spark", "host": "spark://m", "port": 7077}),
    ):
        monkeypatch.setenv("AIRFLOW_CONN_SPARK_PLACEMENT", uri)
        hook = SparkSubmitHook(conn_id="spark_placement")
        assert spark_master_of(BaseHook.get_connection("spark_placement")) == hook._connection["master"]


# --------------------------------------------------------------------------- the write task


@pytest.fixture
def cluster_connections(monkeypatch, sqlite_store, database_urls, tmp_path):
    url = database_urls("sqlite")
    monkeypatch.setenv(
        "AIRFLOW_CONN_SPARK_REMOTE",
        json.dumps({"conn_type": "spark", "host": "spark://spark-master", "port": 7077}),
    )

    def walsink(**extra):
        monkeypatch.setenv(
            "AIRFLOW_CONN_WALSINK_DEFAULT",
            json.dumps(
                {"conn_type": "walsink", "extra": {"url": url, "staging_root": str(tmp_path / "s"), **extra}}
            ),
        )

    return sqlite_store, walsink


def test_the_write_task_fails_before_recording_anything(cluster_connections, tmp_path):
    from airflow_provider_walsink.hooks.walsink import WalsinkHook
    from airflow_provider_walsink.operators.write import WalWriteOperator

    store, walsink = cluster_connections
    walsink()
    op = WalWriteOperator(
        task_id="w",
        application="job.py",
        pipeline="placed",
        checkpoint_key="k1",
        spark_conn_id="spark_remote",
    )
    with pytest.raises(StagingPlacementError, match=r"Spark master spark://spark-master:7077 is not local"):
        op.execute({})
    assert store.get("placed", "k1") is None  # nothing registered
    assert not (tmp_path / "s").exists()  # nothing staged

    walsink(staging_shared=True)  # the declaration, as docker/compose.yaml makes it
    hook = WalsinkHook()
    assert "declared shared" in check_operator_placement(op, hook, hook.staging_root)
    walsink(staging_shared="false")
    with pytest.raises(StagingPlacementError):
        check_operator_placement(op, WalsinkHook(), tmp_path / "s")
    # Without a Spark connection the operator's own master decides (local by default).
    local = WalWriteOperator(task_id="w", application="job.py", pipeline="placed")
    assert "this host" in check_operator_placement(local, WalsinkHook(), tmp_path / "s")
