"""The ``walsink`` command: commit state, history, abort, GC and migrations from a shell."""

from airflow_provider_walsink.cli.commands import main

__all__ = ["main"]
