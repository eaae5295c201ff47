"""The provider registers with Airflow: provider info, connection type, hook."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import airflow
import jsonschema
import pytest

from airflow_provider_walsink.get_provider_info import get_provider_info


def test_provider_info_validates_against_airflows_schema():
    schema = json.loads((Path(airflow.__file__).parent / "provider_info.schema.json").read_text())
    info = get_provider_info()
    jsonschema.validate(info, schema)
    conn = info["connection-types"][0]
    assert conn["connection-type"] == "walsink"
    assert {"backend", "staging_root"} <= set(conn["conn-fields"])


def test_every_listed_module_and_class_imports():
    import importlib

    info = get_provider_info()
    for section in ("hooks", "operators", "sensors", "triggers"):
        for entry in info.get(section, []):
            for module in entry["python-modules"]:
                importlib.import_module(module)
    for conn in info["connection-types"]:
        module, _, cls = conn["hook-class-name"].rpartition(".")
        assert getattr(importlib.import_module(module), cls).conn_type == conn["connection-type"]


def _airflow(*args: str) -> str:
    out = subprocess.run(
        [sys.executable, "-m", "airflow", *args],
        capture_output=True,
        text=True,
        env=os.environ.copy(),
        timeout=300,
    )
    assert out.returncode == 0, out.stderr
    return out.stdout


def test_airflow_lists_the_provider_and_its_connection_type():
    assert "airflow-provider-walsink" in _airflow("providers", "list")
    hooks = _airflow("providers", "hooks")
    assert any("walsink" in line and "WalsinkHook" in line for line in hooks.splitlines())


@pytest.mark.parametrize(
    ("fields", "expected"),
    [
        (
            dict(
                backend="postgresql", host="127.0.0.1", port=5432, login="u", password="p@ss/w", database="db"
            ),
            "postgresql+psycopg2://u:p%40ss%2Fw@127.0.0.1:5432/db",
        ),
        (
            dict(backend="mysql", host="127.0.0.1", port=3306, login="root", password=None, database="test"),
            "mysql+pymysql://root@127.0.0.1:3306/test",
        ),
        (
            dict(backend="sqlite", host=None, port=None, login=None, password=None, database="/var/w.db"),
            "sqlite:////var/w.db",
        ),
    ],
)
def test_connection_fields_build_a_sqlalchemy_url(fields, expected):
    from airflow_provider_walsink.hooks.walsink import url_from_connection

    assert url_from_connection(**fields) == expected


def test_unknown_backend_is_a_clear_error():
    from airflow_provider_walsink.hooks.walsink import url_from_connection

    with pytest.raises(ValueError, match="backend must be one of"):
        url_from_connection(backend="oracle", host="h", port=1, login=None, password=None, database="d")


def test_a_built_wheel_carries_the_migrations_and_they_run(tmp_path):
    """A non-editable install must include Alembic's env.py and versions (not Python packages)."""
    import shutil

    from tests.helpers import REPO

    # Build from a copy of the tracked sources, so the build leaves nothing in the checkout.
    tracked = subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True, check=True)
    source = tmp_path / "source"
    for rel in tracked.stdout.splitlines():
        (source / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(REPO / rel, source / rel)
    wheels = tmp_path / "wheels"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "-q",
            "--no-deps",
            "--no-build-isolation",
            "-w",
            str(wheels),
            str(source),
        ],
        check=True,
        capture_output=True,
        timeout=300,
    )
    # The wheel is the provider alone: no test or demo tooling, and a root of two modules.
    import zipfile

    [wheel] = wheels.glob("*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    package = [n for n in names if n.startswith("airflow_provider_walsink/")]
    assert not [n for n in package if "/testing/" in n or n.endswith(("/demo.py", "/stack.py", "/guard.py"))]
    assert sorted(n for n in package if n.count("/") == 1) == [
        "airflow_provider_walsink/__init__.py",
        "airflow_provider_walsink/get_provider_info.py",
    ]
    assert not [n for n in names if n.startswith(("tests/", "scripts/", "bench/", "dags/"))]
    site = tmp_path / "site"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "-q",
            "--no-deps",
            "--target",
            str(site),
            *map(str, wheels.glob("*.whl")),
        ],
        check=True,
        capture_output=True,
        timeout=300,
    )
    script = (
        "import airflow_provider_walsink as w, sys;"
        f"assert w.__file__.startswith({str(site)!r}), w.__file__;"
        "from airflow_provider_walsink.core.store import CommitterStore;"
        f"s = CommitterStore.from_url('sqlite:///{tmp_path}/c.db');"
        "print(sorted(s.engine.dialect.get_table_names(s.engine.connect())))"
    )
    out = subprocess.run(
        [sys.executable, "-c", script],
        env={**os.environ, "PYTHONPATH": str(site)},
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    assert out.returncode == 0, out.stderr
    assert "walsink_checkpoint" in out.stdout and "walsink_alembic_version" in out.stdout
