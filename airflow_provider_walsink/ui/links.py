"""Operator extra links: from a write, durability or commit task to its checkpoint's detail page."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any
from urllib.parse import quote, urlencode, urlsplit

from airflow.sdk import BaseOperatorLink

from airflow_provider_walsink.ui import URL_PREFIX

if TYPE_CHECKING:
    from airflow.models.taskinstancekey import TaskInstanceKey


def checkpoint_link(dag_id: str, run_id: str, pipeline: str | None = None, *, base_path: str = "") -> str:
    """The commit-state URL (a path, never a host) that resolves to the run's checkpoint of ``pipeline``.

    ``base_path`` is the path Airflow is served under (``/airflow`` for
    ``[api] base_url = https://host/airflow``), empty at the root.

    The run's checkpoint key is whatever the write phase registered (a templated
    key, the data interval, ...), so the link names the run and the pipeline and
    the plugin's ``/link`` route redirects to the one checkpoint it finds.
    """
    query = {"dag_id": dag_id, "run_id": run_id}
    if pipeline:
        query["pipeline"] = pipeline
    return f"{base_path.rstrip('/')}{URL_PREFIX}/link?{urlencode(query)}"


def task_log_link(
    dag_id: str, run_id: str, task_id: str, try_number: int | None = None, *, base_path: str = ""
) -> str:
    """The Airflow 3 UI page of one task instance try, which opens on its log (a path, never a host).

    The shape of Airflow's own ``TaskInstance.log_url``:
    ``/dags/<dag>/runs/<run>/tasks/<task>?try_number=<n>``, every segment quoted.
    """
    path = f"{_run_path(dag_id, run_id, base_path)}/tasks/{quote(task_id, safe='')}"
    return f"{path}?{urlencode({'try_number': try_number})}" if try_number else path


def _run_path(dag_id: str, run_id: str, base_path: str) -> str:
    """``<base>/dags/<dag>/runs/<run>``: the Airflow 3 UI page of a DAG run, each segment quoted."""
    return f"{base_path.rstrip('/')}/dags/{quote(dag_id, safe='')}/runs/{quote(run_id, safe='')}"


def required_actions_link(dag_id: str, run_id: str, *, base_path: str = "") -> str:
    """Airflow 3's *Required actions* of one DAG run (a path, never a host): the run's page with
    its human-in-the-loop questions open, where a person answers them.

    The route of Airflow's UI (``dags/:dagId/runs/:runId/required_actions``), every segment quoted.
    """
    return f"{_run_path(dag_id, run_id, base_path)}/required_actions"


class WalsinkCheckpointLink(BaseOperatorLink):
    """ "Commit state" button on walsink tasks, leading to the checkpoint's detail page.

    Airflow 3 computes the link when the task finishes and keeps it in XCom,
    so it is built from the task's rendered ``pipeline`` and its run. The link
    is relative (a path): a stored absolute URL would break when the api-server
    moves to another host or port.
    """

    name = "Commit state"

    def get_link(self, operator: Any, *, ti_key: TaskInstanceKey) -> str:
        from airflow.configuration import conf

        pipeline = getattr(operator, "pipeline", None)
        # Only the path of [api] base_url (Airflow behind a prefix); its host and port
        # are left to the browser, which resolves the link against wherever the UI is.
        base_path = urlsplit(conf.get("api", "base_url", fallback="") or "").path
        return checkpoint_link(
            ti_key.dag_id, ti_key.run_id, pipeline if isinstance(pipeline, str) else None, base_path=base_path
        )
