"""deadline_notice: one notification per missed commit deadline

Revision ID: 0014
Revises: 0013
Create Date: 2026-11-28 19:40:00

``walsink_deadline_notice``: one row per (pipeline, Airflow deadline) whose commit deadline
callback claimed the notification. Its primary key is the claim: a second run of the
callback for the same deadline (a triggerer restart, a reassigned trigger, two triggerers
at once) fails to insert it and neither notifies nor records the miss again
(``core/store/deadlines.py``). (Issue 46.)
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import mysql

from airflow_provider_walsink.core.store.models import Timestamp

# Case-sensitive, as in models.Identifier and models.Name.
IDENTIFIER = sa.String(length=128).with_variant(
    mysql.VARCHAR(128, charset="utf8mb4", collation="utf8mb4_bin"), "mysql", "mariadb"
)
NAME = sa.String(length=255).with_variant(
    mysql.VARCHAR(255, charset="utf8mb4", collation="utf8mb4_bin"), "mysql", "mariadb"
)

revision: str = "0014"
down_revision: str | Sequence[str] | None = "0013"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "walsink_deadline_notice",
        sa.Column("pipeline", IDENTIFIER, nullable=False),
        sa.Column("deadline", NAME, nullable=False),
        sa.Column("dag_id", sa.String(length=250), nullable=True),
        sa.Column("run_id", sa.String(length=250), nullable=True),
        sa.Column("checkpoint_key", IDENTIFIER, nullable=True),
        sa.Column("due_at", Timestamp, nullable=False),
        sa.Column("claimed_by", sa.String(length=255), nullable=False),
        sa.Column("claimed_at", Timestamp, nullable=False),
        sa.Column("outcome", sa.String(length=16), nullable=False),
        sa.Column("detail", sa.Text(), nullable=True),
        sa.PrimaryKeyConstraint("pipeline", "deadline", name=op.f("pk_walsink_deadline_notice")),
    )


def downgrade() -> None:
    op.drop_table("walsink_deadline_notice")
