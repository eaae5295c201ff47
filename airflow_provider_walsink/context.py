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
