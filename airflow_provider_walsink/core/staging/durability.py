"""The durability check: is a sealed attempt complete and intact on disk?

Flink calls a checkpoint complete when every subtask has acknowledged it;
walsink calls a staged attempt *durable* when its manifest is sealed and every
committable it lists is present with its recorded size (and, when asked, its
checksum). The poke sensor, the deferrable trigger and the commit task all use
this one function.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from airflow_provider_walsink.core.faults import crashpoint
from airflow_provider_walsink.core.protocol.checksum import algorithm_of, file_checksum
from airflow_provider_walsink.core.protocol.errors import PathEscapeError
from airflow_provider_walsink.core.protocol.manifest import Manifest
from airflow_provider_walsink.core.staging.layout import StagingLayout

if TYPE_CHECKING:
    from airflow_provider_walsink.core.staging.object_store import AttemptLocation, StagingStore


@dataclass
class DurabilityReport:
    """What a durability check found; ``durable`` only when every list is empty."""

    checked: int = 0
    missing: list[str] = field(default_factory=list)
    wrong_size: list[str] = field(default_factory=list)
    wrong_checksum: list[str] = field(default_factory=list)
    escaping: list[str] = field(default_factory=list)

    @property
    def durable(self) -> bool:
        return not (self.missing or self.wrong_size or self.wrong_checksum or self.escaping)

    def describe(self, limit: int = 5) -> str:
        """One line naming what is wrong, e.g. for a sensor timeout or a task error."""
        if self.durable:
            return f"all {self.checked} committables present and verified"
        parts = []
        for label, items in (
            ("outside the staging root", self.escaping),
            ("missing", self.missing),
            ("size mismatch", self.wrong_size),
            ("checksum mismatch", self.wrong_checksum),
        ):
            if items:
                shown = ", ".join(items[:limit]) + (
                    f" (+{len(items) - limit} more)" if len(items) > limit else ""
                )
                parts.append(f"{len(items)} {label}: {shown}")
        return "; ".join(parts)


def check_attempt(
    layout: StagingLayout,
    manifest: Manifest,
    attempt_dir: Path,
    *,
    verify_checksums: bool = False,
) -> DurabilityReport:
    """Check every committable of ``manifest`` under ``attempt_dir`` (one ``stat`` each)."""
    report = DurabilityReport()
    committable_path = layout.committable_resolver(attempt_dir)  # resolves each directory once
    for c in manifest.committables:
        crashpoint("durable.verifying")
        report.checked += 1
        try:
            path, st = committable_path(c.path)
        except PathEscapeError as e:
            report.escaping.append(f"{c.path} ({e})")
            continue
        if st is None:  # the resolver's lstat of the resolved path (a symlink there was followed)
            report.missing.append(c.path)
            continue
        if st.st_size != c.size:
            report.wrong_size.append(f"{c.path} ({st.st_size} bytes, manifest says {c.size})")
            continue
        if verify_checksums and c.checksum is not None:
            actual = file_checksum(path, algorithm_of(c.checksum))
            if actual != c.checksum:
                report.wrong_checksum.append(f"{c.path} ({actual}, manifest says {c.checksum})")
    return report


def check_stored_attempt(
    store: StagingStore,
    manifest: Manifest,
    location: AttemptLocation,
    *,
    verify_checksums: bool = False,
) -> DurabilityReport:
    """:func:`check_attempt` on any staging store: one listing of the attempt, no data read.

    A local root is checked by :func:`check_attempt` itself (one ``lstat`` per
    file, symlinks refused). On an object store, one LIST of the attempt's
    prefix gives every size; each committable's path is confined lexically
    first. ``verify_checksums`` streams each file (the only case that reads data).
    """
    if store.layout is not None:
        return check_attempt(store.layout, manifest, Path(location.path), verify_checksums=verify_checksums)
    report = DurabilityReport()
    listed = store.list_attempt(location)
    confined = store.resolver(location)
    for c in manifest.committables:
        crashpoint("durable.verifying")
        report.checked += 1
        try:
            confined(c.path)
        except PathEscapeError as e:
            report.escaping.append(f"{c.path} ({e})")
            continue
        size = listed.get(c.path)
        if size is None:
            report.missing.append(c.path)
            continue
        if size != c.size:
            report.wrong_size.append(f"{c.path} ({size} bytes, manifest says {c.size})")
            continue
        if verify_checksums and c.checksum is not None:
            actual = store.checksum(location, c.path, algorithm_of(c.checksum))
            if actual != c.checksum:
                report.wrong_checksum.append(f"{c.path} ({actual}, manifest says {c.checksum})")
    return report
