"""walsink: exactly-once batch commit pipelines on Spark for Apache Airflow."""

from __future__ import annotations

__version__ = "0.1.0"


def get_provider_info() -> dict:
    from airflow_provider_walsink.get_provider_info import get_provider_info as _info

    return _info()
