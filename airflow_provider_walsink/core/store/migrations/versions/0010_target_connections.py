"""target_connections: the connections a pipeline's target reads, by name

Revision ID: 0010
Revises: 0009
Create Date: 2026-11-26 21:40:00

``walsink_pipeline.target_connections``: JSON, the connection references of the
target's ``target_options`` the write task registered the pipeline with (an
allow-list, ``core/targets/registry.py: connection_references``: ``conn_id``,
never a secret such as ``storage_options`` or a catalog's properties). An abort
(``walsink abort``, the UI's Abort) builds the pipeline's publisher from the
registered target with them, so a ``delta+s3://`` table is opened with the
``aws`` connection its DAG names rather than this process's environment
(issue 35). Nullable: pipelines registered before this revision, and targets
that name no connection in their options, have none.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0010"
down_revision: str | Sequence[str] | None = "0009"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # Plain ADD COLUMN on every backend (as 0008): batch mode could recreate the table on
    # SQLite, and dropping the old one would cascade into every checkpoint row.
    op.add_column("walsink_pipeline", sa.Column("target_connections", sa.Text(), nullable=True))


def downgrade() -> None:
    # SQLite 3.35+ drops a column in place, as PostgreSQL and MariaDB do.
    op.drop_column("walsink_pipeline", "target_connections")
