"""The staging store contract: what the protocol needs of the place attempts are staged."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from airflow_provider_walsink.core.protocol.manifest import MANIFEST_NAME, Manifest

if TYPE_CHECKING:
    from airflow_provider_walsink.core.staging.layout import StagingLayout


@dataclass(frozen=True)
class AttemptLocation:
    """Where one attempt of one checkpoint is staged in a staging backend.

    ``path`` is the attempt's path in the store's file system (an absolute local
    path, or ``bucket/prefix/<pipeline>/<key>/attempt-<n>-<id>`` on an object
    store); ``uri`` is the same place as other tools name it (the local path
    itself, or ``s3://bucket/prefix/...``).
    """

    pipeline: str
    checkpoint_key: str
    attempt: int
    attempt_id: str | None
    path: str
    uri: str

    @property
    def manifest_path(self) -> str:
        return f"{self.path}/{MANIFEST_NAME}"


#: One staged attempt as GC sees it: (number, attempt id or None, location), the location being
#: its path on its root (a local path, or ``bucket/prefix/<pipeline>/<key>/attempt-...``).
Staged = tuple[int, "str | None", str]


class StagingListing(ABC):
    """What garbage collection may see and do under one staging root (:meth:`StagingBackend.listing`).

    Walsink's layout only: :meth:`pipelines` and :meth:`checkpoints` list real directories (or
    prefixes) by name, ``(name, shown)``; :meth:`entries` splits a checkpoint into its attempts
    (``attempt-<n>`` / ``attempt-<n>-<32 hex>``, n >= 1, real directories) and its strays (any
    other name: never deleted); :meth:`old` / :meth:`age` say whether an attempt was last changed
    before a cutoff and how long ago; :meth:`delete` removes one attempt listed here (a refusal
    or failure is appended to ``skipped``, never raised), and :meth:`drop_checkpoint` the emptied
    checkpoint itself, false when something is (again) in it. Nothing outside the root, and no
    symlink, is ever followed or deleted.
    """

    #: The root as shown in reports.
    label: str

    @abstractmethod
    def pipelines(self) -> list[tuple[str, str]]: ...

    @abstractmethod
    def checkpoints(self, pipeline: str) -> list[tuple[str, str]]: ...

    @abstractmethod
    def checkpoint(self, pipeline: str, key: str) -> str: ...

    @abstractmethod
    def entries(self, pipeline: str, key: str) -> tuple[list[Staged], list[str]]: ...

    @abstractmethod
    def staged(self, pipeline: str, key: str) -> list[Staged]: ...

    @abstractmethod
    def old(self, location: str, cutoff_ts: float) -> bool: ...

    @abstractmethod
    def age(self, location: str) -> str: ...

    @abstractmethod
    def delete(self, location: str, skipped: list[str], dry_run: bool) -> bool: ...

    @abstractmethod
    def drop_checkpoint(self, pipeline: str, key: str, dry_run: bool, removed: list[str]) -> bool: ...


class StagingBackend(ABC):
    """One staging root and the attempts under it; a backend per kind of storage.

    The protocol needs exactly this of it (docs/protocol.md):

    * **Locate an attempt**: ``<root>/<pipeline>/<checkpoint>/attempt-<n>-<attempt id>/``
      (:meth:`attempt`), with the identifiers validated.
    * **Put a committable once**: the job writes each committable once at
      :meth:`committable`, inside its attempt; nothing is ever rewritten.
    * **Seal the manifest once** (:meth:`seal`): a second seal of the same bytes
      is a no-op giving the same digest; of other bytes it is refused and the
      sealed manifest is left untouched.
    * **List an attempt with sizes** (:meth:`list_attempt`, from metadata, no
      data read) **and checksums** (:meth:`checksum`, one committable streamed
      when asked).
    * **Read the manifest** (:meth:`read_manifest`, size-capped, digest checked
      when given; :meth:`read_manifest_bytes` as stored, ``FileNotFoundError``
      when unsealed) **and a committable** (:meth:`committable`, its size from
      metadata: :meth:`describe`).
    * **Name it** as other tools do: the root (:attr:`root_location`: the absolute
      local path, or the URI), the sealed manifest (:meth:`manifest_uri`: a
      ``file://`` URI, or the object's), and whether a row's recorded root is
      this one (:meth:`names_root`).
    * **A local directory, where there is one** (:attr:`layout`): the
      :class:`~.layout.StagingLayout` a local root reads through (same resolver,
      same symlink refusals), for what needs a directory on this machine (Spark's
      own writer, publishers taking a path); ``None`` on an object store.
    * **Prepare an attempt** (:meth:`prepare_attempt`): its place, with nothing
      left in it by an earlier crash of the same attempt, ready for the job.
    * **Delete an attempt** (:meth:`remove_attempt`): that attempt only.
    * **Be listed for garbage collection** (:meth:`listing`): walsink's layout
      under the root, ages, and the deletions GC may do (:class:`StagingListing`).
    * **Confinement**: nothing outside the root is ever read, written or
      deleted. Every manifest-relative path is checked lexically (not empty, no
      NUL, not absolute, no ``..``, no empty or ``.`` segment), and a symlink
      inside staging is refused, never followed (no symlink escape).

    Backends are chosen by the root's URI scheme in
    :data:`~airflow_provider_walsink.core.staging.registry.KNOWN_STAGING`; a
    local path is one backend among them.
    """

    #: The local directory layout the store reads through; ``None`` on an object store.
    layout: StagingLayout | None

    @classmethod
    @abstractmethod
    def open_root(cls, root: str, options: Mapping[str, Any]) -> StagingBackend:
        """This backend over ``root``, with its storage options (never logged)."""

    @abstractmethod
    def attempt(
        self, pipeline: str, checkpoint_key: str, attempt: int, attempt_id: str | None = None
    ) -> AttemptLocation: ...

    @abstractmethod
    def committable(self, location: AttemptLocation, relative: str) -> str: ...

    @abstractmethod
    def seal(self, location: AttemptLocation, manifest: Manifest) -> str: ...

    @abstractmethod
    def list_attempt(self, location: AttemptLocation, *, visible_only: bool = False) -> dict[str, int]: ...

    @abstractmethod
    def checksum(self, location: AttemptLocation, relative: str, algorithm: str) -> str: ...

    @abstractmethod
    def read_manifest(self, location: AttemptLocation, *, expected_digest: str | None = None) -> Manifest: ...

    @abstractmethod
    def read_manifest_bytes(self, location: AttemptLocation) -> bytes: ...

    @abstractmethod
    def describe(self, location: AttemptLocation, relative: str) -> int | None: ...

    @property
    @abstractmethod
    def root_location(self) -> str: ...

    @abstractmethod
    def manifest_uri(self, location: AttemptLocation) -> str: ...

    @abstractmethod
    def names_root(self, recorded: str) -> bool: ...

    @abstractmethod
    def prepare_attempt(self, location: AttemptLocation) -> None: ...

    @abstractmethod
    def remove_attempt(self, location: AttemptLocation) -> bool: ...

    @abstractmethod
    def listing(self) -> StagingListing:
        """What garbage collection sees of this root (:class:`StagingListing`)."""

    def check_writable(self) -> None:
        """Refuse, before the write phase records anything or starts the job, a root this process
        cannot stage into (``probe.StagingNotWritableError`` naming the root and what was wrong:
        a bucket that does not exist, writes refused). Tried, never inferred; leaves nothing.
        Default: nothing can be checked up front."""
        return None
