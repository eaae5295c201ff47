"""Operator extra links: from a write, durability or commit task to its checkpoint's detail page."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any
from urllib.parse import urlencode

from airflow_provider_walsink.ui import URL_PREFIX

try:
    from airflow.sdk import BaseOperatorLink
except ImportError:  # pragma: no cover - Airflow < 3
    from airflow.models.baseoperatorlink import BaseOperatorLink  # type: ignore[no-redef]

if TYPE_CHECKING:
    from airflow.models.taskinstancekey import TaskInstanceKey


def checkpoint_link(dag_id: str, run_id: str, pipeline: str | None = None, *, base_url: str = "") -> str:
    """The commit-state URL that resolves to the run's checkpoint of ``pipeline``.

    The run's checkpoint key is whatever the write phase registered (a templated
    key, the data interval, ...), so the link names the run and the pipeline and
    the plugin's ``/link`` route redirects to the one checkpoint it finds.
    """
    query = {"dag_id": dag_id, "run_id": run_id}
    if pipeline:
        query["pipeline"] = pipeline
    return f"{base_url.rstrip('/')}{URL_PREFIX}/link?{urlencode(query)}"


class WalsinkCheckpointLink(BaseOperatorLink):
    """ "Commit state" button on walsink tasks, leading to the checkpoint's detail page.

    Airflow 3 computes the link when the task finishes and keeps it in XCom,
    so it is built from the task's rendered ``pipeline`` and its run.
    """

    name = "Commit state"

    def get_link(self, operator: Any, *, ti_key: TaskInstanceKey) -> str:
        from airflow.configuration import conf

        pipeline = getattr(operator, "pipeline", None)
        # An absolute link when the deployment says where the api-server lives, else
        # a path on the same host (the UI opens it next to itself).
        base_url = conf.get("api", "base_url", fallback="") or ""
        return checkpoint_link(
            ti_key.dag_id, ti_key.run_id, pipeline if isinstance(pipeline, str) else None, base_url=base_url
        )
