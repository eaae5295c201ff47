"""Bounded table metadata (issue 45): a pipeline's oldest markers and partition holders archived
into the committer database behind the table's hash chain (``core/targets/archive.py``), in an
Iceberg table (its properties) and in a Delta table (its application transactions, expired by
walsink's own retention: ``core/targets/delta/markers.py``).

Iceberg on pyiceberg's SQL catalog, local warehouse; Delta on a local table; the committer
database is the session's SQLite store. What is proven, for each:

* the table keeps a bounded number of markers and holders per pipeline, however many
  checkpoints were committed, and every old checkpoint is still recognised;
* the same history decides every commit alike, archived or not (a differential run);
* a committer database that is lost, restored from an older backup, another table's, or not
  given refuses the commit, naming both sides, and publishes nothing; one behind by just the
  batch the table carries catches up from the table.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass

import pytest
from sqlalchemy import delete, func, select, update

from airflow_provider_walsink.core.protocol.errors import (
    CommittableError,
    FencedError,
    TargetStateError,
)
from airflow_provider_walsink.core.store.models import table_archive_table
from airflow_provider_walsink.core.targets._tables import HeldByAnotherAttemptError
from airflow_provider_walsink.core.targets.archive import ARCHIVE_PREFIX, ArchiveMismatchError
from airflow_provider_walsink.core.targets.base import PublishOutcome, StaticContext
from tests.table_fixtures import Place, ctx, stage_attempt

pytest.importorskip("pyiceberg")
pytest.importorskip("deltalake")


@dataclass
class TableFenced(StaticContext):
    """A publish with table fencing (no lease: the table's commit is the only fence)."""

    fencing: str = "table"


KEEP = 8  # Iceberg: markers and holders a pipeline keeps in the table; batch: KEEP // 4 = 2
#: Delta: application transactions a pipeline keeps (three per checkpoint in append); batch 3.
DELTA_KEEP = 12
KINDS = ["iceberg", "delta"]


class Table:
    """One table, published into with or without an archive (:class:`IcebergTable`, :class:`DeltaLakeTable`)."""

    kind: str

    def __init__(self, tmp_path, store=None, keep: int | None = None, mode: str = "append"):
        tmp_path.mkdir(parents=True, exist_ok=True)
        self.tmp_path = tmp_path
        self.place = Place("local", str(tmp_path / "tables"))
        self.store, self.mode = store, mode
        self.keep = keep if keep is not None else self.default_keep

    def stage(self, key, rows, **kwargs):
        return stage_attempt(self.place, self.publisher().staging_root(), "events", key, rows, **kwargs)

    def publish(self, key, rows, epoch=1, fencing="lease", **kwargs):
        staged = kwargs.pop("staged", None) or self.stage(key, rows)
        manifest, attempt_dir = staged
        context = (TableFenced.for_manifest if fencing == "table" else ctx)(manifest, epoch=epoch, **kwargs)
        return self.publisher().publish(manifest, attempt_dir, context), staged

    def state(self) -> tuple:
        return self.version(), self.rows()


class IcebergTable(Table):
    kind, default_keep = "iceberg", KEEP

    def __init__(self, tmp_path, store=None, keep: int | None = None, mode: str = "append"):
        super().__init__(tmp_path, store, keep, mode)
        self.props = {
            "type": "sql",
            "uri": f"sqlite:///{tmp_path}/catalog.db",
            "warehouse": self.place.uri("warehouse"),
        }
        self.identifier = f"ns.events_{uuid.uuid4().hex[:6]}"
        self.where = f"Iceberg table {self.identifier}"

    def publisher(self, **kwargs):
        from airflow_provider_walsink.core.targets.iceberg import IcebergPublisher

        kwargs.setdefault("property_archive", self.store)
        return IcebergPublisher(
            self.identifier,
            self.mode,
            catalog_properties=self.props,
            partition_by=["dt"],
            create_table=True,
            table_markers=self.keep,
            **kwargs,
        )

    def properties(self) -> dict[str, str]:
        return dict(self.publisher().load_table().metadata.properties)

    def counts(self) -> tuple[int, int]:
        """How many markers and partition holders of the pipeline the table holds."""
        props = self.properties()
        markers = sum(1 for n in props if n.startswith("walsink.marker.events/"))
        holders = sum(1 for n in props if n.startswith("walsink.partition.events/"))
        return markers, holders

    def bound(self) -> int:
        return self.keep

    def archive_state(self) -> dict:
        return json.loads(self.properties()[ARCHIVE_PREFIX + "events"])

    def rows(self) -> list[tuple]:
        table = self.publisher().load_table()
        return sorted((r["dt"], r["id"], r["name"]) for r in table.scan().to_arrow().to_pylist())

    def version(self):
        return self.publisher().load_table().metadata.current_snapshot_id

    def table_uuid(self) -> str:
        return str(self.publisher().load_table().metadata.table_uuid)


class DeltaLakeTable(Table):
    kind, default_keep = "delta", DELTA_KEEP

    def __init__(self, tmp_path, store=None, keep: int | None = None, mode: str = "append"):
        super().__init__(tmp_path, store, keep, mode)
        self.uri = self.place.uri(f"events_{uuid.uuid4().hex[:6]}")
        self.where = f"Delta table {self.uri}"

    def publisher(self, **kwargs):
        from airflow_provider_walsink.core.targets.delta import DeltaPublisher

        kwargs.setdefault("property_archive", self.store)
        return DeltaPublisher(
            self.uri, self.mode, partition_by=["dt"], create_table=True, table_markers=self.keep, **kwargs
        )

    def live(self) -> list[str]:
        """The pipeline's walsink application transactions the table holds (as any reader loads it)."""
        import deltalake

        from airflow_provider_walsink.core.targets.delta.markers import live_transactions, pipeline_of

        dt = deltalake.DeltaTable(self.uri)
        listed = live_transactions(self.place.storage, self.uri, dt)
        return [a for a in listed if pipeline_of(a) == "events" and dt.transaction_version(a) is not None]

    def counts(self) -> tuple[int, int]:
        live = self.live()
        holders = sum(1 for a in live if a.startswith("walsink-partition/"))
        return len(live) - holders, holders

    def bound(self) -> int:
        # Archived once in ``batch`` versions, down to keep - batch (or what that commit sets, up to
        # five: three, and two per partition an overwrite replaces), then batch - 1 commits above.
        batch = max(1, self.keep // 4)
        return max(self.keep - batch, 5) + 5 * (batch - 1)

    def archive_state(self) -> dict:
        from airflow_provider_walsink.core.targets.delta.markers import ARCHIVE_INFO

        dt = self.publisher().load_table()
        at = dt.transaction_version("walsink-archive/events/at")
        for line in (
            self.tmp_path / "tables" / self.uri.rsplit("/", 1)[1] / "_delta_log" / f"{at:020d}.json"
        ).open():
            info = json.loads(line).get("commitInfo")
            if info:
                return json.loads(info[ARCHIVE_INFO + "events"])
        raise AssertionError("no commitInfo")

    def rows(self) -> list[tuple]:
        import deltalake

        rows = deltalake.DeltaTable(self.uri).to_pyarrow_table().to_pylist()
        return sorted((r["dt"], r["id"], r["name"]) for r in rows)

    def version(self):
        import deltalake

        return deltalake.DeltaTable(self.uri).version()

    def table_uuid(self) -> str:
        return str(self.publisher().load_table().metadata().id)


def make_table(kind: str, *args, **kwargs) -> Table:
    return (IcebergTable if kind == "iceberg" else DeltaLakeTable)(*args, **kwargs)


def archived_rows(store) -> int:
    with store.engine.connect() as conn:
        return conn.execute(select(func.count()).select_from(table_archive_table)).scalar_one()


def key(i: int) -> str:
    return f"2026-01-{i:02d}"


@pytest.mark.parametrize("kind", KINDS)
def test_a_pipelines_markers_stay_bounded_and_every_old_checkpoint_is_still_recognised(
    tmp_path, sqlite_store, kind
):
    table = make_table(kind, tmp_path, sqlite_store)
    staged = {}
    for i in range(1, 25):
        result, staged[i] = table.publish(key(i), [(key(i), i, "a")])
        assert result.outcome is PublishOutcome.PUBLISHED
        held = sum(table.counts())
        assert held <= table.bound(), f"after {i} checkpoints the table holds {held} markers"
    per_checkpoint = 1 if kind == "iceberg" else 3  # Delta: the checkpoint's, the attempt's, its file count
    state = table.archive_state()
    assert state["count"] >= 24 * per_checkpoint - table.bound()
    # In the database: all of them, but (Iceberg) the batch the table carries until it is read.
    assert state["count"] - len(state["batch"]) <= archived_rows(sqlite_store) <= state["count"]
    expected = sorted((key(i), i, "a") for i in range(1, 25))
    assert table.rows() == expected

    # Every checkpoint run again with its committer rows gone (a new lease at epoch 0): recognised,
    # from the table's own markers, the batch it carries, or the archive.
    for i in range(1, 25):
        manifest, attempt_dir = staged[i]
        again = table.publisher().publish(manifest, attempt_dir, ctx(manifest, epoch=0))
        assert again.outcome is PublishOutcome.ALREADY_PUBLISHED, key(i)
        assert table.publisher().published_attempt(manifest) == manifest.attempt_id
    assert table.rows() == expected

    # Another attempt of the oldest, archived checkpoint is judged on its archived marker: refused
    # in append under the lease (epoch below the marker's: fenced; above: rows would be retracted)
    # and with table fencing (the first publication of a version wins).
    other = table.stage(key(1), [(key(1), 100, "x")], attempt=2)
    with pytest.raises(FencedError):
        table.publish(key(1), None, epoch=0, staged=other)
    with pytest.raises(CommittableError, match="already holds attempt"):
        table.publish(key(1), None, epoch=5, staged=other)
    with pytest.raises(HeldByAnotherAttemptError) as held:
        table.publish(key(1), None, epoch=5, staged=other, fencing="table")
    # Delta names the holder's id only when it looks it up in the log's history (not in a publish).
    assert held.value.held == (staged[1][0].attempt_id if kind == "iceberg" else "another attempt")
    assert table.rows() == expected


def _history(table: Table) -> list[str]:
    """One history of commits, re-runs and refusals; what each step ended in."""
    said = []

    def step(what, fn):
        try:
            result = fn()
            said.append(f"{what}: {result.outcome.value} {result.published} {result.files_rolled_back}")
        except Exception as exc:  # noqa: BLE001 - the outcome compared is the error's kind
            said.append(f"{what}: {type(exc).__name__}")

    staged = {}
    for i in range(1, 13):
        staged[i] = table.stage(key(i), [(key(i), i, "a"), (key(i), 100 + i, "b")])
        step(f"commit {i}", lambda i=i: table.publish(key(i), None, staged=staged[i])[0])
    for i in (1, 2, 6, 12):
        m, d = staged[i]
        step(f"re-run {i}", lambda m=m, d=d: table.publisher().publish(m, d, ctx(m, epoch=0)))
    for i in (1, 11):
        m, _ = staged[i]
        new = table.stage(key(i), [(key(i), 500 + i, "v2")], attempt=2)
        step(
            f"reprocess {i}",
            lambda i=i, m=m, new=new: table.publish(
                key(i), None, epoch=3, staged=new, supersedes=m.attempt_id
            )[0],
        )
    # A late, older checkpoint writing into a partition a newer one holds (invariant 10 in overwrite).
    late = table.stage("2025-12-31", [(key(3), 900, "late")])
    step("late older key", lambda: table.publish("2025-12-31", None, staged=late)[0])
    stray = table.stage(key(2), [(key(2), 700, "stray")], attempt=3)
    step("stray attempt", lambda: table.publish(key(2), None, epoch=4, staged=stray)[0])
    said.append(f"rows {table.rows()}")
    return said


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("mode", ["append", "overwrite"])
def test_the_same_history_decides_every_commit_alike_archived_or_not(tmp_path, sqlite_store, mode, kind):
    archived = make_table(kind, tmp_path / "archived", sqlite_store, keep=4, mode=mode)
    kept = make_table(kind, tmp_path / "kept", None, keep=10_000, mode=mode)
    got, want = _history(archived), _history(kept)
    assert got == want
    markers, holders = archived.counts()
    if kind == "iceberg":
        assert markers <= 4 and holders <= 4
    else:  # once in each version (batch 1): down to what the last commit set, five at most
        assert markers + holders <= 5
    assert archived_rows(sqlite_store) > 0
    # The history reaches what the markers and holders decide (read from the archive for the
    # oldest keys): re-runs recognised, stray attempts refused (append) or replacing (overwrite),
    # a late older key refused by the holder of its partition (overwrite).
    assert "re-run 1: ALREADY_PUBLISHED 0 0" in want
    if mode == "append":
        assert "stray attempt: CommittableError" in want
    else:
        assert "late older key: OrderError" in want and "stray attempt: PUBLISHED 1 1" in want


LOSSES = ["lost", "older backup", "another database", "no database", "diverged"]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("loss", LOSSES)
def test_a_committer_database_that_cannot_vouch_for_the_archive_refuses_and_publishes_nothing(
    tmp_path, sqlite_store, database_urls, loss, kind
):
    table = make_table(kind, tmp_path, sqlite_store)
    staged = {}
    for i in range(1, 21):
        _, staged[i] = table.publish(key(i), [(key(i), i, "a")])
    before = table.state()
    uuid_ = table.table_uuid()
    state = table.archive_state()
    first = state["count"] - len(state["batch"])
    assert first >= 2
    with sqlite_store.engine.begin() as conn:
        head = conn.execute(select(func.max(table_archive_table.c.n))).scalar_one()
        if loss == "lost":
            conn.execute(delete(table_archive_table))
        elif loss == "older backup":  # restored from before the batch the table carries, and one more
            conn.execute(delete(table_archive_table).where(table_archive_table.c.n > first - 2))
        elif loss == "diverged":  # another history under this table's chain
            conn.execute(
                update(table_archive_table).where(table_archive_table.c.n == head).values(digest="0" * 64)
            )
    if loss == "another database":
        from airflow_provider_walsink.core.store.store import CommitterStore

        other = CommitterStore.from_url(f"sqlite:///{tmp_path}/other.db")
        table.store = other
    elif loss == "no database":
        table.store = None

    # A re-run of an archived checkpoint, and a checkpoint never committed: neither can be told
    # from a duplicate, so both are refused, naming the table and both chains.
    manifest, attempt_dir = staged[1]
    with pytest.raises(ArchiveMismatchError, match=table.where) as refused:
        table.publisher().publish(manifest, attempt_dir, ctx(manifest, epoch=0))
    assert isinstance(refused.value, TargetStateError)
    with pytest.raises(ArchiveMismatchError, match="archived"):
        table.publish("2026-02-01", [("2026-02-01", 99, "new")])
    assert table.state() == before
    if loss not in ("no database", "another database"):
        with sqlite_store.engine.connect() as conn:
            kept = conn.execute(
                select(func.count()).where(table_archive_table.c.table_uuid == uuid_)
            ).scalar_one()
        assert kept <= head  # nothing was copied past the gap


@pytest.mark.parametrize("kind", KINDS)
def test_a_database_behind_by_the_batch_the_table_carries_catches_up_from_the_table(
    tmp_path, sqlite_store, kind
):
    """Restored from a backup taken just before the last archiving commit, or that commit's process
    died before anything copied its batch: the table still carries the batch, so nothing is lost."""
    table = make_table(kind, tmp_path, sqlite_store)
    staged = {}
    for i in range(1, 21):
        _, staged[i] = table.publish(key(i), [(key(i), i, "a")])
    state = table.archive_state()
    first = state["count"] - len(state["batch"])
    with sqlite_store.engine.begin() as conn:
        conn.execute(delete(table_archive_table).where(table_archive_table.c.n > first))
    for i in range(1, 21):
        manifest, attempt_dir = staged[i]
        again = table.publisher().publish(manifest, attempt_dir, ctx(manifest, epoch=0))
        assert again.outcome is PublishOutcome.ALREADY_PUBLISHED, key(i)
    result, _ = table.publish("2026-02-01", [("2026-02-01", 99, "new")])
    assert result.outcome is PublishOutcome.PUBLISHED
    assert archived_rows(sqlite_store) >= state["count"]


@pytest.mark.parametrize("kind", KINDS)
def test_the_commit_task_builds_its_table_publisher_with_the_committer_store(tmp_path, sqlite_store, kind):
    """The commit operator hands the committer store to the publisher (archiving on, at the
    ``table_markers`` of its ``target_options``); without it, nothing is archived."""
    from airflow_provider_walsink.operators.commit import WalCommitOperator

    catalog = {"type": "sql", "uri": f"sqlite:///{tmp_path}/catalog.db", "warehouse": f"file://{tmp_path}/wh"}
    target = "iceberg://lake/ns.events" if kind == "iceberg" else f"delta://{tmp_path}/events"
    options = {"catalog": catalog} if kind == "iceberg" else {}
    task = WalCommitOperator(
        task_id="commit", pipeline="events", target=target,
        target_options={**options, "table_markers": 40}, checkpoint_key="k", emit_asset_events=False,
    )  # fmt: skip
    publisher = task.get_publisher(None, sqlite_store)
    assert publisher.property_archive is sqlite_store and publisher.archive_keep == (40, 10)
    assert task.get_publisher(None).archive_keep is None


def test_a_table_holding_every_marker_shrinks_to_the_bound_and_still_knows_every_checkpoint(
    tmp_path, sqlite_store, monkeypatch
):
    """A table written without an archive (every marker kept, as an earlier walsink did) is
    archived oldest first, at most ``MAX_PER_COMMIT`` per commit, so no commit carries them all."""
    from airflow_provider_walsink.core.targets import archive

    table = IcebergTable(tmp_path, None, keep=10_000)
    staged = {i: table.publish(key(i), [(key(i), i, "a")])[1] for i in range(1, 31)}
    table.store, table.keep = sqlite_store, KEEP
    monkeypatch.setattr(archive, "MAX_PER_COMMIT", 6)
    seen = []
    for i in range(31, 37):
        table.publish(key(i), [(key(i), i, "a")])
        seen.append(table.counts()[0])
    # 31 markers: 6 archived per commit down to the bound, then KEEP + the batch of 2 below it.
    assert seen == [25, 20, 15, 10, 6, 7], seen
    batch = table.archive_state()["batch"]
    assert len(batch) <= 6
    for i in range(1, 31):
        manifest, attempt_dir = staged[i]
        again = table.publisher().publish(manifest, attempt_dir, ctx(manifest, epoch=0))
        assert again.outcome is PublishOutcome.ALREADY_PUBLISHED, key(i)
    assert table.rows() == sorted((key(i), i, "a") for i in range(1, 37))


@pytest.mark.parametrize("kind", KINDS)
def test_through_the_committer_a_lost_archive_leaves_the_checkpoint_uncommitted_with_its_error(
    tmp_path, sqlite_store, kind
):
    """The commit sequence records the refusal on the checkpoint, which stays uncommitted, and the
    table is unchanged: the committer table says why, as for any input that cannot commit."""
    import io

    import pyarrow.parquet as pq

    from airflow_provider_walsink.core.commit import CheckpointCommitter
    from airflow_provider_walsink.core.staging.layout import StagingLayout
    from airflow_provider_walsink.core.targets._tables import local_path
    from tests.helpers import ACTOR, stage_checkpoint
    from tests.table_fixtures import events_table

    table = make_table(kind, tmp_path, sqlite_store)
    for i in range(1, 21):
        table.publish(key(i), [(key(i), i, "a")])
    before = table.state()
    with sqlite_store.engine.begin() as conn:
        conn.execute(delete(table_archive_table))
    buf = io.BytesIO()
    pq.write_table(events_table([("2026-02-01", 99, "new")]).drop_columns(["dt"]), buf)
    layout = StagingLayout(local_path(table.publisher().staging_root()))
    stage_checkpoint(sqlite_store, layout, "events", "2026-02-01", {"dt=2026-02-01/part-0.parquet": buf.getvalue()},
                     mode="append")  # fmt: skip
    committer = CheckpointCommitter(sqlite_store, layout, table.publisher(), mode="append")
    with pytest.raises(TargetStateError):
        committer.commit("events", "2026-02-01", actor=ACTOR)
    record = sqlite_store.require("events", "2026-02-01")
    assert not record.is_committed
    assert "committer database" in (record.error or "") and table.where in record.error
    assert table.state() == before


def test_the_committer_database_side_on_every_backend(store):
    """``PropertyArchive`` on SQLite, PostgreSQL and MySQL/MariaDB: entries stored in chain order,
    a repeat is a no-op, another digest at a position is refused; the latest value at or before a
    position; the partitions whose latest holder is a checkpoint."""
    from airflow_provider_walsink.core.targets.archive import ArchivedEntry, chained, genesis

    def holder(checkpoint: str) -> str:
        return json.dumps({"checkpoint": checkpoint})

    entries = [
        ArchivedEntry("marker", "k1", "k1", '{"attempt_id": "a1"}'),
        ArchivedEntry("partition", "dt=1", "k1", holder("k1")),
        ArchivedEntry("partition", "dt=2", "k1", holder("k1")),
        ArchivedEntry("marker", "k1", "k1", '{"attempt_id": "a2"}'),
        ArchivedEntry("partition", "dt=2", "k2", holder("k2")),
    ]
    digests, d = [], genesis("uuid-1", "p")
    for e in entries:
        d = chained(d, e)
        digests.append(d)
    chain = list(zip(entries, digests, strict=True))
    assert store.archive_head("uuid-1", "p") == (0, "")
    store.archive_extend("uuid-1", "p", 1, chain[:3])
    store.archive_extend("uuid-1", "p", 1, chain)  # the first three again: left as they are
    assert store.archive_head("uuid-1", "p") == (5, digests[-1])
    assert store.archive_digest("uuid-1", "p", 2) == digests[1]
    assert store.archive_value("uuid-1", "p", "marker", "k1", 5) == '{"attempt_id": "a2"}'
    assert store.archive_value("uuid-1", "p", "marker", "k1", 3) == '{"attempt_id": "a1"}'
    assert store.archive_value("uuid-1", "p", "marker", "k2", 5) is None
    assert store.archive_held("uuid-1", "p", "k1", 5) == ["dt=1"]
    assert store.archive_held("uuid-1", "p", "k1", 4) == ["dt=1", "dt=2"]
    assert store.archive_held("uuid-1", "p", "k2", 5) == ["dt=2"]
    assert store.archive_head("uuid-2", "p") == (0, "")  # keyed by the table's UUID
    with pytest.raises(TargetStateError, match="another entry 5"):
        store.archive_extend("uuid-1", "p", 5, [(entries[0], "0" * 64)])


# --------------------------------------------------------------------------- Delta's own


def _delta_log(table: DeltaLakeTable):
    from pathlib import Path

    return Path(table.uri) / "_delta_log"


def test_delta_readers_no_longer_load_archived_markers_and_its_next_log_checkpoint_leaves_them_out(
    tmp_path, sqlite_store
):
    """What bounds a Delta table is Delta's own: a plain reader does not load an archived
    transaction, and the log checkpoint a reader loads from holds only the live ones."""
    import deltalake
    import pyarrow.parquet as pq

    from airflow_provider_walsink.core.targets.delta.log import RETENTION, TXN_RETENTION

    table = DeltaLakeTable(tmp_path, sqlite_store)
    staged = {i: table.publish(key(i), [(key(i), i, "a")])[1] for i in range(1, 25)}
    plain = deltalake.DeltaTable(table.uri)
    assert plain.metadata().configuration[TXN_RETENTION] == RETENTION
    first = staged[1][0]
    assert plain.transaction_version(f"walsink/events/{key(1)}") is None
    assert plain.transaction_version(f"walsink/events/{key(1)}/{first.attempt_id}") is None
    assert plain.transaction_version(f"walsink/events/{key(24)}") == 1
    # walsink still knows it, from the committer database.
    assert table.publisher().published_attempt(first) == first.attempt_id
    plain.create_checkpoint()
    (checkpoint,) = _delta_log(table).glob(f"{plain.version():020d}.checkpoint.parquet")
    apps = [t["appId"] for t in pq.read_table(checkpoint, columns=["txn"]).column("txn").to_pylist() if t]
    ours = [a for a in apps if "/events/" in a and not a.startswith("walsink-archive/")]
    assert 0 < len(ours) <= table.bound(), ours
    assert f"walsink/events/{key(1)}" not in apps
    # Loaded from that checkpoint, nothing changes for walsink.
    for i in (1, 12, 24):
        manifest, attempt_dir = staged[i]
        again = table.publisher().publish(manifest, attempt_dir, ctx(manifest, epoch=0))
        assert again.outcome is PublishOutcome.ALREADY_PUBLISHED, key(i)
    assert table.rows() == sorted((key(i), i, "a") for i in range(1, 25))


def test_bounding_a_delta_table_stamps_walsinks_untimed_markers_and_refuses_another_writers(
    tmp_path, sqlite_store
):
    """Spark drops a transaction without a time at its next checkpoint once the retention is set:
    walsink stamps its own first, and refuses (nothing set, nothing published) a table where
    another writer's carries none."""
    import deltalake
    from deltalake import CommitProperties, Transaction

    from airflow_provider_walsink.core.targets.delta.log import (
        TXN_RETENTION,
        MarkerRetentionError,
        append_commit,
    )
    from airflow_provider_walsink.core.targets.delta.markers import live_transactions

    def untimed(table, app):
        table.store, keep = None, table.keep
        table.publish(key(1), [(key(1), 1, "a")])  # creates the table, unbounded (no archive)
        dt = deltalake.DeltaTable(table.uri)
        append_commit(dt, [], CommitProperties(app_transactions=[Transaction(app, 7)]))
        table.store, table.keep = sqlite_store, keep
        return live_transactions(table.place.storage, table.uri, deltalake.DeltaTable(table.uri))

    ours = DeltaLakeTable(tmp_path / "ours", None)
    assert untimed(ours, "walsink/events/2020-01-01")["walsink/events/2020-01-01"] == (7, None)
    ours.publish(key(2), [(key(2), 2, "a")])
    listed = live_transactions(ours.place.storage, ours.uri, deltalake.DeltaTable(ours.uri))
    version, stamped = listed["walsink/events/2020-01-01"]
    assert version == 7 and stamped is not None and stamped > 0
    assert TXN_RETENTION in deltalake.DeltaTable(ours.uri).metadata().configuration

    theirs = DeltaLakeTable(tmp_path / "theirs", None)
    untimed(theirs, "spark-streaming-query-1")
    before = theirs.state()
    with pytest.raises(MarkerRetentionError, match="spark-streaming-query-1"):
        theirs.publish(key(2), [(key(2), 2, "a")])
    assert theirs.state() == before
    assert TXN_RETENTION not in deltalake.DeltaTable(theirs.uri).metadata().configuration


def test_walsinks_retention_set_by_hand_without_walsink_bounding_the_table_is_refused(tmp_path, sqlite_store):
    import deltalake

    from airflow_provider_walsink.core.targets.delta.log import RETENTION, TXN_RETENTION, MarkerRetentionError

    table = DeltaLakeTable(tmp_path, None)
    table.publish(key(1), [(key(1), 1, "a")])
    deltalake.DeltaTable(table.uri).alter.set_table_properties({TXN_RETENTION: RETENTION})
    with pytest.raises(MarkerRetentionError, match=TXN_RETENTION):
        table.publish(key(2), [(key(2), 2, "a")])


def test_delta_clean_up_keeps_an_archived_attempts_files_and_removes_one_never_held(tmp_path, sqlite_store):
    """The clean-up keeps an attempt while the table holds or held it: an archived marker counts
    (read from the committer database), and one that cannot be read keeps everything."""
    from pathlib import Path

    from tests.table_fixtures import layout_for

    table = DeltaLakeTable(tmp_path, sqlite_store)
    _, stray_dir = table.stage(key(1), [(key(1), 100, "x")], attempt=1)  # never published
    first, first_dir = table.stage(key(1), [(key(1), 1, "a")], attempt=2)
    table.publish(key(1), None, staged=(first, first_dir))
    again, again_dir = table.stage(key(1), [(key(1), 1, "b")], attempt=3)  # a reprocess replaces it
    table.publish(key(1), None, epoch=3, staged=(again, again_dir), supersedes=first.attempt_id)
    for i in range(2, 25):
        table.publish(key(i), [(key(i), i, "a")])
    assert f"walsink/events/{key(1)}/{first.attempt_id}" not in table.live()  # archived
    layout = layout_for(table.place, table.publisher().staging_root())
    with pytest.raises(ArchiveMismatchError):  # the committer's clean-up logs it; nothing is deleted
        table.publisher(property_archive=None).finish(again, layout)
    assert Path(stray_dir).exists() and Path(first_dir).exists()
    table.publisher().finish(again, layout)
    assert not Path(stray_dir).exists()
    # Older table versions still reference the superseded attempt's files.
    assert any(Path(first_dir).rglob("*.parquet"))
    assert table.rows() == sorted([(key(1), 1, "b")] + [(key(i), i, "a") for i in range(2, 25)])


def test_delta_log_clean_up_of_the_archiving_commit_needs_a_database_in_step(tmp_path, sqlite_store):
    """The batch is in the archiving commit's ``commitInfo``, which log clean-up removes in time: a
    database in step still answers; one behind by that batch is refused, never answered "no"."""
    import deltalake

    table = DeltaLakeTable(tmp_path, sqlite_store)
    staged = {i: table.publish(key(i), [(key(i), i, "a")])[1] for i in range(1, 21)}
    state = table.archive_state()
    at = table.publisher().load_table().transaction_version("walsink-archive/events/at")
    deltalake.DeltaTable(table.uri).create_checkpoint()
    (_delta_log(table) / f"{at:020d}.json").unlink()
    manifest, attempt_dir = staged[1]
    again = table.publisher().publish(manifest, attempt_dir, ctx(manifest, epoch=0))
    assert again.outcome is PublishOutcome.ALREADY_PUBLISHED
    first = state["count"] - len(state["batch"])
    with sqlite_store.engine.begin() as conn:
        conn.execute(delete(table_archive_table).where(table_archive_table.c.n > first))
    before = table.state()
    with pytest.raises(ArchiveMismatchError, match="lost entries"):
        table.publisher().publish(manifest, attempt_dir, ctx(manifest, epoch=0))
    assert table.state() == before


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("value", ["abc", 0, -3, "", True])
def test_a_table_markers_that_is_not_a_whole_number_of_at_least_one_is_refused_naming_it(
    tmp_path, sqlite_store, kind, value
):
    """Refused when the target is built (before anything is written), naming the option and the
    value; a number given as digits (as a form or a JSON connection extra gives it) is taken."""
    from airflow_provider_walsink.core.protocol.errors import WalsinkError

    with pytest.raises(
        WalsinkError, match=f"table_markers must be a whole number of at least 1, not {value!r}"
    ):
        make_table(kind, tmp_path, sqlite_store, keep=value).publisher()
    assert not (tmp_path / "tables").exists() or not any((tmp_path / "tables").iterdir())
    assert make_table(kind, tmp_path / "digits", sqlite_store, keep="40").publisher().archive_keep == (40, 10)
