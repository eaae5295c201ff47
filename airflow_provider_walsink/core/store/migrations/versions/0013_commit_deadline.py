"""commit_deadline: when a checkpoint's commit deadline was missed

Revision ID: 0013
Revises: 0012
Create Date: 2026-11-27 07:45:00

``walsink_checkpoint.commit_due_at``: the commit deadline (naive UTC) that Airflow's
deadline alert of the pipeline found missed for the checkpoint's current version
(``walsink_pipeline(commit_deadline=...)``, ``core/store/deadlines.py``). The UI marks
a checkpoint with one that is not COMMITTED as overdue. Nullable: no deadline missed.
(Issue 37.)
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

from airflow_provider_walsink.core.store.models import Timestamp

revision: str = "0013"
down_revision: str | Sequence[str] | None = "0012"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # Plain ADD COLUMN on every backend (as 0008, 0010, 0011): batch mode could recreate the
    # table on SQLite.
    op.add_column("walsink_checkpoint", sa.Column("commit_due_at", Timestamp, nullable=True))


def downgrade() -> None:
    op.drop_column("walsink_checkpoint", "commit_due_at")
