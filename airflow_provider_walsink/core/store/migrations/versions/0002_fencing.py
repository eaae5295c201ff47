"""fencing: lease epoch, attempt identity, publication

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-23 04:10:00

* ``lease_epoch``: the fencing token. Every lease take bumps it; every
  lease-scoped change is a compare-and-set on it.
* ``attempt_id`` / ``sealed_attempt_id``: globally unique ids of the current
  and the sealed write attempt (the numbers repeat after retention).
* ``publication``: what the commit published (JSON: target, files or snapshot).
* an index on ``(pipeline, dag_id)`` for the UI's access check.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0002"
down_revision: str | Sequence[str] | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("walsink_checkpoint") as batch:
        batch.add_column(sa.Column("lease_epoch", sa.BigInteger(), nullable=False, server_default="0"))
        batch.add_column(sa.Column("attempt_id", sa.String(length=40), nullable=True))
        batch.add_column(sa.Column("sealed_attempt_id", sa.String(length=40), nullable=True))
        batch.add_column(sa.Column("publication", sa.Text(), nullable=True))
    op.create_index(
        "ix_walsink_checkpoint_pipeline_dag_id", "walsink_checkpoint", ["pipeline", "dag_id"], unique=False
    )


def downgrade() -> None:
    op.drop_index("ix_walsink_checkpoint_pipeline_dag_id", table_name="walsink_checkpoint")
    with op.batch_alter_table("walsink_checkpoint") as batch:
        batch.drop_column("publication")
        batch.drop_column("sealed_attempt_id")
        batch.drop_column("attempt_id")
        batch.drop_column("lease_epoch")
