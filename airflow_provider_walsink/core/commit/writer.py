"""The write side of a checkpoint (Flink's ``CommittingSinkWriter``), without Spark.

A :class:`CheckpointWriter` starts a new attempt, gives the caller its
staging directory, collects committables and seals: writes the manifest
atomically and records its digest in the committer table. The Spark job API
(``airflow_provider_walsink.core.spark``) is a thin layer over it; tests and
non-Spark writers use it directly.

On an object store (a :class:`StagingStore` that is not local) the same steps
go through the store: ``begin`` records the store's root on the checkpoint and
returns the attempt's :class:`AttemptLocation` (the caller writes each file to
``store.committable(location, relative)`` through ``store.filesystem``),
``add_files`` takes sizes from the store's metadata, and ``seal`` is the
store's conditional put.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from airflow_provider_walsink.core.faults import crashpoint
from airflow_provider_walsink.core.protocol.checksum import file_checksum
from airflow_provider_walsink.core.protocol.manifest import (
    Committable,
    Manifest,
    build_manifest,
)
from airflow_provider_walsink.core.staging.layout import StagingLayout
from airflow_provider_walsink.core.staging.object_store import (
    AttemptLocation,
    StagingStore,
    StagingStoreError,
)
from airflow_provider_walsink.core.staging.resolve import as_store, local_layout, object_store_of
from airflow_provider_walsink.core.store.store import Actor, CheckpointRecord, CommitterStore


class CheckpointWriter:
    """One write attempt of one checkpoint: ``begin`` → stage files → ``add`` → ``seal``.

    ``layout``: a local :class:`StagingLayout`, or a :class:`StagingStore` (a local
    store is its layout; an object store is written through, see the module docstring).
    """

    def __init__(
        self,
        store: CommitterStore,
        layout: StagingLayout | StagingStore,
        pipeline: str,
        checkpoint_key: str,
        *,
        actor: Actor,
        partition_columns: tuple[str, ...] | list[str] = (),
    ) -> None:
        #: The object store staged on; None for a local root.
        self.objects = object_store_of(layout)
        self.store, self.layout, self.actor = store, local_layout(layout) or layout, actor
        self.partition_columns = tuple(partition_columns)
        self.pipeline, self.checkpoint_key = pipeline, checkpoint_key
        self.record: CheckpointRecord | None = None
        self.committables: list[Committable] = []
        self.partitions: list[str] = []

    def begin(self, *, start_offsets: Mapping[str, Any] | None = None) -> Path | AttemptLocation:
        """Start a new attempt (superseding any earlier one) and return where to stage it: its
        empty directory on a local root, its :class:`AttemptLocation` on an object store."""
        objects = self.objects
        self.record = self.store.start_attempt(
            self.pipeline,
            self.checkpoint_key,
            actor=self.actor,
            start_offsets=start_offsets,
            **({"staging_root": objects.root_uri} if objects is not None else {}),
        )
        if objects is not None:
            recorded = (self.record.staging_root or "").rstrip("/")
            if recorded != objects.root_uri.rstrip("/"):
                # The recorded root wins (attempts never split across roots): staging here would
                # leave this attempt where no durability check or commit looks for it.
                raise StagingStoreError(
                    f"checkpoint {self.pipeline}/{self.checkpoint_key} is staged under {recorded or 'no root'}, "
                    f"not {objects.root_uri}; stage every attempt of a checkpoint under its recorded root"
                )
        crashpoint("write.before_staging")
        if objects is not None:
            location = self.location
            if objects.list_attempt(location):  # left by a crashed attempt with the same name
                objects.remove_attempt(location)
            return location
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
        if self.objects is not None:
            raise RuntimeError(f"{self.objects!r} is an object store: use location, not attempt_dir")
        return self.layout.attempt_dir(
            self.pipeline, self.checkpoint_key, self.attempt, self.record.attempt_id
        )

    @property
    def location(self) -> AttemptLocation:
        """The attempt's place in the object store (object stores only; see :attr:`attempt_dir`)."""
        if self.objects is None:
            raise RuntimeError("a local staging root: use attempt_dir, not location")
        return self.objects.attempt(self.pipeline, self.checkpoint_key, self.attempt, self.record.attempt_id)

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
        """Describe staged files by ``stat`` (an object store: its metadata) and a checksum, unless
        ``checksum=None``."""
        objects = self.objects
        # An object store: every size from one listing of the attempt, not a HEAD per file.
        sizes = objects.list_attempt(self.location) if objects is not None else {}
        for rel in relative_paths:
            if objects is not None:
                location = self.location
                objects.committable(location, rel)  # confined (lexically) before it is named
                size = sizes.get(rel)
                if size is None:
                    raise FileNotFoundError(f"{location.uri}/{rel}: not staged")
                digest = objects.checksum(location, rel, checksum) if checksum else None
            else:
                path = self.layout.committable_path(self.attempt_dir, rel)
                size = os.stat(path).st_size
                digest = file_checksum(path, checksum) if checksum else None
            self.committables.append(
                Committable(path=rel, size=size, rows=(rows or {}).get(rel), checksum=digest, writer=writer)
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
        """Write the manifest atomically (an object store: once, by a conditional put) and record it;
        returns the manifest and its digest."""
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
        # Through the staging store on every root: sealed once (a second seal of other bytes, by a
        # zombie or speculative driver, is refused and leaves the sealed manifest as it was).
        staging = as_store(self.objects or self.layout)
        location = staging.attempt(self.pipeline, self.checkpoint_key, self.attempt, self.record.attempt_id)
        digest = staging.seal(location, manifest)
        manifest_uri = staging.manifest_uri(location)
        crashpoint("seal.after_manifest")
        self.record = self.store.seal_manifest(
            manifest, manifest_uri=manifest_uri, manifest_digest=digest, actor=self.actor
        )
        crashpoint("seal.after")
        return manifest, digest
