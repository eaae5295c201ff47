"""The widened data domain: partition values as Spark writes them, for any test or model checker.

Every value here is written to a Hive directory the way Spark 4 writes it
(``ExternalCatalogUtils.getPartitionPathString`` / ``escapePathName``), by the
reference :func:`spark_text` below: an independent transcription of Spark's
code, so a test comparing it with the package's one escape
(``core/protocol/partitions.py: partition_text``) checks the package, not itself.

What a target holds for each value is :func:`expected`: the value's text
(``2026-01-01``, ``2026-01-01 12:30:45.5`` for a timestamp, as Spark casts it
to a string), NULL for NULL, **and NULL for the empty string**: Spark writes
``''`` as ``__HIVE_DEFAULT_PARTITION__``, the directory NULL has, so once staged
the two cannot be told apart, and Spark reads both back as NULL. A target that
held ``''`` would be guessing; every walsink target holds NULL.

:class:`Domain` draws checkpoints (rows with partition values over several
partition columns) from a seed, so a failure replays from its seed.
"""

from __future__ import annotations

import datetime as dt
import random
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

#: Spark's directory name of a NULL (and an empty) partition value.
SPARK_NULL = "__HIVE_DEFAULT_PARTITION__"

#: ``ExternalCatalogUtils.charToEscape`` (Spark 4, not Windows): 0x01-0x1F, these, and DEL.
#: NUL (0x00) is not in Spark's list: no file system takes it in a name, so the domain has none.
_SPARK_ESCAPES = {chr(c) for c in range(0x01, 0x20)} | set("\"#%'*/:=?\\\x7f{[]^")


def spark_text(value: Any) -> str:
    """A partition value's directory text, transcribed from Spark (the test's reference)."""
    if value is None:
        return SPARK_NULL
    string = spark_string(value)
    if string == "":
        return SPARK_NULL
    out = []
    for ch in string:
        out.append("%" + format(ord(ch), "02X") if ch in _SPARK_ESCAPES else ch)
    return "".join(out)


def spark_string(value: Any) -> str | None:
    """``CAST(value AS STRING)`` as Spark does it for a partition value (None for NULL)."""
    if value is None:
        return None
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, dt.datetime):
        text = value.strftime("%Y-%m-%d %H:%M:%S")
        if value.microsecond:
            text += ("." + f"{value.microsecond:06d}").rstrip("0")
        return text
    if isinstance(value, dt.date):
        return value.strftime("%Y-%m-%d")
    return str(value)


def expected(value: Any) -> str | None:
    """What a target holds for a partition value (a string column): its text; NULL for NULL and ``''``."""
    text = spark_string(value)
    return None if text in (None, "") else text


#: String partition values, each with why it is in the domain.
STRINGS: dict[str, str | None] = {
    "null": None,
    "empty": "",
    "plain": "a",
    "trailing space": "a ",  # MySQL/MariaDB's PAD SPACE collations compare it equal to "a"
    "leading space": " a",
    "inner space": "a b",
    "spark escapes": "\"#%'*",
    "colon and equals": "k:v=1",
    "question, braces": "?{[]^",
    "backslash": "a\\b",
    "slash": "x/y",  # a path separator: Spark writes x%2Fy, one directory
    "control": "tab\there\x01\nline",
    "DEL": "del\x7f",
    "looks escaped": "%41",  # must stay "%41", never become "A"
    "unicode": "café 東京",
    "emoji": "🙂",
    "the word NULL": "NULL",  # a string, not the NULL partition
    "dots": "..",
}

#: Values of a second, temporal partition column: dates and timestamps as Spark writes them.
TEMPORAL: dict[str, Any] = {
    "null": None,
    "date": dt.date(2026, 1, 1),
    "midnight": dt.datetime(2026, 1, 1, 0, 0, 0),  # 2026-01-01 00%3A00%3A00
    "fraction": dt.datetime(2026, 1, 2, 12, 30, 45, 500000),  # ...45.5
    "micros": dt.datetime(2026, 12, 31, 23, 59, 59, 123456),
}

