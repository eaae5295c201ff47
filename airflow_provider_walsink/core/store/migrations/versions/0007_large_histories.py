"""large histories: open checkpoints of every pipeline found by state, not by scanning

Revision ID: 0007
Revises: 0006
Create Date: 2026-11-25 21:00:00

``ix_walsink_checkpoint_state_created_at`` on ``walsink_checkpoint (state,
created_at)``: "what is not committed, oldest registration first" across every
pipeline (the UI overview, ``walsink checkpoints``) and the expired-lease probe
read the ranges of the few open states instead of every row (issue 24: 10,000
pipelines, 10 million checkpoints). A plain ``CREATE INDEX`` on every backend:
Alembic runs each migration in a transaction here, where PostgreSQL refuses
``CONCURRENTLY``; on a large PostgreSQL table create it concurrently by hand
under this name first (``CREATE INDEX CONCURRENTLY IF NOT EXISTS`` ... then
``walsink db upgrade`` finds it and only records the revision).
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0007"
down_revision: str | Sequence[str] | None = "0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

NAME = "ix_walsink_checkpoint_state_created_at"


def upgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        # An index built by hand beforehand (CONCURRENTLY, see above) is kept, not built twice.
        op.execute(f"CREATE INDEX IF NOT EXISTS {NAME} ON walsink_checkpoint (state, created_at)")
    else:
        op.create_index(NAME, "walsink_checkpoint", ["state", "created_at"])


def downgrade() -> None:
    op.drop_index(NAME, table_name="walsink_checkpoint")
