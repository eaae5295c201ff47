"""The walsink Airflow plugin: the commit-state FastAPI app and its external views.

Registered through the provider's ``plugins`` key (``get_provider_info``), so
``airflow plugins`` lists it and the api-server mounts it wherever the
provider is installed. External views (Airflow 3) put the pages in the UI:
Browse → Commit state, a DAG tab and a DAG-run tab; the UI substitutes
``{DAG_ID}`` and ``{RUN_ID}`` in ``href`` and shows the page in a same-origin
iframe, so the browser's ``_token`` cookie authenticates it.
"""

from __future__ import annotations

from airflow.plugins_manager import AirflowPlugin

from airflow_provider_walsink.ui import URL_PREFIX
from airflow_provider_walsink.ui.app import app


class WalsinkPlugin(AirflowPlugin):
    name = "walsink"
    fastapi_apps = [{"app": app, "url_prefix": URL_PREFIX, "name": "walsink commit state"}]
    external_views = [
        {
            "name": "Commit state",
            "href": f"{URL_PREFIX}/",
            "destination": "nav",
            "category": "browse",
            "url_route": "walsink-commit-state",
        },
        {
            "name": "Commit state",
            "href": f"{URL_PREFIX}/dags/{{DAG_ID}}",
            "destination": "dag",
            "url_route": "walsink-dag-commit-state",
        },
        {
            "name": "Commit state",
            "href": f"{URL_PREFIX}/dags/{{DAG_ID}}/runs/{{RUN_ID}}",
            "destination": "dag_run",
            "url_route": "walsink-run-commit-state",
        },
    ]


def _entry_point_plugin() -> type[AirflowPlugin] | None:
    """The plugin for the ``airflow.plugins`` entry point, unless providers' plugins load anyway.

    Airflow loads a provider's ``plugins`` only with ``[core] lazy_discover_providers
    = False`` (default True), while ``airflow.plugins`` entry points always load. To
    be found either way without a "plugin already registered" import error, the
    entry point yields the plugin only when the provider route will not
    (``None`` is skipped silently by Airflow's loader).
    """
    from airflow import settings

    return WalsinkPlugin if settings.LAZY_LOAD_PROVIDERS else None


entry_point_plugin = _entry_point_plugin()
