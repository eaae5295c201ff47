"""Supported Airflow versions (issue 37): a feature that needs a newer Airflow than the installed one
is refused at parse time when asked for by name, degrades with one log line otherwise, and never
makes importing the provider fail. The older Airflow is simulated here by hiding the modules the
feature needs (``sys.modules[name] = None``: importing it raises ImportError, as on an Airflow that
lacks it); ``scripts/test-oldest-airflow.sh`` runs the core and ``dag.test()`` tests on the real
oldest supported Airflow."""

from __future__ import annotations

import ast
import configparser
import importlib
import logging
import pkgutil
import re
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from airflow.sdk import DAG

from airflow_provider_walsink.core.commit.audit import RowCountCheck
from airflow_provider_walsink.hooks import versions
from airflow_provider_walsink.operators.pipeline import walsink_pipeline

ROOT = Path(__file__).resolve().parent.parent
START = datetime(2026, 1, 1, tzinfo=UTC)
REQUIRED = {"pipeline": "p", "application": "/jobs/job.py", "target": "/data/t"}
#: What each feature's probe imports; hidden, the installed Airflow looks like one without it.
HIDE = {
    "commit_deadline": ["airflow.sdk.definitions.deadline", "airflow.sdk.definitions.callback"],
    "audit_approval": ["airflow.providers.standard.operators.hitl"],
}


def _hide(monkeypatch, feature: str) -> None:
    for name in HIDE[feature]:
        monkeypatch.setitem(sys.modules, name, None)


def test_setup_cfg_and_the_oldest_airflow_script_state_the_same_oldest_version():
    cfg = configparser.ConfigParser()
    cfg.read(ROOT / "setup.cfg")
    requires = cfg["options"]["install_requires"]
    assert re.search(rf"^apache-airflow>={re.escape(versions.OLDEST_AIRFLOW)},<4$", requires, re.M)
    assert re.search(r"^apache-airflow-providers-standard>=1\.9\.0$", requires, re.M)
    script = (ROOT / "scripts" / "test-oldest-airflow.sh").read_text()
    assert f'AIRFLOW_VERSION="${{AIRFLOW_VERSION:-{versions.OLDEST_AIRFLOW}}}"' in script


def test_the_probes_find_the_features_of_this_airflows_version():
    # The version table of versions.py against the installed Airflow: all on the CI's 3.3, fewer
    # on the oldest (scripts/test-oldest-airflow.sh runs this file there too).
    major_minor = tuple(int(p) for p in versions.airflow_version().split(".")[:2])
    expected = {"audit_approval"}
    expected |= {"asset_partitions", "asset_event_queries"} if major_minor >= (3, 2) else set()
    expected |= {"commit_deadline"} if major_minor >= (3, 3) else set()
    found = {name for name in versions.FEATURES if versions.missing(name) is None}
    assert found == expected, {name: versions.missing(name) for name in versions.FEATURES}


async def _notify(**kwargs):  # a deadline callback's function
    return kwargs


def test_a_commit_deadline_on_an_airflow_without_deadline_alerts_is_refused_at_parse_time(monkeypatch):
    try:
        from airflow.sdk import AsyncCallback
    except ImportError:  # Airflow before 3.2: any callback; the deadline is refused before it is read
        callback = object()
    else:
        callback = AsyncCallback(_notify)
    _hide(monkeypatch, "commit_deadline")
    with DAG("d", schedule=None, start_date=START) as dag:
        with pytest.raises(versions.FeatureUnavailable) as refused:
            walsink_pipeline(
                "events", **REQUIRED, commit_deadline=timedelta(hours=2), commit_deadline_callback=callback
            )
        # Without the option the pipeline is today's: the four tasks, no deadline alert.
        walsink_pipeline("other", **{**REQUIRED, "pipeline": "q"})
    message = str(refused.value)
    assert message.startswith("walsink_pipeline('p'): commit_deadline needs Airflow 3.3 or later")
    assert f"this is Airflow {versions.airflow_version()}" in message
    assert "cannot import airflow.sdk.definitions.deadline" in message
    assert "remove commit_deadline=" in message
    assert sorted(t.task_id for t in dag.tasks) == ["other.commit", "other.durable", "other.write"]
    assert not dag.deadline


def test_an_audit_approval_on_an_airflow_without_hitl_operators_is_refused_at_parse_time(monkeypatch):
    _hide(monkeypatch, "audit_approval")
    with DAG("d", schedule=None, start_date=START) as dag:
        with pytest.raises(versions.FeatureUnavailable) as refused:
            walsink_pipeline("events", **REQUIRED, audit=[RowCountCheck(min_rows=1)], audit_approval=True)
    assert str(refused.value).startswith(
        "walsink_pipeline('p'): audit_approval needs Airflow 3.1 or later with "
        "apache-airflow-providers-standard 1.8.0 or later"
    )
    assert "cannot import airflow.providers.standard.operators.hitl" in str(refused.value)
    assert dag.tasks == []  # refused before any task exists


def test_a_missing_feature_walsink_would_only_use_if_there_degrades_with_one_log_line(monkeypatch, caplog):
    _hide(monkeypatch, "commit_deadline")
    versions._available.cache_clear()
    try:
        with caplog.at_level(logging.WARNING, logger=versions.__name__):
            assert versions.available("commit_deadline") is False
            assert versions.available("commit_deadline") is False
    finally:
        versions._available.cache_clear()
    [line] = [r.getMessage() for r in caplog.records if r.name == versions.__name__]
    assert line.startswith(f"walsink: commit_deadline off on Airflow {versions.airflow_version()}")
    assert "needs Airflow 3.3 or later" in line and "cannot import airflow.sdk.definitions.deadline" in line


def test_every_provider_module_imports_on_this_airflow():
    # On the CI's Airflow trivially; on the oldest one (scripts/test-oldest-airflow.sh) this is
    # the check that no module of the provider fails to import there.
    import airflow_provider_walsink as pkg

    skip = (".__main__",) if versions.missing("audit_approval") is None else (".__main__", ".approval")
    for info in pkgutil.walk_packages(pkg.__path__, pkg.__name__ + "."):
        if not info.name.endswith(skip) and ".migrations." not in info.name:
            importlib.import_module(info.name)


def test_no_module_imports_a_newer_airflow_feature_when_it_is_imported():
    # What the newer features need is imported inside the functions that use them (after
    # versions.require), never at a module's top level, where it would fail on an older Airflow;
    # the approval operator is the HITL step itself and is imported only for audit_approval.
    newer = ("airflow.sdk.definitions.deadline", "airflow.sdk.definitions.callback",
             "airflow.sdk._shared", "airflow.providers.standard.operators.hitl")  # fmt: skip
    newer_names = {"DeadlineAlert", "DeadlineReference", "AsyncCallback", "SyncCallback",
                   "CronPartitionTimetable", "PartitionedAssetTimetable"}  # fmt: skip
    found = []
    for path in sorted((ROOT / "airflow_provider_walsink").rglob("*.py")):
        if path.name == "approval.py":
            continue
        for node in ast.parse(path.read_text()).body:  # the top level only
            for imp in [node, *(getattr(node, "body", []) if isinstance(node, ast.Try) else [])]:
                if isinstance(imp, ast.ImportFrom) and imp.module:
                    names = {a.name for a in imp.names}
                    if imp.module.startswith(newer) or (imp.module == "airflow.sdk" and names & newer_names):
                        found.append(f"{path.relative_to(ROOT)}:{imp.lineno} {imp.module}")
    assert found == []
