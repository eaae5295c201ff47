"""The write side of a checkpoint (Flink's ``CommittingSinkWriter``), without Spark.

A :class:`CheckpointWriter` starts a new attempt, gives the caller its
staging directory, collects committables and seals: writes the manifest
atomically and records its digest in the committer table. The Spark job API
(``airflow_provider_walsink.spark``) is a thin layer over it; tests and
non-Spark writers use it directly.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from airflow_provider_walsink.faults import crashpoint
from airflow_provider_walsink.protocol.checksum import file_checksum
from airflow_provider_walsink.protocol.manifest import (
    MANIFEST_NAME,
    Committable,
    Manifest,
    build_manifest,
    write_manifest,
)
from airflow_provider_walsink.protocol.staging import StagingLayout

from .store import Actor, CheckpointRecord, CommitterStore


class CheckpointWriter:
    """One write attempt of one checkpoint: ``begin`` → stage files → ``add`` → ``seal``."""

    def __init__(
        self,
        store: CommitterStore,
        layout: StagingLayout,
        pipeline: str,
        checkpoint_key: str,
        *,
        actor: Actor,
        partition_columns: tuple[str, ...] | list[str] = (),
    ) -> None:
        self.store, self.layout, self.actor = store, layout, actor
        self.partition_columns = tuple(partition_columns)
        self.pipeline, self.checkpoint_key = pipeline, checkpoint_key
        self.record: CheckpointRecord | None = None
        self.committables: list[Committable] = []
        self.partitions: list[str] = []

    def begin(self, *, start_offsets: Mapping[str, Any] | None = None) -> Path:
        """Start a new attempt (superseding any earlier one) and return its empty staging directory."""
        self.record = self.store.start_attempt(
            self.pipeline, self.checkpoint_key, actor=self.actor, start_offsets=start_offsets
        )
        crashpoint("write.before_staging")
        path = self.attempt_dir
        if path.exists():  # left by a crashed attempt with the same number: never reuse its files
            self.layout.remove_attempt(
                self.pipeline, self.checkpoint_key, self.record.attempt, self.record.attempt_id
            )
        path.mkdir(parents=True)
        return path

    @property
    def attempt(self) -> int:
        if self.record is None:
            raise RuntimeError("call begin() first")
        return self.record.attempt

    @property
    def attempt_dir(self) -> Path:
        assert self.record is not None
        return self.layout.attempt_dir(
            self.pipeline, self.checkpoint_key, self.attempt, self.record.attempt_id
        )

    def add(self, committables: Iterable[Committable]) -> None:
        self.committables.extend(committables)

    def add_files(
        self,
        relative_paths: Iterable[str],
        *,
        rows: Mapping[str, int] | None = None,
        checksum: str | None = "sha256",
        writer: str | None = None,
    ) -> None:
        """Describe staged files by ``stat`` (and a checksum, unless ``checksum=None``)."""
        for rel in relative_paths:
            path = self.layout.committable_path(self.attempt_dir, rel)
            self.committables.append(
                Committable(
                    path=rel,
                    size=os.stat(path).st_size,
                    rows=(rows or {}).get(rel),
                    checksum=file_checksum(path, checksum) if checksum else None,
                    writer=writer,
                )
            )

    def declare_partition(self, partition: str) -> None:
        """Name a partition this checkpoint replaces in overwrite mode even if it has no rows."""
        self.partitions.append(partition)

    def seal(
        self,
        *,
        file_format: str = "parquet",
        start_offsets: Mapping[str, Any] | None = None,
        end_offsets: Mapping[str, Any] | None = None,
        job: str | None = None,
    ) -> tuple[Manifest, str]:
        """Write the manifest atomically and record it; returns the manifest and its digest."""
        if self.record is None:
            raise RuntimeError("call begin() first")
        crashpoint("write.after_staging")
        if start_offsets is None:
            start_offsets = self.record.start_offsets
        manifest = build_manifest(
            pipeline=self.pipeline,
            checkpoint_key=self.checkpoint_key,
            sequence=self.record.sequence,
            attempt=self.attempt,
            attempt_id=self.record.attempt_id or "",
            partition_columns=self.partition_columns,
            file_format=file_format,
            committables=self.committables,
            partitions=self.partitions,
            start_offsets=start_offsets,
            end_offsets=end_offsets,
            job=job,
        )
        path = self.attempt_dir / MANIFEST_NAME
        digest = write_manifest(path, manifest)
        crashpoint("seal.after_manifest")
        self.record = self.store.seal_manifest(
            manifest, manifest_uri=path.as_uri(), manifest_digest=digest, actor=self.actor
        )
        crashpoint("seal.after")
        return manifest, digest
