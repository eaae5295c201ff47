"""The maintenance task: garbage-collect staging and trim the committer table."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import timedelta
from typing import Any

from airflow.sdk import BaseOperator

from airflow_provider_walsink.core.commit.gc import collect_garbage
from airflow_provider_walsink.hooks.walsink import WalsinkHook


class WalGarbageCollectOperator(BaseOperator):
    """Remove orphaned staged attempts and old committer rows (see :mod:`airflow_provider_walsink.core.commit.gc`).

    Staging: attempts of COMMITTED and ABORTED checkpoints, superseded
    attempts of uncommitted ones (never their current or sealed attempt) and
    directories the committer table does not know, once older than
    ``retention``. Committer table (only if ``history_retention`` is set):
    COMMITTED rows and their history older than it, always keeping each
    pipeline's latest committed checkpoint and whatever an uncommitted
    checkpoint still needs; ABORTED rows older than it.

    Safe to run at any time, concurrently with writers and committers, and
    repeatedly. Returns the report (pushed to XCom).

    :param walsink_conn_id: connection to the committer database.
    :param staging_root: templated; defaults to the connection's ``staging_root``. The
        staging roots recorded on checkpoint rows are walked too (docs/protocol.md,
        "Staging root"); a recorded object-store root (``s3://``...) is opened with the
        credentials of the walsink connection's staging connection (``staging_conn_id``,
        else ``aws_default``, else the worker's default credential chain), as the write
        task staged it.
    :param retention: minimum age of staging garbage before it is removed.
    :param history_retention: minimum age of committed rows before they are
        trimmed; ``None`` keeps every row.
    :param pipelines: only these pipelines (default: all).
    :param dry_run: report what would be removed, remove nothing.
    """

    template_fields: Sequence[str] = ("staging_root", "pipelines")
    ui_color = "#e8e0c5"

    def __init__(
        self,
        *,
        walsink_conn_id: str = WalsinkHook.default_conn_name,
        staging_root: str | None = None,
        retention: timedelta = timedelta(days=1),
        history_retention: timedelta | None = timedelta(days=30),
        pipelines: list[str] | None = None,
        dry_run: bool = False,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        if retention < timedelta(0) or (history_retention is not None and history_retention < timedelta(0)):
            raise ValueError("retention periods must not be negative")
        self.walsink_conn_id = walsink_conn_id
        self.staging_root = staging_root
        self.retention = retention
        self.history_retention = history_retention
        self.pipelines = pipelines
        self.dry_run = dry_run

    def execute(self, context: Any) -> dict[str, Any]:
        hook = WalsinkHook(self.walsink_conn_id)
        report = collect_garbage(
            hook.get_store(),
            self.staging_root or hook.staging_root,  # a local path or an object-store URI
            retention=self.retention,
            history_retention=self.history_retention,
            pipelines=self.pipelines,
            dry_run=self.dry_run,
            stores=hook.get_staging_store,
        )
        self.log.info("walsink gc: %s", report.describe())
        return report.to_dict()
