"""An abort's tombstone in an Iceberg table, for :class:`.IcebergPublisher` (a mixin: it uses the
publisher's ``load_table``, ``_create``, ``storage``, ``create_table`` and ``identifier``)."""

from __future__ import annotations

import json
import logging
import time
from typing import Any

from pyiceberg.exceptions import CommitFailedException, ValidationException

from airflow_provider_walsink.core.protocol.manifest import Manifest
from airflow_provider_walsink.core.targets._tables import (
    CheckpointRef,
    TableCommitConflict,
    staged_locations,
    staging_storage,
)
from airflow_provider_walsink.core.targets.base import StagedAttempt, conflict_backoff
from airflow_provider_walsink.core.targets.iceberg.commit import MAX_COMMIT_ATTEMPTS, without_library_retries
from airflow_provider_walsink.core.targets.iceberg.files import IcebergTargetError
from airflow_provider_walsink.core.targets.iceberg.markers import ABORTED_PREFIX, aborted_of, marker_of
from airflow_provider_walsink.core.targets.iceberg.outcome import describe, unknown_outcome_errors

log = logging.getLogger("airflow_provider_walsink.core.targets.iceberg")


class IcebergTombstone:
    """:meth:`tombstone` for :class:`.IcebergPublisher`."""

    identifier: str
    create_table: bool
    storage: Any
    _props: Any

    def tombstone(
        self,
        ref: CheckpointRef,
        attempt_ids: frozenset[str],
        *,
        superseded: str | None = None,
        create_from: tuple[Manifest, StagedAttempt | str] | None = None,
    ) -> str | None:
        """Commit an abort's tombstone for ``attempt_ids``, or return the attempt that makes it refuse.

        One snapshot with no data file (so the branch head moves, and a
        committer whose commit is based on the state before it fails the
        catalog's compare-and-swap and checks again) that adds the ids to the
        ``walsink.aborted.<pipeline>/<key>`` property. The marker is checked in
        the metadata the commit is based on: if the table holds *any* attempt
        of the checkpoint but ``superseded`` (the committed version a
        reprocess replaces), nothing is written and that attempt's id is
        returned (the checkpoint is published). Ids the table holds or held are never
        tombstoned. A missing table is created from ``create_from`` (a sealed
        manifest and its attempt: a local directory, or a :class:`StagedAttempt` on any store) when the target may create it;
        otherwise :class:`IcebergTargetError`.
        """
        for attempt in range(MAX_COMMIT_ATTEMPTS):
            table = self.load_table()
            if table is None:
                if create_from is None or not self.create_table:
                    raise IcebergTargetError(
                        f"Iceberg table {self.identifier} does not exist, so it cannot carry the abort's "
                        f"tombstone for {ref.pipeline}/{ref.checkpoint_key}; create it (or set create_table) "
                        "and abort again"
                    )
                manifest, attempt_dir = create_from
                _, created_from = staged_locations(attempt_dir, manifest, uri=True)
                footers = staging_storage(self.storage, attempt_dir).footers(
                    [(loc, c.size) for loc, c in zip(created_from, manifest.committables, strict=True)]
                )
                table = self._create(manifest, footers)
            view = self._props(table)
            marker = marker_of(view, ref)
            if marker is not None and marker.attempt_id != superseded:
                return marker.attempt_id
            known = {marker.attempt_id, *marker.previous} if marker else set()
            already = aborted_of(view, ref)
            new = set(attempt_ids) - known - already
            if not new:
                return None
            tx = without_library_retries(table).transaction()
            summary = {
                "walsink.pipeline": ref.pipeline,
                "walsink.checkpoint": ref.checkpoint_key,
                "walsink.aborted": ",".join(sorted(new)),
            }
            with tx.update_snapshot(snapshot_properties=summary).fast_append():
                pass  # no data file: the snapshot moves the head, the property carries the tombstone
            tx.set_properties(
                {f"{ABORTED_PREFIX}{ref.pipeline}/{ref.checkpoint_key}": json.dumps(sorted(already | new))}
            )
            try:
                tx.commit_transaction()
            except unknown_outcome_errors() as e:
                # The tombstone may have landed: the next load reads the aborted ids and decides.
                log.warning(
                    "Iceberg tombstone of %s/%s: the catalog did not report the outcome (%s); checking again",
                    ref.pipeline,
                    ref.checkpoint_key,
                    describe(e),
                )
                time.sleep(conflict_backoff(attempt))
                continue
            except (CommitFailedException, ValidationException) as e:
                log.info(
                    "Iceberg tombstone of %s/%s conflicted (%s); checking again",
                    ref.pipeline,
                    ref.checkpoint_key,
                    e,
                )
                continue
            return None
        raise TableCommitConflict(
            f"Iceberg table {self.identifier} changed under each of {MAX_COMMIT_ATTEMPTS} tombstone commits of "
            f"{ref.pipeline}/{ref.checkpoint_key}; nothing was written, abort again"
        )
