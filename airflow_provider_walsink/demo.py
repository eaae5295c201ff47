"""Commit-only demo on the embedded defaults (until the Spark example pipeline lands):
stages three daily checkpoints as CSV files, commits them, commits them again
(a no-op), and prints the commit state.
"""

from __future__ import annotations

import os
from pathlib import Path

from airflow_provider_walsink.cli import main as cli_main
from airflow_provider_walsink.committer import Actor, CheckpointCommitter, CheckpointWriter, CommitterStore
from airflow_provider_walsink.protocol.staging import StagingLayout
from airflow_provider_walsink.publishers import FilePublisher


def run() -> int:
    home = Path(os.environ.get("WALSINK_DEMO_HOME", "var/demo")).resolve()
    url = f"sqlite:///{home}/committer.db"
    store = CommitterStore.from_url(url)
    layout = StagingLayout(home / "staging")
    target = home / "target" / "daily_events"
    actor = Actor.local("demo")
    committer = CheckpointCommitter(
        store, layout, FilePublisher(target, "overwrite", layout=layout), mode="overwrite"
    )
    for day in ("2026-01-01", "2026-01-02", "2026-01-03"):
        key = day.replace("-", "") + "T000000Z"
        store.register("demo_daily", key, mode="overwrite", actor=actor, target=str(target))
        if not store.is_committed("demo_daily", key):
            writer = CheckpointWriter(store, layout, "demo_daily", key, actor=actor)
            attempt_dir = writer.begin()
            rel = f"dt={day}/part-00000.csv"
            (attempt_dir / f"dt={day}").mkdir()
            (attempt_dir / rel).write_text("".join(f"{day},event-{i}\n" for i in range(100)))
            writer.add_files([rel], rows={rel: 100})
            writer.seal(file_format="csv")
            store.mark_durable("demo_daily", key, attempt=writer.attempt, actor=actor)
        first = committer.commit("demo_daily", key, actor=actor)
        again = committer.commit("demo_daily", key, actor=actor)
        print(
            f"{key}: published {first.published} file(s); second commit already_committed={again.already_committed}"
        )
    return cli_main(["--url", url, "status"])


if __name__ == "__main__":
    raise SystemExit(run())
