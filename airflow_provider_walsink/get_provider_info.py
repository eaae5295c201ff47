"""Provider metadata read by Airflow through the ``apache_airflow_provider`` entry point."""

from __future__ import annotations

from airflow_provider_walsink import __version__

INTEGRATION = "walsink"


def get_provider_info() -> dict:
    return {
        "package-name": "airflow-provider-walsink",
        "name": "walsink",
        "description": "Exactly-once batch commit pipelines on Spark: a write phase stages a checkpoint, "
        "a durability gate verifies it, and a commit task publishes it once, recorded in a committer table.",
        "versions": [__version__],
        "integrations": [
            {
                "integration-name": INTEGRATION,
                "external-doc-url": "https://github.com/walsink/airflow-provider-walsink",
                "tags": ["software"],
            }
        ],
        "hooks": [
            {"integration-name": INTEGRATION, "python-modules": ["airflow_provider_walsink.hooks.walsink"]}
        ],
        "operators": [
            {
                "integration-name": INTEGRATION,
                "python-modules": [
                    "airflow_provider_walsink.operators.commit",
                    "airflow_provider_walsink.operators.write",
                    "airflow_provider_walsink.operators.gc",
                ],
            }
        ],
        "sensors": [
            {"integration-name": INTEGRATION, "python-modules": ["airflow_provider_walsink.sensors.durable"]}
        ],
        "triggers": [
            {"integration-name": INTEGRATION, "python-modules": ["airflow_provider_walsink.triggers.durable"]}
        ],
        "plugins": [{"name": "walsink", "plugin-class": "airflow_provider_walsink.ui.plugin.WalsinkPlugin"}],
        "extra-links": ["airflow_provider_walsink.links.WalsinkCheckpointLink"],
        "connection-types": [
            {
                "hook-class-name": "airflow_provider_walsink.hooks.walsink.WalsinkHook",
                "hook-name": "walsink committer database",
                "connection-type": "walsink",
                "ui-field-behaviour": {
                    "hidden-fields": ["extra"],
                    "relabeling": {"schema": "Database (file path for SQLite)"},
                    "placeholders": {
                        "host": "127.0.0.1 (leave empty for SQLite)",
                        "schema": "walsink or /var/lib/airflow/walsink.db",
                        "port": "5432 / 3306",
                    },
                },
                "conn-fields": {
                    "backend": {
                        "label": "Backend",
                        "description": "sqlite (embedded default), postgresql or mysql (MySQL/MariaDB)",
                        "schema": {
                            "type": ["string", "null"],
                            "enum": ["sqlite", "postgresql", "mysql", None],
                            "default": "sqlite",
                        },
                    },
                    "staging_root": {
                        "label": "Staging root",
                        "description": "Directory where write phases stage checkpoints "
                        "(default $AIRFLOW_HOME/walsink/staging)",
                        "schema": {"type": ["string", "null"]},
                    },
                },
            }
        ],
    }
