"""The staging area on any file system: a local or mounted directory, or an object store.

One layer over ``pyarrow.fs`` so that the write phase, the durability check
and (later) the commit reach staged attempts the same way wherever the staging
root lives. The contract is :class:`~.base.StagingBackend`; the backends are chosen by
scheme in :mod:`.registry`.
"""

from __future__ import annotations

import os
import stat
import threading
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any
from urllib.parse import SplitResult, urlsplit

from airflow_provider_walsink.core.protocol.checksum import Hasher, file_checksum
from airflow_provider_walsink.core.protocol.errors import (
    ManifestError,
    PathEscapeError,
    SymlinkRefusedError,
    WalsinkError,
)
from airflow_provider_walsink.core.protocol.identifiers import validate_identifier
from airflow_provider_walsink.core.protocol.manifest import (
    MANIFEST_NAME,
    MAX_MANIFEST_BYTES,
    Manifest,
    digest_of,
    parse_manifest,
    write_once,
)
from airflow_provider_walsink.core.protocol.manifest import read_manifest as read_local_manifest
from airflow_provider_walsink.core.staging.base import AttemptLocation, StagingBackend, StagingListing
from airflow_provider_walsink.core.staging.layout import (
    _ATTEMPT_ID,
    StagingLayout,
    _check_relative,
    attempt_of,
    staging_path,
)
from airflow_provider_walsink.core.staging.listing import LocalListing, ObjectListing
from airflow_provider_walsink.core.staging.probe import (
    StagingNotWritableError,
    local_root_status,
    probe_object_root,
)
from airflow_provider_walsink.core.staging.registry import open_backend

#: Storage options an ``s3://`` root understands (values are never logged or shown).
S3_OPTIONS = frozenset(
    {"access_key", "secret_key", "session_token", "region", "endpoint_url", "endpoint_override", "scheme"}
)


class StagingStoreError(WalsinkError):
    """A staging root cannot be reached, or an operation on it failed; the message says which."""


class AlreadySealedError(StagingStoreError):
    """The attempt already holds a different sealed manifest: a seal happens once."""


def check_segments(relative: str, what: str, root: str) -> None:
    """The lexical confinement of a manifest-relative path, on every store; raises
    :class:`PathEscapeError` naming ``what``, ``relative`` and ``root``, else returns None.

    Every reader of a staged attempt (the store's resolver, :class:`~..publishers.base.StagedAttempt`)
    checks a path with it before joining it under the attempt. It is
    :func:`_check_relative` (no NUL, not absolute, no ``..``) and no empty or
    ``.`` segment either: an object key is not normalised, so ``a//b`` and
    ``a/./b`` would be keys of their own beside the file the manifest seems to
    name (manifest validation refuses them too; this holds for paths that come
    from elsewhere, such as an executor's report).
    """
    _check_relative(relative, what, root)
    if any(part in ("", ".") for part in relative.split("/")):
        raise PathEscapeError(f"{what} {relative!r} has an empty or '.' segment")


#: Held while a store creates its boto3 client (the triggerer's check threads share one store).
_BOTO3_LOCK = threading.Lock()


