"""The committer table (Flink's CheckpointCommitter, kept in an external database).

The Alembic migrations in ``migrations/`` create exactly these tables; a test
checks that autogenerate finds no difference between the two.
"""

from __future__ import annotations

import re
from datetime import datetime

from sqlalchemy import (
    BigInteger,
    DateTime,
    ForeignKey,
    Index,
    Integer,
    MetaData,
    String,
    Text,
    TypeDecorator,
    UniqueConstraint,
)
from sqlalchemy.dialects import mysql
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

NAMING_CONVENTION = {
    "ix": "ix_%(table_name)s_%(column_0_N_name)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}

# Naive UTC everywhere: SQLite has no time zones and MySQL's DATETIME neither;
# microseconds matter for lease expiry, so MySQL gets fsp=6.
Timestamp = DateTime(timezone=False).with_variant(mysql.DATETIME(fsp=6), "mysql", "mariadb")
# Pipeline ids and checkpoint keys are case-sensitive: MySQL/MariaDB compare
# strings case-insensitively by default, so their columns get a binary collation.
Identifier = String(128).with_variant(
    mysql.VARCHAR(128, charset="utf8mb4", collation="utf8mb4_bin"), "mysql", "mariadb"
)
# Names other systems compare case-sensitively (a Kafka group id, a cluster): binary as well.
Name = String(255).with_variant(
    mysql.VARCHAR(255, charset="utf8mb4", collation="utf8mb4_bin"), "mysql", "mariadb"
)
# Terminal escape sequences (colours from Spark's or a library's log, OSC hyperlinks) and other
# control characters but newline and tab: an error or detail is stored and read as plain text,
# so the UI and the CLI never show "\x1b[31m" as text.
_CONTROL = re.compile(
    r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)|\x1b[@-_]|[\x00-\x08\x0b-\x1f\x7f]"
)


def plain_text(value: str | None) -> str | None:
    """``value`` without terminal escape sequences and control characters (newlines kept)."""
    return _CONTROL.sub("", value) if value else value


class PlainText(TypeDecorator):
    """Text cleaned by :func:`plain_text` when written and when read (rows written before it)."""

    impl = Text
    cache_ok = True

    def process_bind_param(self, value, dialect):  # noqa: ARG002 - the TypeDecorator protocol
        return plain_text(value)

    def process_result_value(self, value, dialect):  # noqa: ARG002
        return plain_text(value)


# BIGINT autoincrement keys, except on SQLite where only INTEGER PRIMARY KEY is rowid.
BigId = BigInteger().with_variant(Integer(), "sqlite")


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING_CONVENTION)


class Pipeline(Base):
    """One pipeline: its commit mode, target, the next checkpoint sequence number and the
    number of its checkpoint rows retention removed."""

    __tablename__ = "walsink_pipeline"

    name: Mapped[str] = mapped_column(Identifier, primary_key=True)
    mode: Mapped[str] = mapped_column(String(16))
    target: Mapped[str | None] = mapped_column(String(1024))
    dag_id: Mapped[str | None] = mapped_column(String(250))
    next_sequence: Mapped[int] = mapped_column(BigInteger, default=1)
    #: Checkpoint rows removed by retention (``walsink gc``): counts derived from
    #: ``next_sequence`` subtract them, since those rows are gone.
    retired: Mapped[int] = mapped_column(BigInteger, default=0, server_default="0")
    created_at: Mapped[datetime] = mapped_column(Timestamp)
    #: The commit task allowed to add the first asset event of the pipeline's target, and
    #: since when (migration 0008, :mod:`.first_event`).
    first_event_holder: Mapped[str | None] = mapped_column(String(255))
    first_event_claimed_at: Mapped[datetime | None] = mapped_column(Timestamp)
    #: JSON: the connection references of the target's options (``{"conn_id": ...}``, never a
    #: secret), as the write task last registered them; an abort opens the target with them
    #: (migration 0010, ``core/targets/registry.py: connection_references``).
    target_connections: Mapped[str | None] = mapped_column(Text)
    #: The commit task leading the pipeline's group commit, and until when (migration 0011,
    #: :mod:`.group_lead`): the others leave their checkpoints to its group and wait.
    group_leader: Mapped[str | None] = mapped_column(String(255))
    group_leader_until: Mapped[datetime | None] = mapped_column(Timestamp)


