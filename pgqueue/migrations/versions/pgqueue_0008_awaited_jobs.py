"""pgqueue 0008: jobs someone waits for.

Revision ID: pgqueue_0008
Revises: pgqueue_0007
Create Date: 2026-11-23

- ``pgqueue_jobs.awaited``: set by ``wait_for``/``await_job`` before they wait; only the ending
  of such jobs is announced on the ``pgqueue_finished`` channel, so the statements that end
  jobs nobody waits for send no notification (whose commit-time lock is cluster-wide). A
  constant default, so adding the column rewrites nothing.
"""

from collections.abc import Sequence

import sqlalchemy as sa

from alembic import op
from pgqueue.migrations.losses import DropsColumn

revision: str = "pgqueue_0008"
down_revision: str | Sequence[str] | None = "pgqueue_0007"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# What downgrade() destroys when it holds data (see pgqueue.migrations.losses).
downgrade_loses = (DropsColumn("pgqueue_jobs", "awaited", default=False),)


def upgrade() -> None:
    op.add_column(
        "pgqueue_jobs",
        sa.Column("awaited", sa.Boolean(), server_default=sa.text("false"), nullable=False),
    )


def downgrade() -> None:
    op.drop_column("pgqueue_jobs", "awaited")
