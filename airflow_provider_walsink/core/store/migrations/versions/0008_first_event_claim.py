"""first_event_claim: one commit task at a time adds a pipeline's first asset event

Revision ID: 0008
Revises: 0007
Create Date: 2026-11-26 00:00:00

``walsink_pipeline.first_event_holder`` and ``first_event_claimed_at``: the commit
task that may add the first asset event of the pipeline's target through its
alias, and when it claimed that (the database's clock). Airflow 3.3 links an
asset alias to an asset with the first event through the alias, and two such
first events recorded at once fail one of their tasks on the link's unique key;
the claim lets one go first (:mod:`~airflow_provider_walsink.core.store.first_event`).
Nullable: no claim yet.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

from airflow_provider_walsink.core.store.models import Timestamp

revision: str = "0008"
down_revision: str | Sequence[str] | None = "0007"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # Plain ADD COLUMN on every backend: batch mode could recreate the table on SQLite, and
    # dropping the old one would cascade into every checkpoint row.
    op.add_column("walsink_pipeline", sa.Column("first_event_holder", sa.String(255), nullable=True))
    op.add_column("walsink_pipeline", sa.Column("first_event_claimed_at", Timestamp, nullable=True))


def downgrade() -> None:
    # SQLite 3.35+ drops a column in place, as PostgreSQL and MariaDB do.
    op.drop_column("walsink_pipeline", "first_event_claimed_at")
    op.drop_column("walsink_pipeline", "first_event_holder")
