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


def algorithm_of(checksum: str) -> str:
    return checksum.partition(":")[0]
