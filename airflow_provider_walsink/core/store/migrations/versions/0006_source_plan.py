"""source_plan: the source ranges a checkpoint's write phase fixed on its first attempt

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-25 18:00:00

``walsink_checkpoint.source_plan``: JSON, the source ranges the write task
planned when it first ran for the checkpoint's current version (a Kafka
source: start, end and read-from offsets per partition, and any retention gap
the pipeline accepted as data loss). Later attempts of that version reuse it,
so a retried write reads exactly the records the first attempt was given
(issue 28). Nullable: rows from before this revision, and pipelines whose job
plans its own input (the file examples), have none.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0006"
down_revision: str | Sequence[str] | None = "0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("walsink_checkpoint") as batch:
        batch.add_column(sa.Column("source_plan", sa.Text(), nullable=True))


def downgrade() -> None:
    # Not in batch mode (as 0005): on SQLite, batch recreates the table, and dropping the old
    # one (foreign keys on) cascades into the history and version tables. SQLite 3.35+ drops a
    # column in place, as PostgreSQL and MariaDB do.
    op.drop_column("walsink_checkpoint", "source_plan")