class Checkpoint(Base):
    """One checkpoint of one pipeline and where it is in its life cycle."""

    __tablename__ = "walsink_checkpoint"
    __table_args__ = (
        UniqueConstraint("pipeline", "checkpoint_key"),
        UniqueConstraint("pipeline", "sequence"),
        # Keyset pagination and "pending checkpoints" per pipeline and state.
        Index("ix_walsink_checkpoint_pipeline_state_sequence", "pipeline", "state", "sequence"),
        Index("ix_walsink_checkpoint_dag_id_run_id", "dag_id", "run_id"),
        # The UI's access check: which DAGs write each pipeline (an index-only scan).
        Index("ix_walsink_checkpoint_pipeline_dag_id", "pipeline", "dag_id"),
        # Open checkpoints of every pipeline, oldest registration first ("what is stuck"), and
        # COMMITTING ones with their leases: ranges of the few open states, not the history.
        Index("ix_walsink_checkpoint_state_created_at", "state", "created_at"),
    )

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    pipeline: Mapped[str] = mapped_column(Identifier, ForeignKey("walsink_pipeline.name", ondelete="CASCADE"))
    checkpoint_key: Mapped[str] = mapped_column(Identifier)
    sequence: Mapped[int] = mapped_column(BigInteger)
    state: Mapped[str] = mapped_column(String(16))
    attempt: Mapped[int] = mapped_column(Integer, default=0)
    sealed_attempt: Mapped[int | None] = mapped_column(Integer)
    manifest_uri: Mapped[str | None] = mapped_column(String(2048))
    manifest_digest: Mapped[str | None] = mapped_column(String(80))
    #: Where every attempt of this checkpoint is staged: the staging root (an absolute path
    #: today, a URI such as ``s3://bucket/prefix`` later) exactly as the write phase used it.
    #: Recorded by the first write task; later attempts and versions keep it. NULL on rows
    #: written before walsink recorded it (readers then derive it as they used to).
    staging_root: Mapped[str | None] = mapped_column(String(2048))
    committables: Mapped[int | None] = mapped_column(Integer)
    rows: Mapped[int | None] = mapped_column(BigInteger)
    bytes: Mapped[int | None] = mapped_column(BigInteger)
    start_offsets: Mapped[str | None] = mapped_column(Text)
    end_offsets: Mapped[str | None] = mapped_column(Text)
    #: JSON: the source ranges the write task fixed on the version's first attempt (a Kafka
    #: source's start/end/read-from offsets and accepted gaps); later attempts reuse them.
    #: NULL when the job plans its own input, and on rows from before migration 0006.
    source_plan: Mapped[str | None] = mapped_column(Text)
    lease_owner: Mapped[str | None] = mapped_column(String(255))
    lease_expires_at: Mapped[datetime | None] = mapped_column(Timestamp)
    #: The fencing token: bumped by every lease take (and by an abort), checked
    #: by every lease-scoped change, so a committer that lost its lease is refused.
    lease_epoch: Mapped[int] = mapped_column(BigInteger, default=0, server_default="0")
    #: Globally unique ids of the current and the sealed write attempt.
    attempt_id: Mapped[str | None] = mapped_column(String(40))
    sealed_attempt_id: Mapped[str | None] = mapped_column(String(40))
    #: What the commit published (JSON: target, files or table snapshot).
    publication: Mapped[str | None] = mapped_column(Text)
    #: JSON: where the current write attempt's Spark job runs, when it can outlive its task's
    #: worker (a Spark Connect session: ``{"runner", "conn_id", "session_id"}``, never a secret),
    #: so the next attempt stops it (migration 0012, ``core/runners/base.py: JobRunner.job_ref``).
    write_job: Mapped[str | None] = mapped_column(Text)
    #: Reprocess: the checkpoint's version (1, then +1 per reprocess), the run
    #: (``dag/run#clear``) that started it, and the attempt id of the committed
    #: version it replaces (``None`` for a first version).
    version: Mapped[int] = mapped_column(Integer, default=1, server_default="1")
    version_token: Mapped[str | None] = mapped_column(String(600))
    supersedes_attempt_id: Mapped[str | None] = mapped_column(String(40))
    error: Mapped[str | None] = mapped_column(PlainText)
    # The Airflow run that registered it, for the UI's DAG and run tabs.
    dag_id: Mapped[str | None] = mapped_column(String(250))
    run_id: Mapped[str | None] = mapped_column(String(250))
    created_at: Mapped[datetime] = mapped_column(Timestamp)
    updated_at: Mapped[datetime] = mapped_column(Timestamp)
    sealed_at: Mapped[datetime | None] = mapped_column(Timestamp)
    durable_at: Mapped[datetime | None] = mapped_column(Timestamp)
    committed_at: Mapped[datetime | None] = mapped_column(Timestamp)
    #: The commit deadline Airflow found missed for this version (migration 0013,
    #: :mod:`.deadlines`): with a state other than COMMITTED, the checkpoint is overdue.
    commit_due_at: Mapped[datetime | None] = mapped_column(Timestamp)


