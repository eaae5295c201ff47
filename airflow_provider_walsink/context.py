"""Airflow context → protocol values: who is acting, and the run's default checkpoint key."""

from __future__ import annotations

import re
from datetime import UTC, datetime
from typing import Any

from airflow_provider_walsink.committer.store import Actor, new_instance_id

_UNSAFE = re.compile(r"[^A-Za-z0-9_.=+-]+")


def actor_from_context(context: Any, *, role: str = "task") -> Actor:
    ti = context["ti"]
    map_index = getattr(ti, "map_index", -1)
    name = f"{ti.dag_id}.{ti.task_id}" + (f"[{map_index}]" if map_index not in (None, -1) else "")
    try_number = getattr(ti, "try_number", None)
    return Actor(
        name=f"{name}@{ti.run_id}",
        dag_id=ti.dag_id,
        run_id=ti.run_id,
        task_id=ti.task_id,
        try_number=try_number,
        # The lease owner: unique per task try and process (the ti id and try number
        # name the try, host/pid/random part the process), so try 2 of a task never
        # adopts a lease try 1 still holds.
        instance=new_instance_id(getattr(ti, "id", None), try_number),
    )


def format_checkpoint_key(moment: datetime) -> str:
    """``20260101T000000Z``: sortable, and safe in paths, Hadoop URIs and SQL."""
    return moment.strftime("%Y%m%dT%H%M%SZ")


def checkpoint_key_from_context(context: Any) -> str:
    """The run's checkpoint key: its data interval start, else its logical date, else its run id."""
    for field in ("data_interval_start", "logical_date"):
        moment = context.get(field)
        if moment is not None:
            return format_checkpoint_key(moment.astimezone(_utc()))
    run_id = context["ti"].run_id
    return _UNSAFE.sub("-", run_id).strip("-.")[:128] or "run"


def _utc():

    return UTC


#: The pipeline policies for a re-run of a COMMITTED interval (docs/backfill.md).
REPROCESS_POLICIES = ("skip", "replace")
#: A run's conf key that asks for one policy for this run (``--run-conf`` of a backfill).
REPROCESS_CONF_KEY = "walsink_reprocess"


def reprocess_decision(context: Any, policy: str) -> tuple[str, str]:
    """What a re-run of a COMMITTED checkpoint does in this run: ``("skip" | "replace", why)``.

    * the run's conf ``{"walsink_reprocess": "replace" | "skip"}`` decides if set
      (``airflow backfill create --reprocess-behavior completed --run-conf ...``
      puts it on every reprocessed run);
    * else the pipeline's ``policy``: ``skip``, or ``replace``, which rewrites
      only in a **backfill** run (``run_type == "backfill"``: Airflow's own
      reprocess of a completed run). A retry, or a clear of a scheduled or
      manual run, never rewrites.

    Airflow shows a task ``run_type``, ``clear_number`` and ``conf``, not the
    backfill: a user clearing a run that a backfill created looks like the
    backfill's reprocess (docs/backfill.md says so).
    """
    if policy not in REPROCESS_POLICIES:
        raise ValueError(f"reprocess must be one of {REPROCESS_POLICIES}, got {policy!r}")
    dag_run = context.get("dag_run")
    conf = getattr(dag_run, "conf", None) or {}
    asked = conf.get(REPROCESS_CONF_KEY) if isinstance(conf, dict) else None
    if asked is not None:
        if asked not in REPROCESS_POLICIES:
            raise ValueError(
                f"the run's conf sets {REPROCESS_CONF_KEY}={asked!r}; it must be one of {REPROCESS_POLICIES}"
            )
        return asked, f"the run's conf sets {REPROCESS_CONF_KEY}={asked!r}"
    if policy == "skip":
        return "skip", "the pipeline's reprocess policy is 'skip'"
    run_type = str(getattr(getattr(dag_run, "run_type", None), "value", getattr(dag_run, "run_type", "")))
    if run_type == "backfill":
        return "replace", "reprocess policy 'replace' and this is a backfill run"
    return (
        "skip",
        f"reprocess policy 'replace' rewrites only in backfill runs; this run is {run_type or 'unknown'}",
    )


def version_token(context: Any) -> str:
    """Which run (and which clear of it) a new checkpoint version belongs to: ``dag/run#clear``.

    A retry of a reprocessing task has the same token, so it continues that
    version instead of starting another.
    """
    ti = context["ti"]
    dag_run = context.get("dag_run")
    clear = getattr(dag_run, "clear_number", None) or 0
    return f"{ti.dag_id}/{ti.run_id}#{clear}"
