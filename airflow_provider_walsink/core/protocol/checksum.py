"""File checksums as ``"<algorithm>:<hex>"`` strings."""

from __future__ import annotations

import hashlib
import os
import zlib

_CHUNK = 1 << 20


def file_checksum(path: str | os.PathLike[str], algorithm: str = "sha256") -> str:
    """Checksum of a file, streamed in 1 MiB chunks."""
    with open(path, "rb") as f:
        if algorithm == "sha256":
            return "sha256:" + hashlib.file_digest(f, "sha256").hexdigest()
        if algorithm == "crc32":
            crc = 0
            while chunk := f.read(_CHUNK):
                crc = zlib.crc32(chunk, crc)
            return f"crc32:{crc:08x}"
    raise ValueError(f"unknown checksum algorithm {algorithm!r}")


class Hasher:
    """:func:`file_checksum` fed piece by piece (bytes being written or streamed); same strings."""

    def __init__(self, algorithm: str) -> None:
        if algorithm not in ("sha256", "crc32"):
            raise ValueError(f"unknown checksum algorithm {algorithm!r}")
        self._sha = hashlib.sha256() if algorithm == "sha256" else None
        self._crc = 0

    def update(self, data: bytes | bytearray | memoryview) -> None:
        if self._sha is not None:
            self._sha.update(data)
        else:
            self._crc = zlib.crc32(data, self._crc)

    def value(self) -> str:
        if self._sha is not None:
            return "sha256:" + self._sha.hexdigest()
        return f"crc32:{self._crc:08x}"


def algorithm_of(checksum: str) -> str:
    return checksum.partition(":")[0]
