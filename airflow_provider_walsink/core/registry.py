"""One lookup for the registries of sources and job runners: ``name -> "module:Class"``.

Implementations are imported only when used (a missing optional library costs nothing until
then), and must subclass the contract they are registered under.
"""

from __future__ import annotations

from collections.abc import Mapping
from importlib import import_module
from typing import TypeVar

T = TypeVar("T")


def load_registered(registry: Mapping[str, str], name: str, contract: type[T], what: str) -> type[T]:
    """The class registered as ``name`` (imported now); ``ValueError`` names the known ones."""
    try:
        path = registry[name]
    except KeyError:
        raise ValueError(f"no {what} named {name!r}; known: {sorted(registry)}") from None
    module, _, attr = path.partition(":")
    cls = getattr(import_module(module), attr)
    if not (isinstance(cls, type) and issubclass(cls, contract)):
        raise TypeError(f"{path} is not a {contract.__name__}")
    return cls
