"""The first-event claim (``core/store/first_event.py``) on each backend: one commit task at a
time may add a pipeline's first asset event; its retries claim again, a stale claim is taken
over, and of many claimants at once exactly one wins."""

from __future__ import annotations

import threading
from datetime import timedelta

from airflow_provider_walsink.core.store import CommitterStore
from airflow_provider_walsink.core.store.records import utcnow
from tests.helpers import ACTOR

STALE = timedelta(minutes=2)


def test_one_holder_at_a_time_its_retry_claims_again_and_a_stale_claim_is_taken_over(store: CommitterStore):
    assert not store.claim_first_event("p", "dag/run/commit_0/-1", stale_after=STALE)  # no pipeline yet
    store.register("p", "k1", mode="overwrite", actor=ACTOR)

    assert store.claim_first_event("p", "dag/run/commit_0/-1", stale_after=STALE)
    assert not store.claim_first_event("p", "dag/run/commit_1/-1", stale_after=STALE)
    assert store.claim_first_event("p", "dag/run/commit_0/-1", stale_after=STALE)  # a retry of the holder
    assert not store.claim_first_event("p", "dag/run/commit_1/-1", stale_after=STALE)

    # Past stale_after on the database's clock (here a test clock), the claim is taken over.
    later = CommitterStore(store.engine, clock=lambda: utcnow() + STALE + timedelta(seconds=5))
    assert later.claim_first_event("p", "dag/run/commit_1/-1", stale_after=STALE)
    assert not store.claim_first_event("p", "dag/run/commit_0/-1", stale_after=STALE)


def test_of_many_claimants_at_once_exactly_one_wins(store: CommitterStore):
    store.register("p", "k1", mode="overwrite", actor=ACTOR)
    start = threading.Barrier(8)
    won: list[str] = []

    def claim(i: int) -> None:
        start.wait()
        if store.claim_first_event("p", f"dag/run/commit_{i}/-1", stale_after=STALE):
            won.append(f"commit_{i}")

    threads = [threading.Thread(target=claim, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(won) == 1, won
