"""A notifier for ``tests/test_e2e_commit_deadline.py``: an Airflow ``BaseNotifier`` whose
``message`` is a template over the context walsink's commit-deadline callback hands it; each call
appends one JSON line (the rendered message and the ``walsink`` report) to ``path``, then, with
``hold_until``, waits until that file exists (a notification still being sent when the test
restarts the triggerer).

It lives here, not in the DAG file: Airflow's triggerer imports an ``AsyncCallback``'s notifier by
its module path, which a DAG file's module (parsed under a generated name) does not have.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

from airflow.sdk import BaseNotifier


class RecordingNotifier(BaseNotifier):
    """Append ``{"message", "walsink", "run_id"}`` to ``path`` (one line per notification)."""

    template_fields = ("message",)

    def __init__(self, *, path: str, message: str, hold_until: str | None = None) -> None:
        super().__init__()
        self.path = path
        self.message = message
        self.hold_until = hold_until

    async def async_notify(self, context: Any) -> None:
        line = {
            "message": self.message,
            "walsink": context.get("walsink"),
            "run_id": (context.get("dag_run") or {}).get("dag_run_id"),
        }
        with Path(self.path).open("a", encoding="utf-8") as out:
            out.write(json.dumps(line) + "\n")
        while self.hold_until and not Path(self.hold_until).exists():
            await asyncio.sleep(0.5)
