"""An abort's clean-up is fenced by the abort's own token (``core/commit/abort.py``, ``_AbortContext``).

The abort records ABORTED, then rolls back what the aborted attempt published and removes its
staging, each step preceded by ``fence()``. A new run of the checkpoint that reaches COMMITTING
meanwhile (it takes a lease: a new epoch) rolls the aborted attempt back itself; from then on the
abort's clean-up must change nothing. Planted as ``abort-cleanup-unfenced`` by the mutation check
(``python -m tests.model.mutations``), which the model checker does not reach (it never pauses an
abort's clean-up).
"""

from __future__ import annotations

import pytest

from airflow_provider_walsink.core.commit.abort import _AbortContext
from airflow_provider_walsink.core.protocol.errors import FencedError
from tests.test_store import TTL, A, to_durable


def test_an_abort_cleanup_stops_once_a_new_run_takes_the_checkpoint(sqlite_store):
    store = sqlite_store
    to_durable(store, "k")
    store.abort("p", "k", reason="bad data", actor=A)
    ctx = _AbortContext(store, store.require("p", "k"))
    ctx.fence()  # nothing moved yet: the clean-up goes on
    to_durable(store, "k")  # the checkpoint is run again
    ctx.fence()  # written and durable, not yet publishing: still the abort's to clean up
    store.acquire_lease("p", "k", owner="next-run", ttl=TTL, actor=A)
    with pytest.raises(FencedError, match="moved on"):
        ctx.fence()
