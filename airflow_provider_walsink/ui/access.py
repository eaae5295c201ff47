"""Per-DAG authorization for the commit-state views, delegated to Airflow's auth manager.

Airflow mounts plugin FastAPI apps without any authentication of its own, so
every route of :mod:`airflow_provider_walsink.ui.app` depends on
:data:`~airflow.api_fastapi.core_api.security.GetUserDep` (bearer token, or the
``_token`` cookie the Airflow UI sets at login and the browser sends to the
plugin's same-origin iframe) and on the checks below.

A pipeline belongs to the DAG that registered it (``walsink_pipeline.dag_id``);
a user sees a pipeline only if the auth manager lets them read that DAG. A
pipeline registered outside Airflow (no DAG) needs read access to all DAGs.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable

from airflow.api_fastapi.app import get_auth_manager
from airflow.api_fastapi.auth.managers.models.base_user import BaseUser
from airflow.models.dag import DagModel
from fastapi import HTTPException, status


def readable_dags(user: BaseUser, dag_ids: Iterable[str | None]) -> set[str | None]:
    """The subset of ``dag_ids`` the user may read (``None`` stands for "no DAG").

    Batches by team, as Airflow's own ``get_authorized_dag_ids`` does, so one
    call covers every pipeline on a page instead of one check per row.
    """
    wanted = set(dag_ids)
    auth_manager = get_auth_manager()
    known = sorted(d for d in wanted if d)
    allowed: set[str | None] = set()
    if known:
        teams = DagModel.get_dag_id_to_team_name_mapping(known)
        by_team: dict[str | None, set[str]] = defaultdict(set)
        for dag_id in known:
            by_team[teams.get(dag_id)].add(dag_id)
        for team, ids in by_team.items():
            allowed |= auth_manager.filter_authorized_dag_ids(
                dag_ids=ids, user=user, method="GET", team_name=team
            )
    # details=None asks "may this user read DAGs in general" (all-DAG access).
    if None in wanted and auth_manager.is_authorized_dag(method="GET", user=user):
        allowed.add(None)
    return allowed


def require_dag(user: BaseUser, dag_id: str | None) -> None:
    """Raise 403 unless the user may read ``dag_id``."""
    if dag_id not in readable_dags(user, [dag_id]):
        raise HTTPException(status.HTTP_403_FORBIDDEN, "Forbidden: no read access to this pipeline's DAG")
