"""Spellings of the last release, accepted for one more with a DeprecationWarning naming the new one."""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from typing import Any

#: Source spellings of the last release -> (the source kind they name, the key of ``source=``
#: their value becomes; ``None``: the value is the source's own settings).
DEPRECATED_SOURCE_ARGUMENTS: dict[str, tuple[str, str | None]] = {
    "kafka_source": ("kafka", None),
    "kafka_conn_id": ("kafka", "conn_id"),
}


def warn_deprecated(owner: str, old: str, new: str, stacklevel: int = 2) -> None:
    """Warn that ``owner(old=...)`` is now spelled ``new`` (at the frame ``stacklevel`` above the caller)."""
    warnings.warn(
        f"{owner}({old}=...) is deprecated and will be removed in the next release: use {new}",
        DeprecationWarning,
        stacklevel=stacklevel + 1,
    )


def source_argument(owner: str, source: Any, kwargs: dict[str, Any]) -> Any:
    """``source``, or the ``source=`` the old spellings in ``kwargs`` give (taken out of it):
    ``kafka_source=S, kafka_conn_id=C`` is ``source={"kind": "kafka", "conn_id": C, **S}``."""
    settings: dict[str, Any] = {}
    for old in [name for name in kwargs if name in DEPRECATED_SOURCE_ARGUMENTS]:
        kind, key = DEPRECATED_SOURCE_ARGUMENTS[old]
        value = kwargs.pop(old)
        setting = "..." if key is None else f"{key!r}: ..."
        warn_deprecated(owner, old, f"source={{'kind': {kind!r}, {setting}}}", stacklevel=3)
        if key is not None:
            settings.setdefault(key, value)
        elif value is not None:  # a spec object gives its settings (as it travels to the job)
            settings.update(kind=kind, **(value if isinstance(value, Mapping) else value.to_dict()))
    if "kind" not in settings:  # no old source given (an old connection alone named none)
        return source
    if source is not None:
        raise ValueError(f"{owner}: give the source once, as source=...")
    return settings
