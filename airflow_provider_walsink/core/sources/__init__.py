"""Sources a write job reads, planned once per checkpoint (contract: :class:`.base.Source`).

One line per source, ``name -> "module:Class"``, imported only when asked for: a source that
reads an Airflow connection is registered by its Airflow face under
``airflow_provider_walsink.hooks``, which the core never imports. A pipeline names its source
by kind (:func:`source_from`), so a new source changes no operator.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from airflow_provider_walsink.core.registry import load_registered
from airflow_provider_walsink.core.sources.base import FilesSource, Source

#: Source name -> ``"module:Class"``.
SOURCES: dict[str, str] = {
    "files": "airflow_provider_walsink.core.sources.base:FilesSource",
    "kafka": "airflow_provider_walsink.hooks.kafka:KafkaConnectionSource",
}


def source_class(name: str) -> type[Source]:
    """The source registered as ``name`` (imported now)."""
    return load_registered(SOURCES, name, Source, "source")


def source_from(source: Source | Mapping[str, Any] | None) -> Source:
    """A pipeline's ``source=`` argument as a :class:`Source`: ``None`` (``files``: the job finds
    its own input), a :class:`Source` (used as given), or ``{"kind": <a name in SOURCES>,
    "conn_id": <its connection, if it reads one>, **<its own settings>}``."""
    if isinstance(source, Source):
        return source
    settings = dict(source if source is not None else {"kind": "files"})
    if "kind" not in settings:
        raise ValueError(f"source={settings!r} names no kind (one of {sorted(SOURCES)}): add 'kind': ...")
    cls = source_class(settings.pop("kind"))
    conn_id = settings.pop("conn_id", None)
    conn = {} if conn_id is None else {"conn_id": conn_id}
    return cls(settings, **conn) if settings or conn else cls()  # type: ignore[call-arg]


__all__ = ["SOURCES", "FilesSource", "Source", "source_class", "source_from"]