class StagingStore(StagingBackend):
    """:class:`~.base.StagingBackend` (the contract) over ``pyarrow.fs``, shared by both backends:
    :class:`LocalStagingStore` and :class:`ObjectStagingStore`. How each promise is kept:

    * **Resolution.** :meth:`open` takes the staging root as a local path,
      ``file://`` URI, ``s3://bucket/prefix``, ``gs://bucket/prefix`` or
      ``abfss://container@account.dfs.core.windows.net/prefix`` (any other
      scheme through fsspec), plus storage options (S3: ``access_key``,
      ``secret_key``, ``session_token``, ``region``, ``endpoint_url`` or
      ``endpoint_override`` + ``scheme``; without keys, the provider's default
      credential chain). Options are never logged, shown in ``repr`` or put on
      a command line (executors receive :attr:`filesystem` pickled in their
      tasks, as Spark ships any closure).
    * **Layout.** An attempt lives at ``<root>/<pipeline>/<checkpoint>/
      attempt-<n>-<attempt id>/`` exactly as :meth:`StagingLayout.attempt_dir`
      places it (same identifier validation; local roots *are* that layout).
    * **Confinement** (invariants 6 and 11). Every manifest-relative path is
      checked lexically: not empty, no NUL, not absolute, no ``..``, no empty
      or ``.`` segment. On a local root every path also
      goes through :class:`StagingLayout`'s resolver: a symlink inside staging
      is refused, never followed. Object stores have no links.
    * **Seal.** :meth:`seal` writes the manifest once. Local: temp file, fsync,
      rename, after checking no manifest is there yet (the operator gives each
      attempt its own directory, so no second writer races the check). S3: a
      conditional put (``If-None-Match: *``), atomic on the store. A second
      seal of the same bytes is a no-op returning the same digest; of other
      bytes, :class:`AlreadySealedError`, the sealed manifest untouched.
      GCS (:mod:`.gcs`): a create-only upload (``ifGenerationMatch=0``), refused by the
      service with 412 when a manifest is there. Azure (:mod:`.adls`): one Put Blob with
      ``If-None-Match: *``, refused by the service with 409 when a manifest is there.
      Other object stores (fsspec): written only if
      absent (the attempt's unique prefix has one writer), and the committer
      table's record of the digest is the seal: every reader checks it.
    * **Reads.** :meth:`read_manifest` reads with a size cap and checks the
      digest when given one; :meth:`describe` and :meth:`list_attempt` give
      sizes from metadata (``lstat``, HEAD, LIST), never reading data;
      :meth:`checksum` streams one file when asked to.
    * **Naming and layout** differ per backend, so they live on each (never asked of a kind):
      :attr:`root_location`, :meth:`manifest_uri`, :meth:`names_root`; :attr:`layout`
      is set on a local root only.
    * **Delete.** :meth:`remove_attempt` deletes one attempt, located by
      :meth:`attempt`, and nothing else: only a prefix named
      ``attempt-<n>[-<32 hex>]`` directly under ``<pipeline>/<checkpoint>``;
      :meth:`remove_manifest` deletes only such an attempt's manifest (a table
      target's clean-up: the committed attempt's files stay, the table references them).
    """

    def __init__(
        self,
        root_uri: str,
        filesystem: Any,
        base: str,
        *,
        kind: str,
        options: Mapping[str, Any] | None = None,
    ) -> None:
        self.root_uri = root_uri
        #: A ``pyarrow.fs.FileSystem``; picklable, so executors can write through it.
        self.filesystem = filesystem
        #: The root's path in :attr:`filesystem` (no trailing slash).
        self.base = base.rstrip("/") or "/"
        #: ``local``, ``s3``, ``gs``, ``abfs`` or an fsspec protocol name.
        self.kind = kind
        self._options = dict(options or {})
        self.layout = StagingLayout(base) if kind == "local" else None
        self._s3_client: Any = None

    def __repr__(self) -> str:  # the options may hold secrets: the root only
        return f"StagingStore({self.root_uri!r}, kind={self.kind!r})"

    # ------------------------------------------------------------------ resolution

    @classmethod
    def open(cls, root: str | os.PathLike[str], options: Mapping[str, Any] | None = None) -> StagingStore:
        """Resolve a staging root and its storage options into a file system and a base path:
        the backend its scheme names (:data:`~.registry.KNOWN_STAGING`)."""
        return open_backend(root, options)  # type: ignore[no-any-return]

    # ------------------------------------------------------------------ layout

    def attempt(
        self, pipeline: str, checkpoint_key: str, attempt: int, attempt_id: str | None = None
    ) -> AttemptLocation:
        """The location of one attempt (:meth:`StagingLayout.attempt_dir`'s rules, on any store)."""
        if self.layout is not None:
            path = os.fspath(self.layout.attempt_dir(pipeline, checkpoint_key, attempt, attempt_id))
            return AttemptLocation(pipeline, checkpoint_key, attempt, attempt_id, path, path)
        validate_identifier(pipeline, "pipeline id")
        validate_identifier(checkpoint_key, "checkpoint key")
        if not isinstance(attempt, int) or isinstance(attempt, bool) or attempt < 1:
            raise ValueError(f"attempt must be a positive integer, got {attempt!r}")
        checkpoint = f"{self.base}/{pipeline}/{checkpoint_key}"
        if attempt_id and not attempt_id.startswith("v1-"):
            if not _ATTEMPT_ID.fullmatch(attempt_id):
                raise ValueError(f"attempt id must be 32 hex digits, got {attempt_id!r}")
            name = f"attempt-{attempt}-{attempt_id}"
        else:
            name = f"attempt-{attempt}"
            if attempt_id is None:  # as the local layout: the one attempt of that number, if named
                named = [
                    n for n, found in self._attempt_names(checkpoint) if found[0] == attempt and found[1]
                ]
                if len(named) == 1:
                    name = named[0]
        return AttemptLocation(
            pipeline, checkpoint_key, attempt, attempt_id, f"{checkpoint}/{name}", self._uri(checkpoint, name)
        )

    def _uri(self, checkpoint: str, name: str) -> str:
        relative = f"{checkpoint}/{name}"[len(self.base) :]
        return self.root_uri.rstrip("/") + relative

    def _attempt_names(self, checkpoint: str) -> list[tuple[str, tuple[int, str | None]]]:
        found = []
        for name in self.child_dirs(checkpoint):
            named = attempt_of(name)
            if named is not None:
                found.append((name, named))
        return found

    def child_dirs(self, path: str) -> list[str]:
        """The names of the directories (on an object store: the prefixes) directly under ``path``
        in :attr:`filesystem`; none when it does not exist. A store whose ``pyarrow`` listing
        leaves out prefixes that have no marker object overrides it (``gs://``)."""
        import pyarrow.fs as pafs

        infos = self.filesystem.get_file_info(pafs.FileSelector(path, allow_not_found=True))
        return [info.base_name for info in infos if info.type == pafs.FileType.Directory]

    def committable(self, location: AttemptLocation, relative: str) -> str:
        """The path of a manifest-relative file in :attr:`filesystem`, confined to the attempt.

        Raises :class:`PathEscapeError` (:class:`SymlinkRefusedError` for a link on a local root).
        """
        return self.resolver(location)(relative)[0]

    def resolver(self, location: AttemptLocation) -> Callable[[str], tuple[str, os.stat_result | None]]:
        """:meth:`committable` for the many files of one attempt: the path and, on a local root, its
        ``lstat`` (``None`` when absent; always ``None`` on an object store). One per operation
        (:class:`Confiner`'s caching rule)."""
        local = self.layout.committable_resolver(Path(location.path)) if self.layout is not None else None

        def resolve(relative: str) -> tuple[str, os.stat_result | None]:
            # Lexical checks first on every store: the local resolver joins the path under the
            # attempt, so an absolute or empty one would otherwise name a place inside it.
            check_segments(relative, "committable", location.uri)
            if local is not None:
                return local(relative)
            return f"{location.path}/{relative}", None

        return resolve

    # ------------------------------------------------------------------ seal and manifest

    def seal(self, location: AttemptLocation, manifest: Manifest) -> str:
        """Write ``manifest`` as the attempt's seal, once; return its digest (see the class contract)."""
        data = manifest.to_bytes()
        digest = digest_of(data)
        if self.layout is not None:
            path = Path(location.manifest_path)
            if os.path.lexists(path):
                return self._same_seal(location, digest)
            os.makedirs(location.path, exist_ok=True)
            try:
                # Created only if absent: of two seals in flight at once, the second must not
                # replace the manifest the first recorded (a rename would).
                write_once(path, data)
            except FileExistsError:
                return self._same_seal(location, digest)
            return digest
        if self.kind != "s3":
            return self._seal_once(location, data, digest)
        bucket, _, key = location.manifest_path.partition("/")
        client = self._boto3()
        from botocore.exceptions import ClientError

        try:
            client.put_object(
                Bucket=bucket, Key=key, Body=data, ContentType="application/json", IfNoneMatch="*"
            )
        except ClientError as e:
            code = str(e.response.get("Error", {}).get("Code", ""))
            status = e.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
            if status == 412 or code == "PreconditionFailed":  # the key exists: sealed before
                return self._same_seal(location, digest)
            if status == 409 or code == "ConditionalRequestConflict":
                raise StagingStoreError(
                    f"another seal of {location.uri} is in flight (409 ConditionalRequestConflict); "
                    "retry the seal: it then either matches the sealed manifest or is refused"
                ) from None
            raise StagingStoreError(f"sealing {location.uri}/{MANIFEST_NAME} failed ({code or e})") from None
        return digest

    def _seal_once(self, location: AttemptLocation, data: bytes, digest: str) -> str:
        """The seal on a store other than S3; a store whose service has a conditional create overrides
        it (``gs://``: :class:`~.gcs.GcsStagingStore`; ``abfss://``: :class:`~.adls.AdlsStagingStore`).
        Here (fsspec stores):
        written only if no manifest is there. The check and the write are two requests, but no second
        writer races them: an attempt's prefix carries its unique attempt id and only its job's driver
        writes the manifest. What makes it *the* seal is the committer table: the operator records this
        digest, and every reader (sensor, trigger, commit, audit, abort) refuses a manifest with another."""
        import pyarrow.fs as pafs

        if self.filesystem.get_file_info(location.manifest_path).type != pafs.FileType.NotFound:
            return self._same_seal(location, digest)
        self.filesystem.create_dir(location.path, recursive=True)
        with self.filesystem.open_output_stream(location.manifest_path) as out:
            out.write(data)
        return digest

    def _same_seal(self, location: AttemptLocation, digest: str) -> str:
        existing = digest_of(self._read_manifest_bytes(location))
        if existing != digest:
            raise AlreadySealedError(
                f"attempt {location.uri} is already sealed with another manifest ({existing}, "
                f"this one is {digest}); a seal is written once and never replaced"
            )
        return digest

    def read_manifest_bytes(self, location: AttemptLocation) -> bytes:
        """The attempt's manifest as stored, size-capped, never through a link (``FileNotFoundError``
        when it is not sealed; other ``OSError`` as raised)."""
        if self.layout is not None:
            with os.fdopen(os.open(location.manifest_path, os.O_RDONLY | os.O_NOFOLLOW), "rb") as f:
                return f.read(MAX_MANIFEST_BYTES + 1)
        if self.kind == "s3":
            return self._get_s3_manifest(location)
        with self.filesystem.open_input_stream(location.manifest_path) as f:
            return f.read(MAX_MANIFEST_BYTES + 1)

    def _get_s3_manifest(self, location: AttemptLocation) -> bytes:
        """One GET through boto3: ``pyarrow`` sends a HEAD before every read for the size,
        a round trip per durability check that a triggerer checking a thousand checkpoints a minute
        pays for nothing (bench/README.md, benchmark 10)."""
        from botocore.exceptions import BotoCoreError, ClientError

        bucket, _, key = location.manifest_path.partition("/")
        try:
            # No Range: S3 refuses a range of an empty object (416), and the cap is kept by reading
            # at most one byte past it before the stream is closed.
            answer = self._boto3().get_object(Bucket=bucket, Key=key)
        except ClientError as e:
            code = e.response.get("Error", {}).get("Code", "")
            if code in ("NoSuchKey", "404", "NotFound"):
                raise FileNotFoundError(location.manifest_path) from None
            raise OSError(f"{code or 'error'}: {e}") from None
        except BotoCoreError as e:  # no answer (connection refused, timed out): as pyarrow raised
            raise OSError(str(e)) from None
        try:
            with answer["Body"] as body:
                return body.read(MAX_MANIFEST_BYTES + 1)  # type: ignore[no-any-return]
        except BotoCoreError as e:  # the answer broke off
            raise OSError(str(e)) from None

    def _read_manifest_bytes(self, location: AttemptLocation) -> bytes:
        source = f"manifest {location.uri}/{MANIFEST_NAME}"
        try:
            return self.read_manifest_bytes(location)
        except FileNotFoundError:
            raise ManifestError(f"{source}: does not exist (the write phase has not sealed it)") from None
        except OSError as e:
            how = f"opened ({e.strerror})" if self.layout is not None else f"read ({e})"
            raise ManifestError(f"{source}: cannot be {how}") from None

    def read_manifest(self, location: AttemptLocation, *, expected_digest: str | None = None) -> Manifest:
        """Read, digest-check and validate the attempt's sealed manifest (:class:`ManifestError` if not)."""
        if self.layout is not None:
            return read_local_manifest(location.manifest_path, expected_digest=expected_digest)
        data = self._read_manifest_bytes(location)
        source = f"manifest {location.uri}/{MANIFEST_NAME}"
        if expected_digest is not None and digest_of(data) != expected_digest:
            raise ManifestError(
                f"{source}: digest {digest_of(data)} does not match the sealed digest {expected_digest}"
            )
        return parse_manifest(data, source=source)

    # ------------------------------------------------------------------ describing

    def describe(self, location: AttemptLocation, relative: str) -> int | None:
        """The size of one staged file from its metadata (``lstat`` or HEAD), ``None`` if absent."""
        path, st = self.resolver(location)(relative)
        if self.layout is not None:
            return st.st_size if st is not None and stat.S_ISREG(st.st_mode) else None
        import pyarrow.fs as pafs

        info = self.filesystem.get_file_info(path)
        return info.size if info.type == pafs.FileType.File else None

    def list_attempt(self, location: AttemptLocation, *, visible_only: bool = False) -> dict[str, int]:
        """Every file under the attempt, relative path -> size, from one listing (no data read).

        ``visible_only`` leaves out bookkeeping (any segment starting with ``_`` or
        ``.``: the manifest, Spark's ``_SUCCESS`` and ``.crc`` files). On a local
        root a symlink anywhere in the attempt raises :class:`SymlinkRefusedError`.
        """
        found: dict[str, int] = {}
        if self.layout is not None:
            root = location.path
            if os.path.islink(root):
                raise SymlinkRefusedError(f"attempt directory {root} is a symlink; walsink never follows one")
            for dirpath, dirnames, filenames in os.walk(root):
                rel_dir = os.path.relpath(dirpath, root)
                for name in dirnames + filenames:
                    full = os.path.join(dirpath, name)
                    st = os.lstat(full)
                    if stat.S_ISLNK(st.st_mode):
                        raise SymlinkRefusedError(
                            f"{full} is a symlink inside staging; walsink never follows one"
                        )
                    if name in filenames:
                        rel = name if rel_dir == "." else f"{rel_dir}/{name}"
                        found[rel] = st.st_size
        else:
            import pyarrow.fs as pafs

            selector = pafs.FileSelector(location.path, recursive=True, allow_not_found=True)
            prefix = location.path + "/"
            for info in self.filesystem.get_file_info(selector):
                # Object-store paths have no root; some fsspec stores (memory://) answer with one.
                path = info.path.lstrip("/")
                if info.type == pafs.FileType.File and path.startswith(prefix):
                    found[path[len(prefix) :]] = info.size
        if visible_only:
            found = {
                rel: size
                for rel, size in found.items()
                if not any(part.startswith(("_", ".")) for part in rel.split("/"))
            }
        return found

    def checksum(self, location: AttemptLocation, relative: str, algorithm: str) -> str:
        """``"<algorithm>:<hex>"`` of one staged file, streamed (this one does read the data)."""
        path, _st = self.resolver(location)(relative)
        if self.layout is not None:
            return file_checksum(path, algorithm)
        hasher = Hasher(algorithm)
        with self.filesystem.open_input_stream(path) as f:
            while chunk := f.read(1 << 20):
                hasher.update(chunk)
        return hasher.value()

    def stored_checksums(self, location: AttemptLocation) -> dict[str, tuple[int, str]] | None:
        """Every object under the attempt with the size and the checksum the *service* keeps for it,
        from one listing (no data read): relative path -> ``(size, "<kind>:<hex>")``. On S3 the
        ETag (``"etag:<hex>"``: an upload's MD5, or for pyarrow's multipart uploads a digest of
        the parts' MD5s, changed with the bytes all the same); GCS overrides it with CRC32C, Azure with Content-MD5 or the ETag. ``None``
        where the store keeps none (a local root, fsspec stores)."""
        if self.kind != "s3":
            return None
        bucket, _, key = location.path.partition("/")
        prefix = key + "/"
        return {
            obj["Key"][len(prefix) :]: (int(obj["Size"]), "etag:" + obj["ETag"].strip('"'))
            for page in self._boto3().get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix)
            for obj in page.get("Contents", [])
            if not obj["Key"].endswith("/")
        }

    # ------------------------------------------------------------------ deleting

    def remove_attempt(self, location: AttemptLocation) -> bool:
        """Delete one attempt located by :meth:`attempt` (and only that); True if something was removed."""
        self._check_own(location)
        if self.layout is not None:
            return self.layout.remove_attempt(
                location.pipeline, location.checkpoint_key, location.attempt, location.attempt_id
            )
        return self._delete_attempt(location)

    def remove_manifest(self, location: AttemptLocation) -> bool:
        """Delete one attempt's manifest (located by :meth:`attempt`) and nothing else: its committables
        stay, a table references them in place. True if there was one. An object store overrides it."""
        self._check_own(location)
        try:
            os.unlink(location.manifest_path)  # a link is removed, never followed
        except FileNotFoundError:
            return False
        return True

    def _check_own(self, location: AttemptLocation) -> None:
        """Raise :class:`PathEscapeError` unless ``location`` is the attempt :meth:`attempt` builds."""
        expected = self.attempt(
            location.pipeline, location.checkpoint_key, location.attempt, location.attempt_id
        )
        if expected.path != location.path or attempt_of(location.path.rsplit("/", 1)[-1]) is None:
            raise PathEscapeError(
                f"{location.uri} is not an attempt of this staging root; refusing to delete"
            )

    def _delete_attempt(self, location: AttemptLocation) -> bool:
        """Delete every object of an attempt :meth:`remove_attempt` has checked; a store whose
        service deletes by prefix better than ``pyarrow`` does overrides it (S3 here, ``gs://``)."""
        if self.kind == "s3":
            return self._delete_s3_prefix(location)
        if not self.list_attempt(location):  # an object store has no empty directories
            return False
        self.filesystem.delete_dir(location.path)
        return True

    def _delete_s3_prefix(self, location: AttemptLocation) -> bool:
        """Delete every object under ``<attempt>/``: listed, then removed in batches of 1,000.

        Not ``pyarrow``'s ``delete_dir``: it leaves an empty marker object for the parent
        (``<pipeline>/<checkpoint>/``), so a checkpoint prefix would never go away.
        """
        bucket, _, key = location.path.partition("/")
        client = self._boto3()
        keys = [
            obj["Key"]
            for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=key + "/")
            for obj in page.get("Contents", [])
        ]
        for start in range(0, len(keys), 1000):
            batch = [{"Key": k} for k in keys[start : start + 1000]]
            answer = client.delete_objects(Bucket=bucket, Delete={"Objects": batch, "Quiet": True})
            if answer.get("Errors"):
                first = answer["Errors"][0]
                raise StagingStoreError(
                    f"deleting {location.uri} failed for {len(answer['Errors'])} objects "
                    f"(first: {first.get('Key')}: {first.get('Code')}); run the clean-up again"
                )
        return bool(keys)

    # ------------------------------------------------------------------ S3 client

    def _boto3(self) -> Any:
        with _BOTO3_LOCK:  # boto3's default session is not safe to create clients from at once
            return self._boto3_client()

    def _boto3_client(self) -> Any:
        if self._s3_client is None:
            try:
                import boto3
            except ImportError:
                raise StagingStoreError(
                    "sealing on s3:// needs boto3 (pyarrow cannot put conditionally): pip install boto3"
                ) from None
            o = self._options
            endpoint = o.get("endpoint_url")
            if not endpoint and o.get("endpoint_override"):
                endpoint = f"{o.get('scheme', 'https')}://{o['endpoint_override']}"
            self._s3_client = boto3.client(
                "s3",
                endpoint_url=endpoint or None,
                aws_access_key_id=o.get("access_key"),
                aws_secret_access_key=o.get("secret_key"),
                aws_session_token=o.get("session_token"),
                region_name=o.get("region"),
            )
        return self._s3_client


