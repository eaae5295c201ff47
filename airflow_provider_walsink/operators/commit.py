"""The commit task: publish a durable checkpoint exactly once."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import timedelta
from typing import Any

from airflow_provider_walsink.committer.commit import CheckpointCommitter
from airflow_provider_walsink.context import actor_from_context, checkpoint_key_from_context
from airflow_provider_walsink.hooks.walsink import WalsinkHook
from airflow_provider_walsink.links import WalsinkCheckpointLink
from airflow_provider_walsink.publishers.files import FilePublisher

try:
    from airflow.sdk import BaseOperator
except ImportError:  # pragma: no cover
    from airflow.models import BaseOperator  # type: ignore[no-redef]


class WalCommitOperator(BaseOperator):
    """Publish a checkpoint's sealed manifest into the target, idempotently.

    Reads the checkpoint's sealed manifest, takes the checkpoint's lease in
    the committer table, publishes every committable (skipping what is
    already in place), records COMMITTED with the end offsets, deletes the
    staged attempts and returns a summary (pushed to XCom).

    * Already COMMITTED: logs it and succeeds without touching anything, so a
      retry, a cleared task or a backfill re-run is safe.
    * Not durable yet: fails with a message that says what is missing.
    * Bad manifest or staged data: fails naming the problem; the checkpoint
      stays uncommitted with the error recorded and the target unchanged.

    :param pipeline: pipeline id (templated).
    :param target: root directory of the target table (templated).
    :param mode: ``overwrite`` (each checkpoint replaces its partitions) or
        ``append`` (files are added, in checkpoint order).
    :param checkpoint_key: templated; defaults to the run's data interval start
        (``20260101T000000Z``).
    :param walsink_conn_id: connection to the committer database.
    :param staging_root: templated; defaults to the connection's ``staging_root``.
    :param lease_ttl: how long the lease lasts without renewal; a crashed
        committer's checkpoint can be taken over after it.
    :param verify_checksums: re-check each committable's checksum while publishing.
    """

    operator_extra_links = (WalsinkCheckpointLink(),)
    template_fields: Sequence[str] = ("pipeline", "checkpoint_key", "target", "staging_root")
    ui_color = "#c5e8c5"

    def __init__(
        self,
        *,
        pipeline: str,
        target: str,
        mode: str = "overwrite",
        checkpoint_key: str | None = None,
        walsink_conn_id: str = WalsinkHook.default_conn_name,
        staging_root: str | None = None,
        lease_ttl: timedelta = timedelta(minutes=10),
        verify_checksums: bool = False,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        if mode not in ("append", "overwrite"):
            raise ValueError(f"mode must be 'append' or 'overwrite', got {mode!r}")
        self.pipeline = pipeline
        self.target = target
        self.mode = mode
        self.checkpoint_key = checkpoint_key
        self.walsink_conn_id = walsink_conn_id
        self.staging_root = staging_root
        self.lease_ttl = lease_ttl
        self.verify_checksums = verify_checksums

    def execute(self, context: Any) -> dict[str, Any]:
        key = self.checkpoint_key or checkpoint_key_from_context(context)
        hook = WalsinkHook(self.walsink_conn_id)
        layout = hook.get_layout(self.staging_root)
        publisher = FilePublisher(
            self.target, self.mode, layout=layout, verify_checksums=self.verify_checksums
        )
        actor = actor_from_context(context)
        committer = CheckpointCommitter(
            hook.get_store(), layout, publisher, mode=self.mode, owner=actor.name, lease_ttl=self.lease_ttl
        )
        summary = committer.commit(self.pipeline, key, actor=actor)
        if summary.already_committed:
            self.log.info("Checkpoint %s/%s was already committed; nothing changed", self.pipeline, key)
        return summary.to_dict()
