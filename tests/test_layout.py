"""The package's shape (docs/architecture.md): the core runs without Airflow, no import circle,
and the package root holds only ``__init__`` and ``get_provider_info``."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

from helpers import REPO

PACKAGE = REPO / "airflow_provider_walsink"

# Import every module under core/ in a fresh interpreter in which importing Airflow fails:
# a static lint can miss an import built at run time, this cannot.
_IMPORT_CORE_WITHOUT_AIRFLOW = textwrap.dedent(
    """
    import importlib, importlib.abc, pkgutil, sys

    class NoAirflow(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name == "airflow" or name.startswith("airflow."):
                raise ImportError(f"the core imported Airflow ({name})")
            return None

    sys.meta_path.insert(0, NoAirflow())
    probe = sys.argv[1:]
    import airflow_provider_walsink.core as core
    names = probe or [m.name for m in pkgutil.walk_packages(core.__path__, core.__name__ + ".")
                      if ".migrations" not in m.name]
    for name in names:
        importlib.import_module(name)
    leaked = sorted(m for m in sys.modules if m == "airflow" or m.startswith("airflow."))
    assert not leaked, leaked
    print(len(names), "modules")
    """
)


def _import_without_airflow(*modules: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", _IMPORT_CORE_WITHOUT_AIRFLOW, *modules],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=300,
    )


def test_every_core_module_imports_with_airflow_absent():
    result = _import_without_airflow()
    assert result.returncode == 0, result.stderr
    assert int(result.stdout.split()[0]) >= 40  # every core module was imported, not none


def test_the_airflow_blocker_catches_an_airflow_import():
    """The check above can fail: an Airflow face imported the same way is refused."""
    result = _import_without_airflow("airflow_provider_walsink.hooks.walsink")
    assert result.returncode != 0 and "imported Airflow" in result.stderr


def test_no_import_circle_and_the_core_never_imports_airflow():
    """import-linter's contracts in setup.cfg: acyclic siblings at every depth, core -/-> airflow."""
    lint = Path(sys.executable).with_name("lint-imports")  # this interpreter's venv's script
    result = subprocess.run([str(lint), "--no-cache"], capture_output=True, text=True, cwd=REPO, timeout=300)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
    assert "Contracts: 2 kept, 0 broken." in result.stdout


def test_the_package_root_holds_only_init_and_provider_info():
    loose = sorted(p.name for p in PACKAGE.glob("*.py"))
    assert loose == ["__init__.py", "get_provider_info.py"]
    folders = sorted(p.name for p in PACKAGE.iterdir() if p.is_dir() and p.name != "__pycache__")
    assert folders == ["cli", "core", "hooks", "operators", "sensors", "triggers", "ui"]


def test_old_public_module_paths_still_import_with_a_deprecation_warning():
    for name in [m for m in list(sys.modules) if m.startswith("airflow_provider_walsink.spark")]:
        del sys.modules[name]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        from airflow_provider_walsink.spark import CheckpointJob as old  # noqa: PLC0415
    from airflow_provider_walsink.core.spark import CheckpointJob

    assert old is CheckpointJob
    assert any(
        issubclass(w.category, DeprecationWarning) and "airflow_provider_walsink.core.spark" in str(w.message)
        for w in caught
    )
