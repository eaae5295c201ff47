"""Which of walsink's Airflow features this Airflow has (docs/production.md, "Supported Airflow versions").

walsink supports Airflow 3.1.1 and later 3.x (``setup.cfg``). The write, durability gate, audit,
commit, UI and CLI work on all of them. Some features need a newer Airflow; each is detected by
what walsink imports for it (not by the version number, which a backport would make wrong):

==================  =========================================================  ================
feature             needs                                                      arrived in
==================  =========================================================  ================
commit_deadline     ``DeadlineAlert(name=...)``, ``airflow.sdk.definitions.``  Airflow 3.3
                    ``callback`` (``AsyncCallback``/``SyncCallback``),          (task-sdk 1.3)
                    ``airflow.sdk._shared.module_loading.accepts_context``
audit_approval      ``airflow.providers.standard.operators.hitl`` with         Airflow 3.1,
                    ``assigned_users`` and ``responded_by_user``                providers-standard
                                                                               1.8.0
asset_event_queries ``inlet_events[alias].after(...)/.limit(...)``             Airflow 3.2
                    (``InletEventsAccessor``)                                  (task-sdk 1.2)
asset_partitions    ``airflow.sdk.CronPartitionTimetable`` and partitioned     Airflow 3.2
                    asset events                                               (task-sdk 1.2)
==================  =========================================================  ================

A feature the user asked for by name (``commit_deadline=``, ``audit_approval=``) is refused when
the DAG is parsed (:func:`require`, :class:`FeatureUnavailable`: which feature, what it needs,
which Airflow this is). A feature walsink would only use when it is there (asset partitions,
reading an asset alias's events)
degrades to the behaviour without it, logging one line per process (:func:`available`). Nothing
here is imported when ``airflow_provider_walsink`` is imported, so an older Airflow never meets an
import error from the provider itself.
"""

from __future__ import annotations

import importlib
import inspect
import logging
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from importlib import metadata

log = logging.getLogger(__name__)

#: The oldest Airflow walsink supports (``setup.cfg`` says the same; ``tests/test_versions.py`` checks).
OLDEST_AIRFLOW = "3.1.1"


class FeatureUnavailable(ValueError):
    """A walsink feature the DAG asks for needs a newer Airflow (or provider) than the installed one."""


@dataclass(frozen=True)
class Feature:
    """A walsink feature that needs more than the oldest supported Airflow."""

    name: str
    #: What it needs, as a person would look it up ("Airflow 3.3 (task-sdk 1.3)").
    needs: str
    #: What walsink does without it (the degrade line, or the refusal's advice).
    without: str
    #: ``None`` when the installed Airflow has it, else why not (the failed probe).
    probe: Callable[[], str | None]


def _missing(module: str, *names: str) -> str | None:
    """``None`` if ``module`` imports and has ``names``, else what is missing."""
    try:
        mod = importlib.import_module(module)
    except ImportError as exc:  # also a module set to None in sys.modules
        return f"cannot import {module} ({exc})"
    absent = [n for n in names if not _has(mod, n)]
    return f"{module} has no {', '.join(absent)}" if absent else None


def _has(module: object, name: str) -> bool:
    try:  # airflow.sdk resolves its names lazily: a missing submodule raises ImportError here
        getattr(module, name)
    except (AttributeError, ImportError):
        return False
    return True


def _dist_version(dist: str) -> tuple[int, ...] | None:
    try:
        return tuple(int(p) for p in metadata.version(dist).split(".")[:3] if p.isdigit())
    except metadata.PackageNotFoundError:
        return None


def _commit_deadline() -> str | None:
    why = _missing("airflow.sdk.definitions.deadline", "DeadlineAlert", "DeadlineReference") or _missing(
        "airflow.sdk.definitions.callback", "AsyncCallback", "SyncCallback"
    )
    if why:
        return why
    from airflow.sdk.definitions.deadline import DeadlineAlert

    if "name" not in inspect.signature(DeadlineAlert.__init__).parameters:
        return "DeadlineAlert takes no name= (Airflow before 3.3)"
    return _missing("airflow.sdk._shared.module_loading", "accepts_context", "import_string")


def _audit_approval() -> str | None:
    why = _missing("airflow.providers.standard.operators.hitl", "HITLOperator")
    if why:
        return why
    version = _dist_version("apache-airflow-providers-standard")
    if version is not None and version < (1, 8, 0):
        return f"apache-airflow-providers-standard {'.'.join(map(str, version))} is older than 1.8.0"
    return None


def _asset_event_queries() -> str | None:
    return _missing("airflow.sdk.execution_time.context", "InletEventsAccessor")


def _asset_partitions() -> str | None:
    return _missing("airflow.sdk", "CronPartitionTimetable", "PartitionedAssetTimetable")


FEATURES: dict[str, Feature] = {
    f.name: f
    for f in (
        Feature(
            "commit_deadline",
            needs="Airflow 3.3 or later (task-sdk 1.3: DeadlineAlert with name=, deadline callbacks)",
            without="remove commit_deadline= (the walsink page still shows how long a checkpoint waits)",
            probe=_commit_deadline,
        ),
        Feature(
            "audit_approval",
            needs="Airflow 3.1 or later with apache-airflow-providers-standard 1.8.0 or later "
            "(human-in-the-loop operators)",
            without="remove audit_approval= (a REJECTED checkpoint then stays REJECTED, as without the "
            "step; `walsink abort` or the UI's Abort button aborts it)",
            probe=_audit_approval,
        ),
        Feature(
            "asset_event_queries",
            needs="Airflow 3.2 or later (task-sdk 1.2: inlet_events[alias].after()/.limit())",
            without="the commit task adds its asset event without first reading the alias's events: "
            "a new pipeline's first event is not held back for Airflow's first-event race, and a "
            "commit whose try was killed before it succeeded is not announced again",
            probe=_asset_event_queries,
        ),
        Feature(
            "asset_partitions",
            needs="Airflow 3.2 or later (asset partitions, task-sdk 1.2)",
            without="checkpoints are keyed by the data interval and asset events carry no partition key",
            probe=_asset_partitions,
        ),
    )
}


def airflow_version() -> str:
    """The installed Airflow's version, for messages ("unknown" if not installed as a distribution)."""
    for dist in ("apache-airflow-core", "apache-airflow"):
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
    return "unknown"


def missing(feature: str) -> str | None:
    """``None`` if this Airflow has ``feature``, else why not. Not cached: a probe is an import."""
    return FEATURES[feature].probe()


def require(feature: str, where: str) -> None:
    """Refuse a feature the DAG asked for that this Airflow lacks.

    Raises:
        FeatureUnavailable: naming ``where`` (e.g. ``walsink_pipeline('orders')``), the feature,
            what it needs, this Airflow's version, what failed and what to do instead.
    """
    why = missing(feature)
    if why is not None:
        f = FEATURES[feature]
        raise FeatureUnavailable(
            f"{where}: {feature} needs {f.needs}; this is Airflow {airflow_version()} ({why}). "
            f"Upgrade Airflow or {f.without}."
        )


def available(feature: str) -> bool:
    """Whether this Airflow has ``feature``; without it, log once per process what walsink does instead."""
    return _available(feature)


@cache
def _available(feature: str) -> bool:
    why = missing(feature)
    if why is not None:
        f = FEATURES[feature]
        log.warning(
            "walsink: %s off on Airflow %s (needs %s; %s): %s",
            feature,
            airflow_version(),
            f.needs,
            why,
            f.without,
        )
    return why is None