class LocalStagingStore(StagingStore):
    """The local-file backend: a path or ``file://`` root, read through :class:`StagingLayout`
    (its resolver refuses symlinks inside staging)."""

    @classmethod
    def open_root(cls, root: str, options: Mapping[str, Any]) -> StagingStore:
        import pyarrow.fs as pafs

        text = os.fspath(root)
        options = dict(options or {})
        if options:
            raise StagingStoreError(
                f"staging root {text!r} is local; storage options ({', '.join(sorted(options))}) "
                "apply to object stores only"
            )
        path = os.path.abspath(staging_path(text))
        return cls(text, pafs.LocalFileSystem(), path, kind="local")

    @classmethod
    def of(cls, layout: StagingLayout) -> LocalStagingStore:
        """The store over a local layout that *is* that layout (same resolver, same checks)."""
        import pyarrow.fs as pafs

        store = cls(str(layout.root), pafs.LocalFileSystem(), str(layout.root), kind="local")
        store.layout = layout
        return store

    @property
    def root_location(self) -> str:
        return self.base

    def manifest_uri(self, location: AttemptLocation) -> str:
        return Path(location.manifest_path).as_uri()

    def names_root(self, recorded: str) -> bool:
        try:
            return os.path.abspath(staging_path(recorded)) == self.base
        except ValueError:  # a URI: not a local root
            return False

    def prepare_attempt(self, location: AttemptLocation) -> None:
        attempt_dir = Path(location.path)
        if attempt_dir.exists():  # left by a crash with the same attempt number: never reuse its files
            self.remove_attempt(location)
        attempt_dir.mkdir(parents=True)

    def listing(self) -> StagingListing:
        assert self.layout is not None
        return LocalListing(self.layout)

    def check_writable(self) -> None:
        ok, message = local_root_status(self.base)
        if not ok:
            raise StagingNotWritableError(message)