class Transition(Base):
    """One state change of a checkpoint: from, to, who and when (invariant 7)."""

    __tablename__ = "walsink_transition"
    __table_args__ = (Index("ix_walsink_transition_checkpoint_id_id", "checkpoint_id", "id"),)

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    checkpoint_id: Mapped[int] = mapped_column(BigId, ForeignKey("walsink_checkpoint.id", ondelete="CASCADE"))
    from_state: Mapped[str | None] = mapped_column(String(16))
    to_state: Mapped[str] = mapped_column(String(16))
    attempt: Mapped[int] = mapped_column(Integer)
    at: Mapped[datetime] = mapped_column(Timestamp)
    actor: Mapped[str | None] = mapped_column(String(255))
    dag_id: Mapped[str | None] = mapped_column(String(250))
    run_id: Mapped[str | None] = mapped_column(String(250))
    task_id: Mapped[str | None] = mapped_column(String(250))
    try_number: Mapped[int | None] = mapped_column(Integer)
    detail: Mapped[str | None] = mapped_column(PlainText)


class CheckpointVersion(Base):
    """A committed version of a checkpoint that a reprocess replaced (or is replacing).

    COMMITTED while its successor is being written (its data is still the
    published data), SUPERSEDED once the successor commits.
    """

    __tablename__ = "walsink_checkpoint_version"
    __table_args__ = (UniqueConstraint("checkpoint_id", "version"),)

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    checkpoint_id: Mapped[int] = mapped_column(BigId, ForeignKey("walsink_checkpoint.id", ondelete="CASCADE"))
    version: Mapped[int] = mapped_column(Integer)
    state: Mapped[str] = mapped_column(String(16))
    attempt: Mapped[int | None] = mapped_column(Integer)
    attempt_id: Mapped[str | None] = mapped_column(String(40))
    version_token: Mapped[str | None] = mapped_column(String(600))
    manifest_digest: Mapped[str | None] = mapped_column(String(80))
    committables: Mapped[int | None] = mapped_column(Integer)
    rows: Mapped[int | None] = mapped_column(BigInteger)
    bytes: Mapped[int | None] = mapped_column(BigInteger)
    start_offsets: Mapped[str | None] = mapped_column(Text)
    end_offsets: Mapped[str | None] = mapped_column(Text)
    publication: Mapped[str | None] = mapped_column(Text)
    dag_id: Mapped[str | None] = mapped_column(String(250))
    run_id: Mapped[str | None] = mapped_column(String(250))
    committed_at: Mapped[datetime | None] = mapped_column(Timestamp)
    superseded_at: Mapped[datetime | None] = mapped_column(Timestamp)
    superseded_by_attempt_id: Mapped[str | None] = mapped_column(String(40))


