"""One Iceberg commit of walsink's: a snapshot and its marker in one transaction, pyiceberg's own retries off.

The retry loops around it (:mod:`.publisher`, :mod:`.group`, :mod:`.tombstone`) re-check the
marker on every reload; here is only what one try sends to the catalog.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pyiceberg.manifest import DataFile
from pyiceberg.table import Table, TableProperties

from airflow_provider_walsink.core.protocol.manifest import Manifest
from airflow_provider_walsink.core.targets._tables import Marker
from airflow_provider_walsink.core.targets.archive import WalsinkProperties
from airflow_provider_walsink.core.targets.iceberg.markers import marker_properties
from airflow_provider_walsink.core.targets.iceberg.outcome import UnknownCommitOutcome, unknown_outcome_errors

#: Check + commit attempts before giving up on a table that keeps changing.
MAX_COMMIT_ATTEMPTS = 20
#: Check + commit attempts of one group before giving up on a table that keeps changing.
GROUP_COMMIT_ATTEMPTS = 40


def without_library_retries(table: Table) -> Table:
    """``table`` with pyiceberg's own commit retries off: a conflict must come back to walsink,
    which re-checks its marker and fence on the new state before it tries again."""
    return Table(
        table._identifier,
        table.metadata.model_copy(
            update={"properties": {**table.metadata.properties, TableProperties.COMMIT_NUM_RETRIES: "0"}}
        ),
        table.metadata_location,
        table.io,
        table.catalog,
    )


def commit_snapshot(
    table: Table,
    manifest: Manifest,
    epoch: int,
    marker: Marker | None,
    data_files: list[DataFile],
    deletes: list[DataFile],
    replaced: Sequence[str] = (),
    *,
    props: WalsinkProperties | None = None,
    keep: tuple[int, int] | None = None,
) -> int:
    """One transaction, library retries off: snapshot + marker (+ the holder of each replaced
    partition, + the pipeline's oldest markers archived once it has more than ``keep[0]``:
    :func:`set_walsink_properties`), or ``CommitFailedException``."""
    tx = without_library_retries(table).transaction()
    summary = {
        "walsink.pipeline": manifest.pipeline,
        "walsink.checkpoint": manifest.checkpoint_key,
        "walsink.sequence": str(manifest.sequence),
        "walsink.attempt-id": manifest.attempt_id,
        "walsink.epoch": str(epoch),
    }
    update = tx.update_snapshot(snapshot_properties=summary)
    producer = update.overwrite() if deletes else update.fast_append()
    if deletes:
        one_manifest_evaluator_per_manifest(producer)
    with producer:
        for df in deletes:
            producer.delete_data_file(df)
        for df in data_files:
            producer.append_data_file(df)
    marker_props = marker_properties(
        manifest, epoch, str(producer.snapshot_id), marker, len(data_files), replaced
    )
    set_walsink_properties(tx, table, marker_props, props, keep, [manifest.pipeline])
    try:
        tx.commit_transaction()
    except unknown_outcome_errors() as exc:
        raise UnknownCommitOutcome(exc, producer.snapshot_id) from exc
    return producer.snapshot_id


def set_walsink_properties(
    tx: Any,
    table: Table,
    setting: dict[str, str],
    props: WalsinkProperties | None,
    keep: tuple[int, int] | None,
    pipelines: Sequence[str],
) -> None:
    """Set a commit's markers and holders in its transaction and, per pipeline past ``keep``,
    archive the oldest (:meth:`~..archive.WalsinkProperties.archiving`: the previous batch is
    copied into the committer database first)."""
    setting = dict(setting)
    removing: list[str] = []
    if props is not None and keep is not None:
        for pipeline in dict.fromkeys(pipelines):
            archived, removed = props.archiving(pipeline, setting, keep=keep[0], batch=keep[1])
            setting.update(archived)
            removing += removed
    if table.metadata.name_mapping() is None:
        # Staged files carry no Iceberg field ids: readers map their columns by name.
        setting[TableProperties.DEFAULT_NAME_MAPPING] = table.schema().name_mapping.model_dump_json()
    tx.set_properties(setting)
    if removing:
        tx.remove_properties(*removing)


def one_manifest_evaluator_per_manifest(producer: Any) -> None:
    """Work around a race in pyiceberg's overwrite (0.12): give each manifest its own evaluator.

    To find the files to delete, the producer evaluates the parent snapshot's
    manifests in a thread pool with one shared evaluator per partition spec,
    and that evaluator keeps the manifest being evaluated in an attribute: two
    threads interleaving make it judge one manifest by another's partition
    bounds, skip files it must delete, and fail the commit with "Missing
    required files to delete" (safe, nothing committed, but a failed publish).
    Without the private hook this does nothing, and the conflict retry in
    :meth:`.IcebergPublisher.publish` still recovers.
    """
    build = getattr(producer, "_build_manifest_evaluator", None)
    if build is None:
        return
    producer._build_manifest_evaluator = lambda spec_id: lambda manifest: build(spec_id)(manifest)