class ObjectStagingStore(StagingStore):
    """The object-store backend (``pyarrow.fs``): ``s3://``, and any other scheme through fsspec
    (``gs://`` is :class:`~.gcs.GcsStagingStore` and ``abfss://`` :class:`~.adls.AdlsStagingStore`,
    subclasses)."""

    @classmethod
    def open_root(cls, root: str, options: Mapping[str, Any]) -> StagingStore:
        text = os.fspath(root)
        options = dict(options or {})
        parts = split_object_root(text)
        scheme = parts.scheme.lower()
        prefix = parts.path.strip("/")
        if scheme in ("s3", "s3a"):
            fs = _s3_filesystem(text, options)
            return cls(text, fs, f"{parts.netloc}/{prefix}".rstrip("/"), kind="s3", options=options)
        try:
            import fsspec
            from pyarrow.fs import FSSpecHandler, PyFileSystem

            fs = PyFileSystem(FSSpecHandler(fsspec.filesystem(scheme, **options)))
        except (ImportError, ValueError) as e:
            raise StagingStoreError(f"staging root {text!r}: no file system for {scheme}:// ({e})") from None
        return cls(text, fs, f"{parts.netloc}/{prefix}".rstrip("/"), kind=scheme, options=options)

    @property
    def root_location(self) -> str:
        return self.root_uri.rstrip("/")

    def manifest_uri(self, location: AttemptLocation) -> str:
        return f"{location.uri}/{MANIFEST_NAME}"

    def names_root(self, recorded: str) -> bool:
        return recorded.rstrip("/") == self.root_uri.rstrip("/")

    def prepare_attempt(self, location: AttemptLocation) -> None:
        # An object store has no directories to create; objects left under this attempt's
        # prefix (a crash with the same attempt id) would mix with the job's.
        if self.list_attempt(location):
            self.remove_attempt(location)

    def listing(self) -> StagingListing:
        return ObjectListing(self)

    def check_writable(self) -> None:
        probe_object_root(self.filesystem, self.base, self.root_uri, delete=self._delete_object)

    def remove_manifest(self, location: AttemptLocation) -> bool:
        """The manifest object deleted through the service's own single delete (:meth:`_delete_object`):
        ``pyarrow``'s ``delete_file`` leaves a marker object for the parent on S3 and Azure's flat
        namespace, and its GCS listing sees no attempt prefix at all."""
        import pyarrow.fs as pafs

        self._check_own(location)
        if self.filesystem.get_file_info(location.manifest_path).type != pafs.FileType.File:
            return False
        self._delete_object(location.manifest_path)
        return True

    def _delete_object(self, path: str) -> None:
        """Delete one object; on S3 one ``DeleteObject`` (pyarrow's ``delete_file`` would leave a
        marker object for the parent prefix). A store with its own client overrides it."""
        if self.kind != "s3":
            self.filesystem.delete_file(path)
            return
        bucket, _, key = path.partition("/")
        self._boto3().delete_object(Bucket=bucket, Key=key)


