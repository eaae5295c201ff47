"""table_archive: the table properties a table target archived, behind the table's hash chain

Revision ID: 0015
Revises: 0014
Create Date: 2026-11-29 13:10:00

``walsink_table_archive``: one row per marker or partition holder an Iceberg table target moved
out of the table's metadata, keyed by the table's UUID, the pipeline and the position in the
chain the table keeps (``core/targets/archive.py``). (Issue 45.)
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import mysql

from airflow_provider_walsink.core.store.models import Timestamp

# Case-sensitive, as in models.Identifier.
IDENTIFIER = sa.String(length=128).with_variant(
    mysql.VARCHAR(128, charset="utf8mb4", collation="utf8mb4_bin"), "mysql", "mariadb"
)

revision: str = "0015"
down_revision: str | Sequence[str] | None = "0014"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "walsink_table_archive",
        sa.Column("table_uuid", sa.String(length=64), nullable=False),
        sa.Column("pipeline", IDENTIFIER, nullable=False),
        sa.Column("n", sa.BigInteger(), autoincrement=False, nullable=False),
        sa.Column("kind", sa.String(length=16), nullable=False),
        sa.Column("item", sa.Text(), nullable=False),
        sa.Column("item_digest", sa.String(length=64), nullable=False),
        sa.Column("checkpoint_key", IDENTIFIER, nullable=False),
        sa.Column("value", sa.Text(), nullable=False),
        sa.Column("digest", sa.String(length=64), nullable=False),
        sa.Column("archived_at", Timestamp, nullable=False),
        sa.PrimaryKeyConstraint("table_uuid", "pipeline", "n", name=op.f("pk_walsink_table_archive")),
    )
    op.create_index(
        "ix_walsink_table_archive_item",
        "walsink_table_archive",
        ["table_uuid", "pipeline", "kind", "item_digest", "n"],
    )
    op.create_index(
        "ix_walsink_table_archive_checkpoint",
        "walsink_table_archive",
        ["table_uuid", "pipeline", "checkpoint_key"],
    )


def downgrade() -> None:
    op.drop_index("ix_walsink_table_archive_checkpoint", table_name="walsink_table_archive")
    op.drop_index("ix_walsink_table_archive_item", table_name="walsink_table_archive")
    op.drop_table("walsink_table_archive")
