"""Fault-injection harness: real pipelines, SIGKILLed at every crash point, retried, checked.

Run on its own: ``python -m tests.harness --seed 7 --schedules 1000`` (from the
repository root). ``tests/test_faults.py`` runs a bounded version in CI.
"""

from .runner import HarnessResult, run_harness

__all__ = ["HarnessResult", "run_harness"]
