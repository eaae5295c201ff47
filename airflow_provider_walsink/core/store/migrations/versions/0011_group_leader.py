"""group_leader: the commit task leading a pipeline's group commit

Revision ID: 0011
Revises: 0010
Create Date: 2026-11-27 00:40:00

``walsink_pipeline.group_leader`` and ``group_leader_until``: the commit task that
leads the pipeline's group commit and until when (database clock). Commit tasks
that find a live leader leave their durable checkpoints to its group and wait for
the answer instead of racing it at the table (issue 35,
``core/store/group_lead.py``). Nullable: no leader.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

from airflow_provider_walsink.core.store.models import Timestamp

revision: str = "0011"
down_revision: str | Sequence[str] | None = "0010"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # Plain ADD COLUMN on every backend (as 0008, 0010): batch mode could recreate the table on
    # SQLite, and dropping the old one would cascade into every checkpoint row.
    op.add_column("walsink_pipeline", sa.Column("group_leader", sa.String(255), nullable=True))
    op.add_column("walsink_pipeline", sa.Column("group_leader_until", Timestamp, nullable=True))


def downgrade() -> None:
    op.drop_column("walsink_pipeline", "group_leader_until")
    op.drop_column("walsink_pipeline", "group_leader")
