"""versions: reprocess a committed checkpoint as a new version

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-23 22:50:00

* ``walsink_checkpoint.version`` / ``version_token`` / ``supersedes_attempt_id``:
  which version of the checkpoint the row is, which run started it, and the
  attempt id of the committed version it replaces.
* ``walsink_checkpoint_version``: the committed versions a reprocess replaced
  (COMMITTED until the successor commits, then SUPERSEDED).
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import mysql

revision: str = "0003"
down_revision: str | Sequence[str] | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

Timestamp = sa.DateTime(timezone=False).with_variant(mysql.DATETIME(fsp=6), "mysql", "mariadb")
BigId = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def upgrade() -> None:
    with op.batch_alter_table("walsink_checkpoint") as batch:
        batch.add_column(sa.Column("version", sa.Integer(), nullable=False, server_default="1"))
        batch.add_column(sa.Column("version_token", sa.String(length=600), nullable=True))
        batch.add_column(sa.Column("supersedes_attempt_id", sa.String(length=40), nullable=True))
    op.create_table(
        "walsink_checkpoint_version",
        sa.Column("id", BigId, autoincrement=True, nullable=False),
        sa.Column("checkpoint_id", BigId, nullable=False),
        sa.Column("version", sa.Integer(), nullable=False),
        sa.Column("state", sa.String(length=16), nullable=False),
        sa.Column("attempt", sa.Integer(), nullable=True),
        sa.Column("attempt_id", sa.String(length=40), nullable=True),
        sa.Column("version_token", sa.String(length=600), nullable=True),
        sa.Column("manifest_digest", sa.String(length=80), nullable=True),
        sa.Column("committables", sa.Integer(), nullable=True),
        sa.Column("rows", sa.BigInteger(), nullable=True),
        sa.Column("bytes", sa.BigInteger(), nullable=True),
        sa.Column("start_offsets", sa.Text(), nullable=True),
        sa.Column("end_offsets", sa.Text(), nullable=True),
        sa.Column("publication", sa.Text(), nullable=True),
        sa.Column("dag_id", sa.String(length=250), nullable=True),
        sa.Column("run_id", sa.String(length=250), nullable=True),
        sa.Column("committed_at", Timestamp, nullable=True),
        sa.Column("superseded_at", Timestamp, nullable=True),
        sa.Column("superseded_by_attempt_id", sa.String(length=40), nullable=True),
        sa.ForeignKeyConstraint(
            ["checkpoint_id"],
            ["walsink_checkpoint.id"],
            name="fk_walsink_checkpoint_version_checkpoint_id_walsink_checkpoint",
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name="pk_walsink_checkpoint_version"),
        sa.UniqueConstraint(
            "checkpoint_id", "version", name="uq_walsink_checkpoint_version_checkpoint_id_version"
        ),
    )


def downgrade() -> None:
    op.drop_table("walsink_checkpoint_version")
    with op.batch_alter_table("walsink_checkpoint") as batch:
        batch.drop_column("supersedes_attempt_id")
        batch.drop_column("version_token")
        batch.drop_column("version")
