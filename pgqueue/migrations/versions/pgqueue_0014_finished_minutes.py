"""pgqueue 0014: per-minute counts of the jobs moved into the partitioned history.

Revision ID: pgqueue_0014
Revises: pgqueue_0013
Create Date: 2026-11-23

- ``pgqueue_finished_minutes``: ``(minute, queue, state) -> jobs``, written by the history move
  in the statement that moves the jobs, read by the dashboard's throughput chart. Filled here
  from the last day of ``pgqueue_job_history`` (empty unless ``history="partitioned"`` was
  already in use), so the chart of a database that already moved jobs starts complete.
"""

from collections.abc import Sequence

import sqlalchemy as sa

from alembic import op
from pgqueue.migrations.losses import DropsTable

revision: str = "pgqueue_0014"
down_revision: str | Sequence[str] | None = "pgqueue_0013"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# What downgrade() destroys when it holds data (see pgqueue.migrations.losses).
downgrade_loses = (DropsTable("pgqueue_finished_minutes"),)

_STATE_CHECK = (
    "state::text = ANY ('{queued,waiting,running,retrying,succeeded,failed,cancelled}'::text[])"
)


def upgrade() -> None:
    op.create_table(
        "pgqueue_finished_minutes",
        sa.Column("minute", sa.DateTime(timezone=True), nullable=False),
        sa.Column("queue", sa.Text(), nullable=False),
        sa.Column("state", sa.String(length=16), nullable=False),
        sa.Column("jobs", sa.BigInteger(), nullable=False),
        sa.CheckConstraint(_STATE_CHECK, name=op.f("ck_pgqueue_finished_minutes_state_valid")),
        sa.CheckConstraint("jobs >= 1", name=op.f("ck_pgqueue_finished_minutes_jobs_positive")),
        sa.PrimaryKeyConstraint(
            "minute", "queue", "state", name=op.f("pk_pgqueue_finished_minutes")
        ),
    )
    op.execute(
        """INSERT INTO pgqueue_finished_minutes (minute, queue, state, jobs)
           SELECT date_bin('1 minute', finished_at, TIMESTAMPTZ '1970-01-01 00:00:00+00'),
                  queue, state, count(*)
           FROM pgqueue_job_history
           WHERE finished_at >= now() - interval '1 day'
           GROUP BY 1, 2, 3"""
    )


def downgrade() -> None:
    op.drop_table("pgqueue_finished_minutes")
