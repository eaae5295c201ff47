"""An abort's tombstone in a Delta table, for :class:`.DeltaPublisher` (a mixin: it uses the
publisher's table access).
"""

from __future__ import annotations

import logging
from typing import Any

from deltalake import CommitProperties, Transaction
from deltalake.exceptions import CommitFailedError

from airflow_provider_walsink.core.protocol.manifest import Manifest
from airflow_provider_walsink.core.targets._tables import (
    CheckpointRef,
    TableCommitConflict,
    staged_locations,
    staging_storage,
)
from airflow_provider_walsink.core.targets.base import (
    StagedAttempt,
)
from airflow_provider_walsink.core.targets.delta.actions import DeltaTargetError
from airflow_provider_walsink.core.targets.delta.log import (
    ABORTED_TXN,
    MAX_COMMIT_ATTEMPTS,
    app_id,
    append_commit,
    now_ms,
)

# The target's one logger (its name is what users filter on).
log = logging.getLogger("airflow_provider_walsink.core.targets.delta")


class DeltaTombstone:
    """:meth:`tombstone` for :class:`.DeltaPublisher`."""

    table_uri: str
    storage: Any
    create_table: bool

    def tombstone(
        self,
        ref: CheckpointRef,
        attempt_ids: frozenset[str],
        *,
        superseded: str | None = None,
        create_from: tuple[Manifest, StagedAttempt | str] | None = None,
    ) -> str | None:
        """Commit an abort's tombstone for ``attempt_ids``, or return the attempt that makes it refuse.

        One table version with no data action carrying, for each attempt id,
        the application transaction ``walsink/<pipeline>/<key>/<attempt id>``
        at version :data:`ABORTED_TXN`: the same app id a publish of that
        attempt carries, so whichever of the two commits second is refused by
        the log's conflict check and checks the table again. If the table
        holds *any* attempt of the checkpoint but ``superseded`` (the committed
        version a reprocess replaces; checked in the version the commit is
        based on), nothing is written and that attempt's id is returned. Ids the table holds or
        held are never tombstoned. A missing table is created (with the
        tombstone in the commit after its empty first version) from ``create_from`` (a sealed manifest
        and its attempt: a local directory, or a :class:`StagedAttempt` on any store) when the target
        may create it; otherwise :class:`DeltaTargetError`.
        """
        for _ in range(MAX_COMMIT_ATTEMPTS):
            dt = self.load_table()
            candidates = sorted(attempt_ids | ({superseded} if superseded else set()))
            if dt is not None:
                marker = self.marker_of(dt, ref, need_id=True, candidates=tuple(candidates))  # type: ignore[arg-type]
                if marker is not None and marker.attempt_id != superseded:
                    return marker.attempt_id
                new = {a for a in attempt_ids if dt.transaction_version(app_id(ref, a)) is None}
            else:
                new = set(attempt_ids)
            if not new:
                return None
            commit = CommitProperties(
                custom_metadata={
                    "walsink.pipeline": ref.pipeline,
                    "walsink.checkpoint": ref.checkpoint_key,
                    "walsink.aborted": ",".join(sorted(new)),
                },
                app_transactions=[Transaction(app_id(ref, a), ABORTED_TXN, now_ms()) for a in sorted(new)],
            )
            try:
                if dt is None:
                    if create_from is None or not self.create_table:
                        raise DeltaTargetError(
                            f"Delta table {self.table_uri} does not exist, so it cannot carry the abort's "
                            f"tombstone for {ref.pipeline}/{ref.checkpoint_key}; create it (or set create_table) "
                            "and abort again"
                        )
                    manifest, attempt_dir = create_from
                    base, locations = staged_locations(attempt_dir, manifest)
                    staged = staging_storage(self.storage, attempt_dir).describe(manifest, locations)
                    _, schema, partition_by = self._adds_for_new_table(manifest, base, staged)
                    self._create_empty(schema, partition_by)
                    continue  # the tombstone goes in a normal (put-if-absent) commit on the new table
                append_commit(dt, [], commit)
            except CommitFailedError as e:
                log.info(
                    "Delta tombstone of %s/%s conflicted (%s); checking again",
                    ref.pipeline,
                    ref.checkpoint_key,
                    e,
                )
                continue
            return None
        raise TableCommitConflict(
            f"Delta table {self.table_uri} changed under each of {MAX_COMMIT_ATTEMPTS} tombstone commits of "
            f"{ref.pipeline}/{ref.checkpoint_key}; nothing was written, abort again"
        )
