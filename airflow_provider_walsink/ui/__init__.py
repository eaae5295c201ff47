"""The commit-state UI: an Airflow 3 plugin with a FastAPI app, pages and external views."""
