"""Assets and OpenLineage for the walsink operators (the Airflow faces; the core knows neither).

**Assets.** A commit task declares an :class:`~airflow.sdk.AssetAlias` named
``walsink-<pipeline>`` and adds an event for the target's
:class:`~airflow.sdk.Asset` to it **only when this try recorded COMMITTED**:
a re-run, a cleared task or a backfill re-run of a committed interval adds
none, so an asset-scheduled downstream DAG runs once per new commit. (A
concrete ``Asset`` in ``outlets`` would emit on every success, re-runs
included.) A try that recorded COMMITTED but never succeeded (killed, or its
success refused) delivered no event: its retry, finding the checkpoint
committed by an earlier try of the same task instance and no event of the
alias naming the attempt, adds it then (``WalCommitOperator``); when the
events cannot be read it adds none: a downstream run missed, never doubled.

**OpenLineage.** The operators answer the OpenLineage provider's
``get_openlineage_facets_on_complete``: the target as the output dataset
(with its row count), the job's declared inputs, and a ``walsink`` run facet
naming the checkpoint (pipeline, key, attempt, state, committables, rows); its
schema is ``docs/openlineage-facet.json``.
"""

from __future__ import annotations

import os
from typing import Any
from urllib.parse import urlsplit

import attr

from airflow_provider_walsink.core.targets.base import Publisher

ALIAS_PREFIX = "walsink-"

#: The ``walsink`` run facet's ``_schemaURL``: its JSON schema, shipped with walsink's docs
#: (``docs/openlineage-facet.json``). A reference relative to the walsink source tree: the
#: project has no public home to make it absolute (the URL it had named a repository that
#: does not exist).
FACET_SCHEMA_URL = "docs/openlineage-facet.json#/$defs/WalsinkCheckpointRunFacet"


def asset_alias_name(pipeline: str) -> str:
    return f"{ALIAS_PREFIX}{pipeline}"


def asset_name(pipeline: str) -> str:
    """The name of a pipeline's target asset: schedule on ``Asset.ref(name=asset_name(p))``."""
    return f"walsink/{pipeline}"


def target_uri(target: Any) -> str:
    """The target as a URI: a path becomes ``file://``; an object describes itself."""
    if isinstance(target, str):
        return f"file://{target}" if os.path.isabs(target) else target
    if isinstance(target, Publisher):
        return target.describe().split(" ", 1)[0]
    return repr(target)


def target_asset(pipeline: str, target: Any) -> Any:
    from airflow.sdk import Asset

    return Asset(name=asset_name(pipeline), uri=target_uri(target))


def dataset_of(uri: str) -> tuple[str, str]:
    """OpenLineage (namespace, name) of a target URI, following the spec's naming conventions."""
    parts = urlsplit(uri)
    scheme = parts.scheme.split("+")[-1] or "file"
    if scheme == "file":
        return "file", parts.path or uri
    if scheme in ("s3", "gs", "abfss", "hdfs"):
        return f"{scheme}://{parts.netloc}", parts.path.lstrip("/")
    return f"{scheme}://{parts.netloc}", parts.path.lstrip("/") or parts.netloc


try:  # the OpenLineage client ships with the provider (extra [openlineage])
    from openlineage.client.facet_v2 import RunFacet

    @attr.define
    class WalsinkCheckpointRunFacet(RunFacet):
        """The checkpoint a walsink task ran for."""

        pipeline: str
        checkpointKey: str  # noqa: N815 - OpenLineage facets use camelCase
        attempt: int | None = None
        attemptId: str | None = None  # noqa: N815
        state: str | None = None
        committables: int | None = None
        rows: int | None = None

        @staticmethod
        def _get_schema() -> str:
            return FACET_SCHEMA_URL
except ImportError:  # pragma: no cover
    WalsinkCheckpointRunFacet = None  # type: ignore[assignment,misc]


def operator_lineage(
    *,
    summary: dict[str, Any] | None,
    pipeline: str,
    checkpoint_key: str | None,
    output_uri: str | None,
    input_uris: list[str] | tuple[str, ...] = (),
) -> Any:
    """An ``OperatorLineage`` for the OpenLineage provider, or ``None`` without it."""
    try:
        from airflow.providers.openlineage.extractors import OperatorLineage
        from openlineage.client.event_v2 import InputDataset, OutputDataset
        from openlineage.client.facet_v2 import output_statistics_output_dataset
    except ImportError:
        return None
    summary = summary or {}
    outputs = []
    if output_uri:
        namespace, name = dataset_of(output_uri)
        facets = {}
        if summary.get("rows") is not None:
            facets["outputStatistics"] = output_statistics_output_dataset.OutputStatisticsOutputDatasetFacet(
                rowCount=summary["rows"], size=summary.get("bytes")
            )
        outputs.append(OutputDataset(namespace=namespace, name=name, outputFacets=facets))
    inputs = [InputDataset(namespace=dataset_of(u)[0], name=dataset_of(u)[1]) for u in input_uris]
    run_facets = {}
    if WalsinkCheckpointRunFacet is not None:
        run_facets["walsink"] = WalsinkCheckpointRunFacet(
            pipeline=pipeline,
            checkpointKey=summary.get("checkpoint_key") or checkpoint_key or "",
            attempt=summary.get("attempt"),
            attemptId=summary.get("attempt_id"),
            state=summary.get("state"),
            committables=summary.get("committables"),
            rows=summary.get("rows"),
        )
    return OperatorLineage(inputs=inputs, outputs=outputs, run_facets=run_facets)
