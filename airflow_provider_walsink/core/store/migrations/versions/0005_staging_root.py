"""staging_root: record where each checkpoint is staged

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-25 15:00:00

``walsink_checkpoint.staging_root``: the staging root the write phase used for
the checkpoint's attempts (an absolute path, or a URI), recorded when the write
task registers it or starts an attempt. Readers (durability sensor, commit,
audit, abort, GC, the UI and the CLI) used to derive it again from the
connection and the target, and looked in the wrong place when the two differ
(a table target staging inside its table: issue 23). Nullable: rows written
before this revision have none, and readers fall back to the old derivation.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0005"
down_revision: str | Sequence[str] | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("walsink_checkpoint") as batch:
        batch.add_column(sa.Column("staging_root", sa.String(length=2048), nullable=True))


def downgrade() -> None:
    # Not in batch mode: on SQLite, batch recreates the table, and dropping the old one (with
    # foreign keys on, as the committer's engine sets them) cascades into walsink_transition and
    # walsink_checkpoint_version, deleting every checkpoint's history. SQLite 3.35+ drops a
    # column in place, as PostgreSQL and MariaDB do.
    op.drop_column("walsink_checkpoint", "staging_root")