def split_object_root(root: str) -> SplitResult:
    """``root``'s URI parts (``urlsplit``), refused with :class:`StagingStoreError` when it names no
    bucket (container) or carries a query or fragment (options are given separately)."""
    parts = urlsplit(root)
    if not parts.netloc:
        raise StagingStoreError(f"staging root {root!r} names no bucket or container")
    if parts.query or parts.fragment:
        raise StagingStoreError(f"staging root {root!r} has a query or fragment; give options separately")
    return parts


def _s3_filesystem(root: str, options: Mapping[str, Any]) -> Any:
    import pyarrow.fs as pafs

    unknown = sorted(set(options) - S3_OPTIONS)
    if unknown:
        raise StagingStoreError(
            f"staging root {root!r}: unknown S3 storage options {unknown}; known: {sorted(S3_OPTIONS)}"
        )
    if bool(options.get("access_key")) != bool(options.get("secret_key")):
        raise StagingStoreError(f"staging root {root!r}: give both access_key and secret_key, or neither")
    kwargs: dict[str, Any] = {}
    endpoint = options.get("endpoint_url")
    if endpoint:
        parts = urlsplit(endpoint)
        if not parts.netloc:
            raise StagingStoreError(f"staging root {root!r}: endpoint_url must be like http://host:port")
        kwargs["endpoint_override"] = parts.netloc
        kwargs["scheme"] = parts.scheme
    elif options.get("endpoint_override"):
        kwargs["endpoint_override"] = options["endpoint_override"]
        kwargs["scheme"] = options.get("scheme", "https")
    for ours, theirs in (("access_key", "access_key"), ("secret_key", "secret_key")):
        if options.get(ours):
            kwargs[theirs] = options[ours]
    if options.get("session_token"):
        kwargs["session_token"] = options["session_token"]
    if options.get("region"):
        kwargs["region"] = options["region"]
    return pafs.S3FileSystem(**kwargs)
