"""``walsink reassign`` / ``walsink reassign-group``: hand a pipeline to another DAG, a Kafka
consumer group to another pipeline.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import IO, Any

from airflow_provider_walsink.cli.common import _dump, _iso, _known_pipelines
from airflow_provider_walsink.cli.database import CliError, open_store, resolve


def cmd_reassign(args: argparse.Namespace, out: IO[str]) -> int:
    """Hand a pipeline over to another DAG (the owner was renamed): the old DAG id is refused after."""
    target = resolve(args)
    with open_store(target) as store:
        _known_pipelines(store, [args.pipeline])
        previous = store.reassign_pipeline(args.pipeline, args.dag)
    if args.json:
        _dump(out, {"pipeline": args.pipeline, "dag_id": args.dag, "previous_dag_id": previous})
    else:
        print(f"pipeline {args.pipeline} belongs to DAG {args.dag} (was {previous or 'no DAG'})", file=out)
    return 0


def _group_cluster(groups: Sequence[dict[str, Any]], group_id: str, cluster: str | None) -> dict[str, Any]:
    """The recorded claim of ``group_id`` on ``cluster`` (as recorded, or a bare cluster id), or on
    the one cluster it is recorded on; a :class:`CliError` naming the recorded clusters otherwise."""
    clusters = ", ".join(g["cluster"] for g in groups) or "none"
    if not groups:
        raise CliError(
            f"no pipeline holds Kafka consumer group {group_id!r} (a pipeline claims its group at its first "
            "write task)"
        )
    if cluster is None:
        if len(groups) > 1:
            raise CliError(
                f"consumer group {group_id!r} is recorded on several clusters ({clusters}): pass --cluster"
            )
        return groups[0]
    for g in groups:
        if cluster in (g["cluster"], f"cluster:{g['cluster']}") or g["cluster"] == f"cluster:{cluster}":
            return g
    raise CliError(
        f"consumer group {group_id!r} is not recorded on cluster {cluster!r} (it is on: {clusters})"
    )


def cmd_reassign_group(args: argparse.Namespace, out: IO[str]) -> int:
    """Hand a Kafka consumer group over to another pipeline (or list who holds it)."""
    from airflow_provider_walsink.core.protocol.identifiers import validate_identifier

    if not args.list and not args.pipeline:
        raise CliError("pass --pipeline NEW (the pipeline that takes the group over), or --list")
    if args.pipeline:
        validate_identifier(args.pipeline, "pipeline id")
    target = resolve(args)
    with open_store(target) as store:
        groups = store.consumer_groups(args.group)
        if args.list:
            rows = [{**g, "claimed_at": _iso(g["claimed_at"])} for g in groups]
            if args.json:
                _dump(out, rows)
            else:
                for g in rows:
                    print(
                        f"{g['group_id']} on {g['cluster']}: pipeline {g['pipeline']} (since {g['claimed_at']})",
                        file=out,
                    )
            return 0
        found = _group_cluster(groups, args.group, args.cluster)
        previous = store.reassign_consumer_group(found["cluster"], args.group, args.pipeline)
        registered = store.get_pipeline(args.pipeline) is not None
    if args.json:
        _dump(out, {"group_id": args.group, "cluster": found["cluster"], "pipeline": args.pipeline,
                    "previous_pipeline": previous, "registered": registered})  # fmt: skip
    else:
        note = (
            ""
            if registered
            else f" (pipeline {args.pipeline} is not registered yet: its first write task plans with the group)"
        )
        print(f"consumer group {args.group} on {found['cluster']} belongs to pipeline {args.pipeline} "
              f"(was {previous}){note}", file=out)  # fmt: skip
    return 0
