"""An Airflow run's partition key as a walsink checkpoint key and as the target partition it replaces.

The one mapping every task of a pipeline uses (docs/backfill.md, "Partitioned runs"):

* **checkpoint key** = ``pk=`` + the partition key, every byte outside ``A-Z a-z 0-9 _ . -``
  written as ``+XX`` (upper-case hex of its UTF-8 bytes): ``2026-01-01`` is ``pk=2026-01-01``,
  ``2026-01-01T00:00:00`` (``CronPartitionTimetable``'s default format) is
  ``pk=2026-01-01T00+3A00+3A00``, ``eu|2026`` is ``pk=eu+7C2026``. The mapping is one to one
  (``+`` itself is escaped) and its results are valid checkpoint keys; the ``pk=`` prefix keeps
  partition checkpoints apart from data-interval ones (``20260101T000000Z``), so a pipeline
  moved from an interval schedule to a partition schedule never mistakes one for the other.
* **target partition** (when the pipeline declares ``partition_column``) = the Hive directory
  ``<column>=<key as Spark escapes it>``: ``dt=2026-01-01``. An ``overwrite`` checkpoint of
  that key replaces that partition and no other (the write task refuses a sealed attempt
  that names another, before it is recorded as sealed: nothing is published).

A key is refused (:class:`PartitionKeyError`) before anything is recorded or any job is started
when it cannot name a checkpoint and a partition safely: empty or blank, leading or trailing
white space, a control character, ``/`` or ``\\``, ``..``, Spark's NULL partition name, a
checkpoint key longer than 128 characters, or (when the pipeline declares ``partition_key_format``)
a key that is not exactly that format's rendering of a date.

Pure functions: no Airflow, no I/O.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime

from airflow_provider_walsink.core.protocol.errors import InvalidIdentifierError
from airflow_provider_walsink.core.protocol.identifiers import validate_identifier
from airflow_provider_walsink.core.protocol.partitions import HIVE_NULL, partition_dir

#: Prefix of every checkpoint key derived from a partition key.
PARTITION_KEY_PREFIX = "pk="
#: Characters kept as they are in the checkpoint key; every other byte becomes ``+XX``.
_KEPT = re.compile(r"[A-Za-z0-9_.\-]")
_TOKEN = re.compile(r"\+([0-9A-F]{2})|.", re.DOTALL)
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
_PARTITION_COLUMN = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,127}")


class PartitionKeyError(InvalidIdentifierError):
    """A run's partition key cannot name a checkpoint or a target partition; the message says why."""


def _refuse(key: object, why: str) -> PartitionKeyError:
    return PartitionKeyError(
        f"partition key {key!r} cannot be a walsink checkpoint: {why}. Nothing was recorded and no "
        "job was started; run the partition under a key that names it plainly (docs/backfill.md, "
        '"Partitioned runs")'
    )


def checkpoint_key_for_partition(partition_key: object) -> str:
    """The checkpoint key of ``partition_key`` (see the module docstring); the inverse is
    :func:`partition_key_of_checkpoint`.

    Raises:
        PartitionKeyError: the key is not a string, is empty or blank, has leading or trailing
            white space, a control character, ``/``, ``\\`` or ``..``, or maps to a checkpoint
            key longer than 128 characters.
    """
    if not isinstance(partition_key, str):
        raise _refuse(partition_key, f"it is a {type(partition_key).__name__}, not a string")
    if not partition_key.strip():
        raise _refuse(partition_key, "it is empty")
    if partition_key != partition_key.strip():
        raise _refuse(partition_key, "it starts or ends with white space")
    if _CONTROL.search(partition_key):
        raise _refuse(partition_key, "it holds a control character")
    for part in ("/", "\\"):
        if part in partition_key:
            raise _refuse(partition_key, f"it holds {part!r}, a path separator")
    if ".." in partition_key:
        raise _refuse(partition_key, "it holds '..'")
    escaped = "".join(
        ch if _KEPT.fullmatch(ch) else "".join(f"+{b:02X}" for b in ch.encode("utf-8"))
        for ch in partition_key
    )
    key = PARTITION_KEY_PREFIX + escaped
    try:
        return validate_identifier(key, "checkpoint key")
    except InvalidIdentifierError:
        raise _refuse(
            partition_key, f"its checkpoint key {key!r} is {len(key)} characters long, over 128"
        ) from None


