"""pgqueue 0009: a job's snooze count and its reported progress.

Revision ID: pgqueue_0009
Revises: pgqueue_0008
Create Date: 2026-11-23

- ``pgqueue_jobs.snoozes``: how many times a handler raised ``Snooze``; a constant default
  (0), so adding it rewrites nothing.
- ``pgqueue_jobs.progress``, ``progress_message``, ``progress_at``: the latest progress a
  handler reported (``ctx.progress``), written by heartbeats and with the outcome; nullable
  without a default, so adding them rewrites nothing.
"""

from collections.abc import Sequence

import sqlalchemy as sa

from alembic import op
from pgqueue.migrations.losses import DropsColumn

revision: str = "pgqueue_0009"
down_revision: str | Sequence[str] | None = "pgqueue_0008"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# What downgrade() destroys when it holds data (see pgqueue.migrations.losses).
downgrade_loses = (
    DropsColumn("pgqueue_jobs", "progress_at"),
    DropsColumn("pgqueue_jobs", "progress_message"),
    DropsColumn("pgqueue_jobs", "progress"),
    DropsColumn("pgqueue_jobs", "snoozes", default=0),
)


def upgrade() -> None:
    op.add_column(
        "pgqueue_jobs",
        sa.Column("snoozes", sa.Integer(), server_default="0", nullable=False),
    )
    op.add_column("pgqueue_jobs", sa.Column("progress", sa.Float(), nullable=True))
    op.add_column("pgqueue_jobs", sa.Column("progress_message", sa.Text(), nullable=True))
    op.add_column(
        "pgqueue_jobs", sa.Column("progress_at", sa.DateTime(timezone=True), nullable=True)
    )


def downgrade() -> None:
    op.drop_column("pgqueue_jobs", "progress_at")
    op.drop_column("pgqueue_jobs", "progress_message")
    op.drop_column("pgqueue_jobs", "progress")
    op.drop_column("pgqueue_jobs", "snoozes")
