"""Per-DAG authorization for the commit-state views, delegated to Airflow's auth manager.

Airflow mounts plugin FastAPI apps without any authentication of its own, so
every route of :mod:`airflow_provider_walsink.ui.app` depends on
:data:`~airflow.api_fastapi.core_api.security.GetUserDep` (bearer token, or the
``_token`` cookie the Airflow UI sets at login and the browser sends to the
plugin's same-origin iframe) and on the checks below.

A pipeline belongs to the DAGs that write it: the DAG that registered it
(``walsink_pipeline.dag_id``) and every DAG that registered one of its
checkpoints. A user sees a pipeline only if the auth manager lets them read
*all* of those DAGs (a viewer of one writer must not see what another writer
published). A pipeline that no DAG writes (registered from a script or a
notebook) is shown to administrators only: it belongs to nobody else.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping

from airflow.api_fastapi.app import get_auth_manager
from airflow.api_fastapi.auth.managers.base_auth_manager import BaseAuthManager
from airflow.api_fastapi.auth.managers.models.base_user import BaseUser
from airflow.models.dag import DagModel
from fastapi import HTTPException, status

#: A team name no user belongs to: only an administrator may act on it (see :func:`is_admin`).
_PROBE_TEAM = "walsink-admin-probe-no-such-team"


def readable_dags(user: BaseUser, dag_ids: Iterable[str], *, method: str = "GET") -> set[str]:
    """The subset of ``dag_ids`` the user may read (``method="PUT"``: may edit).

    Batches by team, as Airflow's own ``get_authorized_dag_ids`` does, so one
    call covers every pipeline on a page instead of one check per row.
    """
    known = sorted({d for d in dag_ids if d})
    if not known:
        return set()
    auth_manager = get_auth_manager()
    teams = DagModel.get_dag_id_to_team_name_mapping(known)
    by_team: dict[str | None, set[str]] = defaultdict(set)
    for dag_id in known:
        by_team[teams.get(dag_id)].add(dag_id)
    allowed: set[str] = set()
    for team, ids in by_team.items():
        allowed |= auth_manager.filter_authorized_dag_ids(
            dag_ids=ids, user=user, method=method, team_name=team
        )
    return allowed


def is_admin(user: BaseUser) -> bool:
    """Whether the user administers this Airflow: full rights on every DAG, connection,
    variable, pool and the configuration, and, with an auth manager that knows teams,
    rights on a team they are not a member of.

    ``BaseAuthManager`` has no "is admin" question; this asks the ones an Op-like
    role does not pass together (Airflow's SimpleAuthManager grants the team check
    to its ADMIN role only).
    """
    am: BaseAuthManager = get_auth_manager()
    if not (
        am.is_authorized_dag(method="DELETE", user=user)
        and am.is_authorized_configuration(method="PUT", user=user)
        and am.is_authorized_connection(method="DELETE", user=user)
        and am.is_authorized_variable(method="DELETE", user=user)
        and am.is_authorized_pool(method="DELETE", user=user)
    ):
        return False
    try:
        from airflow.api_fastapi.auth.managers.models.resource_details import TeamDetails
    except ImportError:  # Airflow 3.1: no teams yet, so the checks above decide
        return True
    try:
        return am.is_authorized_team(method="GET", user=user, details=TeamDetails(name=_PROBE_TEAM))
    except NotImplementedError:  # an auth manager without teams: the checks above decide
        return True


def visible(user: BaseUser, writers: Mapping[str, set[str]]) -> set[str]:
    """The pipelines of ``writers`` (pipeline -> DAG ids that write it) the user may see."""
    allowed = readable_dags(user, {d for dags in writers.values() for d in dags})
    admin: bool | None = None
    out = set()
    for pipeline, dags in writers.items():
        if dags:
            if dags <= allowed:
                out.add(pipeline)
        else:
            if admin is None:
                admin = is_admin(user)
            if admin:
                out.add(pipeline)
    return out


def require_pipeline(user: BaseUser, pipeline: str, dag_ids: set[str]) -> None:
    """Raise 403 unless the user may see the pipeline written by ``dag_ids``."""
    if pipeline not in visible(user, {pipeline: dag_ids}):
        raise HTTPException(status.HTTP_403_FORBIDDEN, "Forbidden: no read access to this pipeline's DAGs")


def may_edit(user: BaseUser, dag_ids: set[str]) -> bool:
    """Whether the user may change a pipeline written by ``dag_ids`` (abort its checkpoints).

    Airflow's edit right (``PUT``) on *every* DAG that writes it, as
    ``requires_access_dag(method="PUT")`` grants it per DAG; a pipeline that
    no DAG writes belongs to administrators only.
    """
    if not dag_ids:
        return is_admin(user)
    return dag_ids <= readable_dags(user, dag_ids, method="PUT")


def require_edit(user: BaseUser, pipeline: str, dag_ids: set[str]) -> None:
    """Raise 403 unless the user may change the pipeline written by ``dag_ids``."""
    if not may_edit(user, dag_ids):
        raise HTTPException(
            status.HTTP_403_FORBIDDEN,
            f"Forbidden: aborting a checkpoint of {pipeline} needs the right to edit the DAGs that "
            f"write it ({', '.join(sorted(dag_ids)) or 'none: administrators only'})",
        )