def partition_key_of_checkpoint(checkpoint_key: str) -> str | None:
    """The partition key a checkpoint key was derived from, or ``None`` (a data-interval or explicit key)."""
    if not checkpoint_key.startswith(PARTITION_KEY_PREFIX):
        return None
    out = bytearray()
    for match in _TOKEN.finditer(checkpoint_key[len(PARTITION_KEY_PREFIX) :]):
        out.extend(bytes.fromhex(match.group(1)) if match.group(1) else match.group(0).encode("utf-8"))
    return out.decode("utf-8", errors="replace")


def checkpoint_key_as_written(checkpoint_key: str) -> str:
    """How a person names a checkpoint: ``münchen-ü (pk=m+C3+BCnchen-+C3+BC)`` for a partition
    checkpoint (the key as written, the encoded key beside it), the key itself for any other."""
    partition_key = partition_key_of_checkpoint(checkpoint_key)
    return checkpoint_key if partition_key is None else f"{partition_key} ({checkpoint_key})"


def checkpoint_keys_named_by(given: str) -> list[str]:
    """The checkpoint keys a key given by a person may mean, in the order to look them up:
    ``given`` itself first (an existing checkpoint of exactly that key always wins), then, when
    ``given`` is a valid partition key with another encoding, its checkpoint key
    (``a=b`` -> ``pk=a+3Db``). Never more than these two, so nothing is guessed."""
    try:
        encoded = checkpoint_key_for_partition(given)
    except PartitionKeyError:
        return [given]
    return [given] if encoded == given else [given, encoded]


@dataclass(frozen=True)
class PartitionSpec:
    """What a pipeline declares about its partition keys (both optional).

    :param column: the target's partition column a key names: the checkpoint of key ``K``
        replaces partition ``<column>=K`` and no other; must be one of the pipeline's
        ``partition_by`` columns.
    :param key_format: a ``strftime`` format every key must be exactly a rendering of
        (``%Y-%m-%d``: ``2026-01-05``, not ``2026-1-5``).
    """

    column: str | None = None
    key_format: str | None = None

    def check_declaration(self, partition_by: tuple[str, ...] | list[str]) -> None:
        """Refuse, when the DAG is parsed, a declaration no key could satisfy.

        Raises:
            ValueError: ``column`` is not a partition column of the pipeline, or ``key_format``
                holds no ``%`` directive.
        """
        if self.column is not None:
            if not isinstance(self.column, str) or not _PARTITION_COLUMN.fullmatch(self.column):
                raise ValueError(f"partition_column {self.column!r} is not a column name")
            if self.column not in tuple(partition_by):
                raise ValueError(
                    f"partition_column {self.column!r} must be one of the pipeline's partition_by "
                    f"columns {list(partition_by)}: it names the target partition a partition key replaces"
                )
        if self.key_format is not None and (
            not isinstance(self.key_format, str) or "%" not in self.key_format
        ):
            raise ValueError(f"partition_key_format {self.key_format!r} is not a strftime format")

    def checkpoint_key(self, partition_key: object) -> str:
        """The checkpoint key of ``partition_key``, after the declared format's check.

        Raises:
            PartitionKeyError: as :func:`checkpoint_key_for_partition`; the key is not exactly the
                declared format's rendering of a date; the key is Spark's NULL partition name.
        """
        key = checkpoint_key_for_partition(partition_key)
        assert isinstance(partition_key, str)
        if self.key_format is not None:
            try:
                parsed = datetime.strptime(partition_key, self.key_format)
            except ValueError:
                raise _refuse(
                    partition_key,
                    f"it does not match the pipeline's partition_key_format {self.key_format!r}",
                ) from None
            if parsed.strftime(self.key_format) != partition_key:
                raise _refuse(
                    partition_key,
                    f"the pipeline's partition_key_format {self.key_format!r} writes that date as "
                    f"{parsed.strftime(self.key_format)!r}",
                )
        if self.column is not None and partition_key == HIVE_NULL:
            raise _refuse(partition_key, "it is Spark's name of the NULL partition")
        return key

    def target_partition(self, partition_key: str) -> str | None:
        """``<column>=<key as Spark escapes it>``, the partition the key's checkpoint replaces, or
        ``None`` when the pipeline declares no ``column``."""
        if self.column is None:
            return None
        return partition_dir([self.column], [partition_key])
