"""The walsink connection form, declared once and free of Airflow imports.

Airflow 3 builds connection forms from provider info (``conn-fields``,
``ui-field-behaviour``) while it imports providers, so this module must not
import Airflow or the hook (a circular import): ``get_provider_info`` and
:class:`~airflow_provider_walsink.hooks.walsink.WalsinkHook` both read it.
"""

from __future__ import annotations

from typing import Any

CONN_TYPE = "walsink"
HOOK_NAME = "walsink committer database"

#: The connection form's own fields (stored in the connection's extra), declared once:
#: Airflow 3 reads forms from provider info, and ``get_provider_info`` copies these.
CONN_FIELDS: dict[str, dict[str, Any]] = {
    "backend": {
        "label": "Backend",
        "description": "sqlite (embedded default), postgresql or mysql (MySQL/MariaDB); "
        "ignored when a database URL is given",
        "schema": {
            "type": ["string", "null"],
            "enum": ["sqlite", "postgresql", "mysql", None],
            "default": "sqlite",
        },
    },
    "url": {
        "label": "Database URL",
        "description": "A full SQLAlchemy URL of the committer database; when set it wins over "
        "backend, host, port, login, password and database",
        # Sensitive: a URL may carry the password.
        "schema": {"type": ["string", "null"], "format": "password"},
    },
    "staging_root": {
        "label": "Staging root",
        "description": "Where write phases stage checkpoints: a directory every node sees, or "
        "s3://bucket/prefix, gs://bucket/prefix, abfss://container@account.dfs.core.windows.net/prefix "
        "(default $AIRFLOW_HOME/walsink/staging)",
        "schema": {"type": ["string", "null"]},
    },
    "staging_conn_id": {
        "label": "Staging connection",
        "description": "The connection whose credentials reach an object-store staging root: 'aws' for "
        "s3:// (default aws_default if it exists, else the default credential chain), "
        "'google_cloud_platform' for gs:// (default google_cloud_default), 'wasb' or 'adls' for abfss:// "
        "(default wasb_default)",
        "schema": {"type": ["string", "null"]},
    },
}

#: Labels and placeholders of the standard fields the hook reads, and of its own fields.
UI_FIELD_BEHAVIOUR: dict[str, Any] = {
    "hidden_fields": ["extra"],
    "relabeling": {"schema": "Database (file path for SQLite)"},
    "placeholders": {
        "host": "127.0.0.1 (leave empty for SQLite)",
        "port": "5432 (PostgreSQL) / 3306 (MySQL)",
        "login": "walsink",
        "password": "database password",
        "schema": "walsink, or /var/lib/airflow/walsink/committer.db for SQLite",
        "backend": "sqlite",
        "url": "postgresql+psycopg2://walsink:secret@db.example.com:5432/walsink",
        "staging_root": "/shared/walsink/staging or s3://bucket/walsink/staging",
        "staging_conn_id": "aws_default",
    },
}
