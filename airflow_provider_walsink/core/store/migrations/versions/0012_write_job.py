"""write_job: where the current write attempt's job runs, when it can outlive its worker

Revision ID: 0012
Revises: 0011
Create Date: 2026-11-27 07:40:00

``walsink_checkpoint.write_job``: JSON naming the current attempt's Spark job when it runs
somewhere the write task's worker does not take down with it (a Spark Connect session:
``{"runner": "spark_connect", "conn_id": ..., "session_id": ...}``; never a secret). The
next attempt of the checkpoint stops that job before it runs its own (issue 36: a worker
killed mid-job leaves its Connect operation running on the server). Nullable: spark-submit
in client mode (its driver dies with the worker) and rows from before this revision.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0012"
down_revision: str | Sequence[str] | None = "0011"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # Plain ADD COLUMN on every backend (as 0008 and 0010): batch mode could recreate the table
    # on SQLite, and dropping the old one would cascade into every history row.
    op.add_column("walsink_checkpoint", sa.Column("write_job", sa.Text(), nullable=True))


def downgrade() -> None:
    op.drop_column("walsink_checkpoint", "write_job")
