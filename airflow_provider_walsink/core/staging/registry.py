"""Which staging backend opens a root: by its URI scheme, one line per backend.

Modules load lazily (``module:Class``), as the targets' registry does, so a
backend's storage library is imported only when a root of its kind is opened.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit

_LOCAL = "airflow_provider_walsink.core.staging.object_store:LocalStagingStore"
_OBJECTS = "airflow_provider_walsink.core.staging.object_store:ObjectStagingStore"
_GCS = "airflow_provider_walsink.core.staging.gcs:GcsStagingStore"
_ADLS = "airflow_provider_walsink.core.staging.adls:AdlsStagingStore"

#: URI scheme -> backend. ``""`` is a plain path. A scheme not listed is an
#: object store reached through fsspec (:data:`FALLBACK`).
KNOWN_STAGING: dict[str, str] = {
    "": _LOCAL,
    "file": _LOCAL,
    "s3": _OBJECTS,
    "s3a": _OBJECTS,
    "gs": _GCS,
    "gcs": _GCS,
    "abfs": _ADLS,
    "abfss": _ADLS,
    "az": _ADLS,  # refused there, naming the abfss:// form
}
FALLBACK = _OBJECTS


def scheme_of(root: str | os.PathLike[str]) -> str:
    """A root's scheme as the registry keys it: ``""`` for a plain path."""
    text = os.fspath(root)
    return urlsplit(text).scheme.lower() if "://" in text else ""


def open_backend(root: str | os.PathLike[str], options: Mapping[str, Any] | None = None) -> Any:
    """The staging backend of ``root``, opened with ``options`` (a :class:`~.base.StagingBackend`)."""
    module_name, _, class_name = KNOWN_STAGING.get(scheme_of(root), FALLBACK).partition(":")
    cls = getattr(importlib.import_module(module_name), class_name)
    return cls.open_root(os.fspath(root), dict(options or {}))
