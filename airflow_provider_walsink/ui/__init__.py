"""The commit-state UI: an Airflow 3 plugin with a FastAPI app, pages and external views.

Kept import-light: task processes import :data:`URL_PREFIX` (for extra links)
without loading the FastAPI app or Airflow's api-server modules.
"""

#: Where the plugin's FastAPI app is mounted in the api-server.
URL_PREFIX = "/walsink"