#: The partition columns of the domain's tables: a string one and a temporal one (several columns).
COLUMNS = ("k", "t")


def partition_dir(values: tuple[Any, ...], columns: tuple[str, ...] = COLUMNS) -> str:
    """The Hive directory Spark writes for one partition's values."""
    return "/".join(f"{c}={spark_text(v)}" for c, v in zip(columns, values, strict=True))


@dataclass
class Checkpoint:
    """One checkpoint's rows: ``(id, *partition values)`` (values as the job's DataFrame holds them)."""

    key: str
    rows: list[tuple[Any, ...]]

    def partitions(self) -> dict[str, list[tuple[Any, ...]]]:
        """Rows by the Hive directory Spark writes them to (``''`` and NULL share one)."""
        out: dict[str, list[tuple[Any, ...]]] = {}
        for row in self.rows:
            out.setdefault(partition_dir(row[1:]), []).append(row)
        return out

    def expected(self) -> Counter:
        """``(id, k, t)`` as the target must hold them."""
        return Counter((r[0], *(expected(v) for v in r[1:])) for r in self.rows)


@dataclass
class Domain:
    """Seeded checkpoints over the whole domain (every string value, every temporal value)."""

    seed: int
    rng: random.Random = field(init=False)
    next_id: int = field(init=False, default=1)

    def __post_init__(self) -> None:
        self.rng = random.Random(self.seed)

    def _rows(self, partitions: list[tuple[Any, ...]]) -> list[tuple[Any, ...]]:
        rows = []
        for values in partitions:
            for _ in range(self.rng.randint(1, 2)):
                rows.append((self.next_id, *values))
                self.next_id += 1
        return rows

    def first(self, key: str) -> Checkpoint:
        """Every string value once, each with a temporal value (every temporal value used, in a
        seeded order); ``a``, ``a `` and `` a`` share one (so a replace that compares with PAD
        SPACE would take its neighbours); and the all-NULL partition."""
        temporal = list(TEMPORAL.values())
        self.rng.shuffle(temporal)
        shared = temporal[0]
        partitions = [(None, None), ("a", None)]
        for i, (name, value) in enumerate(STRINGS.items()):
            t = (
                shared
                if name in ("plain", "trailing space", "leading space")
                else temporal[i % len(temporal)]
            )
            partitions.append((value, t))
        return Checkpoint(key, self._rows(sorted(set(partitions), key=repr)))

    def replacing(self, key: str, previous: Checkpoint) -> Checkpoint:
        """A checkpoint over some of ``previous``'s partitions (always the NULL one, an escaped one
        and ``a``) and one new partition."""
        held = {row[1:] for row in previous.rows}
        must = [v for v in held if v[0] is None or v[0] == "a" or (v[0] or "").startswith(("k:v", "%41"))]
        rest = sorted(held - set(must), key=repr)
        chosen = must + self.rng.sample(rest, k=min(2, len(rest)))
        chosen.append(("new " + str(self.seed), dt.date(2027, 1, 1)))
        return Checkpoint(key, self._rows(sorted(set(chosen), key=repr)))

    def small(self, key: str) -> Checkpoint:
        """Two partitions: the all-NULL one and a seeded escaped one."""
        escaped = self.rng.choice([v for v in STRINGS.values() if v and spark_text(v) != v])
        return Checkpoint(
            key, self._rows([(None, None), (escaped, self.rng.choice(list(TEMPORAL.values())))])
        )


def overwrite(before: Counter, checkpoint: Checkpoint) -> Counter:
    """``before`` with the checkpoint's partitions replaced by its rows (partitions by held values)."""
    replaced = {tuple(expected(v) for v in r[1:]) for r in checkpoint.rows}
    kept = Counter({row: n for row, n in before.items() if tuple(row[1:]) not in replaced})
    return kept + checkpoint.expected()
