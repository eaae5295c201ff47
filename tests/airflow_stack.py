"""Re-export: the Airflow stack runner lives in ``airflow_provider_walsink.testing.stack``
(the demo imports it from there); ``from airflow_stack import AirflowStack`` keeps working."""

from airflow_provider_walsink.testing.stack import *  # noqa: F403
from airflow_provider_walsink.testing.stack import (  # noqa: F401 - explicit for readers and linters
    DEFAULT_COMPONENTS,
    DEFAULT_USERS,
    TERMINAL_RUN_STATES,
    AirflowStack,
    StackError,
    StackUser,
    create_postgres_database,
    free_port,
)