class ConsumerGroup(Base):
    """Which pipeline a Kafka consumer group belongs to (migration 0009): the group's offsets
    follow one pipeline's committed checkpoints, so a second pipeline naming the same group on
    the same cluster is refused. The primary key decides between two registering at once."""

    __tablename__ = "walsink_consumer_group"

    #: The Kafka cluster: its cluster id (``cluster:<id>``), else the bootstrap servers as configured.
    cluster: Mapped[str] = mapped_column(Name, primary_key=True)
    group_id: Mapped[str] = mapped_column(Name, primary_key=True)
    pipeline: Mapped[str] = mapped_column(Identifier)
    claimed_at: Mapped[datetime] = mapped_column(Timestamp)


class DeadlineNotice(Base):
    """A missed commit deadline whose notification one deadline callback claimed (migration 0014,
    :mod:`.deadlines`). The primary key is the claim: of two runs of the callback for the same
    deadline (a triggerer restart, a reassigned trigger, two triggerers), one inserts the row and
    notifies; the other finds it and does nothing. No foreign key: a run whose write task never
    registered its checkpoint (nor its pipeline) is notified about too."""

    __tablename__ = "walsink_deadline_notice"

    pipeline: Mapped[str] = mapped_column(Identifier, primary_key=True)
    #: Airflow's id of the run's deadline (a UUID), else ``<dag_id>/<run_id>@<due>``.
    deadline: Mapped[str] = mapped_column(Name, primary_key=True)
    dag_id: Mapped[str | None] = mapped_column(String(250))
    run_id: Mapped[str | None] = mapped_column(String(250))
    checkpoint_key: Mapped[str | None] = mapped_column(Identifier)
    due_at: Mapped[datetime] = mapped_column(Timestamp)
    #: Who claimed it (one token per run of the callback) and when, on the database's clock.
    claimed_by: Mapped[str] = mapped_column(String(255))
    claimed_at: Mapped[datetime] = mapped_column(Timestamp)
    #: ``claimed`` until the notifier returns, then ``notified`` or ``failed`` (``detail``: why).
    outcome: Mapped[str] = mapped_column(String(16))
    detail: Mapped[str | None] = mapped_column(PlainText)


class TableArchiveEntry(Base):
    """One walsink table property a table target archived (migration 0015, ``core/targets/archive.py``):
    copied from the table's committed archive batch, in the order of the table's hash chain,
    with the chain's digest after it. Never trimmed by history retention: it is what answers
    "was this checkpoint committed?" once the table no longer carries the marker."""

    __tablename__ = "walsink_table_archive"
    __table_args__ = (
        Index("ix_walsink_table_archive_item", "table_uuid", "pipeline", "kind", "item_digest", "n"),
        Index("ix_walsink_table_archive_checkpoint", "table_uuid", "pipeline", "checkpoint_key"),
    )

    #: The table's own UUID (a table recreated under the same name starts a new chain).
    table_uuid: Mapped[str] = mapped_column(String(64), primary_key=True)
    pipeline: Mapped[str] = mapped_column(Identifier, primary_key=True)
    #: Position in the chain, from 1.
    n: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=False)
    kind: Mapped[str] = mapped_column(String(16))
    item: Mapped[str] = mapped_column(Text)
    #: sha256 of ``item``: an index key of bounded length for any partition path.
    item_digest: Mapped[str] = mapped_column(String(64))
    checkpoint_key: Mapped[str] = mapped_column(Identifier)
    value: Mapped[str] = mapped_column(Text)
    #: The chain's digest after this entry.
    digest: Mapped[str] = mapped_column(String(64))
    archived_at: Mapped[datetime] = mapped_column(Timestamp)


checkpoint_table = Checkpoint.__table__
version_table = CheckpointVersion.__table__
pipeline_table = Pipeline.__table__
consumer_group_table = ConsumerGroup.__table__
transition_table = Transition.__table__
deadline_notice_table = DeadlineNotice.__table__
table_archive_table = TableArchiveEntry.__table__
