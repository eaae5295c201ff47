"""Sources a write job reads, planned once per checkpoint (contract: :class:`.base.Source`).

One line per source, ``name -> "module:Class"``, imported only when asked for: a source that
reads an Airflow connection is registered by its Airflow face under
``airflow_provider_walsink.hooks``, which the core never imports.
"""

from __future__ import annotations

from importlib import import_module

from airflow_provider_walsink.core.sources.base import FilesSource, Source

#: Source name -> ``"module:Class"``.
SOURCES: dict[str, str] = {
    "files": "airflow_provider_walsink.core.sources.base:FilesSource",
    "kafka": "airflow_provider_walsink.hooks.kafka:KafkaConnectionSource",
}


def source_class(name: str) -> type[Source]:
    """The source registered as ``name`` (imported now)."""
    try:
        path = SOURCES[name]
    except KeyError:
        raise ValueError(f"no source named {name!r}; known: {sorted(SOURCES)}") from None
    module, _, attr = path.partition(":")
    cls = getattr(import_module(module), attr)
    if not (isinstance(cls, type) and issubclass(cls, Source)):
        raise TypeError(f"{path} is not a Source")
    return cls


__all__ = ["SOURCES", "FilesSource", "Source", "source_class"]
