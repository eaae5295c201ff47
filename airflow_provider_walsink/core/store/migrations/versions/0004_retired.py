"""retired: count the checkpoint rows retention removed

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-24 02:10:00

``walsink_pipeline.retired``: how many of the pipeline's checkpoint rows
``walsink gc`` deleted. The pipeline summary derives its COMMITTED count from
the sequence numbers allocated (so it does not scan the pipeline's history);
without this count, rows trimmed by retention (committed or aborted) would
still be counted as COMMITTED.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0004"
down_revision: str | Sequence[str] | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("walsink_pipeline") as batch:
        batch.add_column(sa.Column("retired", sa.BigInteger(), nullable=False, server_default="0"))


def downgrade() -> None:
    with op.batch_alter_table("walsink_pipeline") as batch:
        batch.drop_column("retired")
