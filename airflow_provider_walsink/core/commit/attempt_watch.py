"""Stop a write job whose attempt can no longer count (Airflow-free).

A write attempt stops counting when the checkpoint is aborted (``walsink abort``, the UI) or
a newer attempt of it starts (a cleared task, a zombie's retry): the seal of the old attempt
is then refused by the committer table, so nothing it stages is ever published. Its Spark
job would still run to the end, holding the cluster and writing into a place the abort or the
new attempt's clean-up removes. :class:`AttemptWatch` reads the checkpoint's row while the job
runs and cancels the job through its runner as soon as that happens, so an abort from any
machine (the UI, the CLI) stops a job running on another.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

from airflow_provider_walsink.core.protocol.states import CheckpointState as S

#: Seconds between two reads of the checkpoint's row while its job runs.
WATCH_INTERVAL_S = 5.0


def why_stale(record: Any, attempt: int) -> str | None:
    """Why ``attempt`` of ``record`` (the checkpoint's row now) can no longer count; ``None``: it can."""
    if record is None:
        return "the checkpoint is no longer in the committer table"
    if record.attempt > attempt:
        return f"attempt {record.attempt} of the checkpoint started since (this attempt is fenced)"
    if record.state is S.ABORTED:
        detail = f": {record.error}" if record.error else ""
        return f"the checkpoint was aborted{detail}"
    return None


class AttemptWatch:
    """While entered, reads the checkpoint's row every ``interval`` seconds in a daemon thread
    and calls ``cancel`` once (with the reason, also kept in :attr:`reason`) when attempt
    ``attempt`` can no longer count (:func:`why_stale`). A failed read is logged and retried:
    the watch only ever stops a job, so it never fails one."""

    def __init__(
        self,
        store: Any,
        pipeline: str,
        checkpoint_key: str,
        attempt: int,
        cancel: Callable[[], None],
        *,
        interval: float = WATCH_INTERVAL_S,
        log: logging.Logger | logging.LoggerAdapter[Any] | None = None,
    ) -> None:
        self.store, self.pipeline, self.checkpoint_key, self.attempt = (
            store,
            pipeline,
            checkpoint_key,
            attempt,
        )
        self._cancel, self.interval = cancel, interval
        self.log = log or logging.getLogger(__name__)
        #: Why the job was cancelled (``None``: it was not).
        self.reason: str | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def __enter__(self) -> AttemptWatch:
        self._thread = threading.Thread(target=self._run, name="walsink-attempt-watch", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(self.interval + 5)

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                reason = why_stale(self.store.get(self.pipeline, self.checkpoint_key), self.attempt)
            except Exception as exc:  # noqa: BLE001 - a database hiccup must not fail the job
                self.log.warning(
                    "could not read checkpoint %s/%s: %s", self.pipeline, self.checkpoint_key, exc
                )
                continue
            if reason is None:
                continue
            self.reason = reason
            self.log.warning(
                "Cancelling the write job of %s/%s attempt %d: %s",
                self.pipeline,
                self.checkpoint_key,
                self.attempt,
                reason,
            )
            try:
                self._cancel()
            except Exception as exc:  # noqa: BLE001
                self.log.warning("could not cancel the write job: %s", exc)
            return
