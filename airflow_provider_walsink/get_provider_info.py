"""Provider metadata read by Airflow through the ``apache_airflow_provider`` entry point."""

from __future__ import annotations

import copy

from airflow_provider_walsink import __version__

INTEGRATION = "walsink"


def get_provider_info() -> dict:
    from airflow_provider_walsink.hooks.form import CONN_FIELDS, CONN_TYPE, HOOK_NAME, UI_FIELD_BEHAVIOUR

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
                    "airflow_provider_walsink.operators.audit",
                    "airflow_provider_walsink.operators.approval",
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
        "extra-links": ["airflow_provider_walsink.ui.links.WalsinkCheckpointLink"],
        "connection-types": [
            {
                "hook-class-name": "airflow_provider_walsink.hooks.walsink.WalsinkHook",
                "hook-name": HOOK_NAME,
                "connection-type": CONN_TYPE,
                # The hook's form, declared once in hooks/form.py (kebab-case keys here).
                "ui-field-behaviour": {
                    key.replace("_", "-"): copy.deepcopy(value) for key, value in UI_FIELD_BEHAVIOUR.items()
                },
                "conn-fields": copy.deepcopy(CONN_FIELDS),
            }
        ],
    }
