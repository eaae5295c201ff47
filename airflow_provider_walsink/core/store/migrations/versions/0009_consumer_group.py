"""consumer_group: which pipeline a Kafka consumer group belongs to

Revision ID: 0009
Revises: 0008
Create Date: 2026-11-26 00:00:00

``walsink_consumer_group``: one row per (Kafka cluster, consumer group id), naming the
pipeline whose committed offsets the group follows. Its primary key is the race's
referee: of two pipelines registering the same group at once, one inserts the row and
the other is refused (:meth:`~airflow_provider_walsink.core.store.source_plans.SourcePlans.claim_consumer_group`).
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

revision: str = "0009"
down_revision: str | Sequence[str] | None = "0008"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "walsink_consumer_group",
        sa.Column("cluster", NAME, nullable=False),
        sa.Column("group_id", NAME, nullable=False),
        sa.Column("pipeline", IDENTIFIER, nullable=False),
        sa.Column("claimed_at", Timestamp, nullable=False),
        sa.PrimaryKeyConstraint("cluster", "group_id", name=op.f("pk_walsink_consumer_group")),
    )


def downgrade() -> None:
    op.drop_table("walsink_consumer_group")
