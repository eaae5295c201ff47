"""``python -m airflow_provider_walsink.cli``: the ``walsink`` command."""

import sys

from airflow_provider_walsink.cli.commands import main

sys.exit(main())
