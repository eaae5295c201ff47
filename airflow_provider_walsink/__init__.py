"""walsink: exactly-once batch commit pipelines on Spark for Apache Airflow.

The package root holds only this module and ``get_provider_info``; everything else lives in a
folder named for its role (docs/architecture.md): the Airflow faces in ``hooks/``,
``operators/``, ``sensors/``, ``triggers/``, ``ui/`` and ``cli/``, the Airflow-free protocol in
``core/``.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys
import warnings

__version__ = "0.1.0"

#: Module paths of earlier releases that users' DAG and job files import, and where they live
#: now. Still importable for one release, with a DeprecationWarning naming the new path.
DEPRECATED_MODULES = {
    "airflow_provider_walsink.pipeline": "airflow_provider_walsink.operators.pipeline",
    "airflow_provider_walsink.spark": "airflow_provider_walsink.core.spark",
    "airflow_provider_walsink.publishers": "airflow_provider_walsink.core.targets",
}


class _DeprecatedModuleFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Serve an old module path (and its submodules) as the module at its new path."""

    def _new_name(self, fullname: str) -> str | None:
        for old, new in DEPRECATED_MODULES.items():
            if fullname == old or fullname.startswith(old + "."):
                return new + fullname[len(old) :]
        return None

    def find_spec(self, fullname, path=None, target=None):  # noqa: ARG002 - the finder protocol
        new = self._new_name(fullname)
        if new is None or importlib.util.find_spec(new) is None:
            return None
        return importlib.util.spec_from_loader(fullname, self, is_package=True)

    def create_module(self, spec):
        new = self._new_name(spec.name)
        warnings.warn(
            f"{spec.name} is deprecated and will be removed in the next release: import {new}",
            DeprecationWarning,
            stacklevel=3,
        )
        return importlib.import_module(new)

    def exec_module(self, module) -> None:  # already executed under its new name
        return None


if not any(isinstance(finder, _DeprecatedModuleFinder) for finder in sys.meta_path):
    sys.meta_path.append(_DeprecatedModuleFinder())
