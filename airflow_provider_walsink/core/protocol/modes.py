"""The protocol's enumerations, defined once: write mode, commit fencing, reprocess policy.

Each is a ``StrEnum``, so a plain string from a DAG file, a run's conf or a committer-table row
compares equal to its member; :meth:`parse` is the one place a value is checked, and its error
names the setting and the values it accepts, raised as the caller's own error type.
"""

from __future__ import annotations

import enum


class _Choice(enum.StrEnum):
    @classmethod
    def parse(cls, value: object, *, what: str | None = None, error: type[Exception] = ValueError):
        """The member named by ``value``; else ``error`` naming ``what`` and the accepted values."""
        try:
            return cls(value)
        except ValueError:
            accepted = ", ".join(repr(m.value) for m in cls)
            setting = what or _SETTINGS.get(cls.__name__, "value")
            raise error(f"{setting} must be one of {accepted}, got {value!r}") from None


class WriteMode(_Choice):
    """How a pipeline's checkpoints meet the target (DESIGN.md, invariant 5)."""

    #: Offsets advance only on commit, and checkpoints commit in checkpoint order.
    APPEND = "append"
    #: Each interval replaces its partitions; checkpoints commit independently.
    OVERWRITE = "overwrite"


class FencingMode(_Choice):
    """What fences a committer out once its lease is taken over (docs/protocol.md)."""

    #: A lease in the committer table, its epoch checked before every side effect.
    LEASE = "lease"
    #: The target's own atomic commit (Iceberg, Delta), one committer-table transaction a commit.
    TABLE = "table"


class Reprocess(_Choice):
    """What a re-run of a COMMITTED checkpoint does (docs/backfill.md)."""

    #: Nothing is rewritten; the tasks end skipped.
    SKIP = "skip"
    #: A new version supersedes the committed one.
    REPLACE = "replace"


_SETTINGS = {"WriteMode": "mode", "FencingMode": "fencing", "Reprocess": "reprocess"}

#: The key of a run's conf that sets its reprocess policy (``{"walsink_reprocess": "replace"}``).
REPROCESS_CONF_KEY = "walsink_reprocess"

#: The accepted values, as tuples, for messages and argument choices.
WRITE_MODES = tuple(m.value for m in WriteMode)
FENCING_MODES = tuple(m.value for m in FencingMode)
REPROCESS_POLICIES = tuple(m.value for m in Reprocess)
