"""pgqueue 0018: a committed record of each atomic handler run.

Revision ID: pgqueue_0018
Revises: pgqueue_0017
Create Date: 2026-11-25

- ``pgqueue_atomic_runs``: one row per started run of an atomic job's handler, committed before
  the handler runs and deleted by the run's transaction when it commits; a row left behind is a
  run whose transaction was lost, counted as a failed attempt before the job runs again.

A new, empty table: creating it takes no lock on existing tables beyond the foreign key's.
"""

from collections.abc import Sequence

import sqlalchemy as sa

from alembic import op
from pgqueue.migrations.losses import DropsTable

revision: str = "pgqueue_0018"
down_revision: str | Sequence[str] | None = "pgqueue_0017"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# What downgrade() destroys when it holds data (see pgqueue.migrations.losses).
downgrade_loses = (DropsTable("pgqueue_atomic_runs"),)


def upgrade() -> None:
    op.create_table(
        "pgqueue_atomic_runs",
        sa.Column("job_id", sa.BigInteger(), nullable=False),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("worker", sa.Text(), nullable=False),
        sa.Column(
            "started_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("now()"),
            nullable=False,
        ),
        sa.ForeignKeyConstraint(
            ["job_id"],
            ["pgqueue_jobs.id"],
            name=op.f("fk_pgqueue_atomic_runs_job_id_pgqueue_jobs"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("job_id", "attempt", name=op.f("pk_pgqueue_atomic_runs")),
    )


def downgrade() -> None:
    op.drop_table("pgqueue_atomic_runs")
