"""Sources a write job reads, planned once per checkpoint (contract: :class:`.base.Source`).

One line per source, ``name -> "module:Class"``, imported only when asked for: a source that
reads an Airflow connection is registered by its Airflow face under
``airflow_provider_walsink.hooks``, which the core never imports.
"""

from __future__ import annotations

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


__all__ = ["SOURCES", "FilesSource", "Source", "source_class"]
