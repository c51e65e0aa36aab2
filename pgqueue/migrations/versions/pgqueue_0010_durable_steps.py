"""pgqueue 0010: durable steps.

Revision ID: pgqueue_0010
Revises: pgqueue_0009
Create Date: 2026-11-23

- ``pgqueue_job_steps``: one row per completed durable step of a job (``ctx.step``), keyed by
  job id and step name, holding the step's JSON result and when it was saved. A new table, so
  nothing existing is rewritten; its foreign key deletes a job's steps with the job.
"""

from collections.abc import Sequence

import sqlalchemy as sa

from alembic import op
from pgqueue.migrations.losses import DropsTable

revision: str = "pgqueue_0010"
down_revision: str | Sequence[str] | None = "pgqueue_0009"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# What downgrade() destroys when it holds data (see pgqueue.migrations.losses).
downgrade_loses = (DropsTable("pgqueue_job_steps"),)


def upgrade() -> None:
    op.create_table(
        "pgqueue_job_steps",
        sa.Column("job_id", sa.BigInteger(), nullable=False),
        sa.Column("name", sa.Text(), nullable=False),
        sa.Column("result", sa.JSON(), nullable=False),
        sa.Column(
            "completed_at",
            sa.DateTime(timezone=True),
            server_default=sa.func.now(),
            nullable=False,
        ),
        sa.ForeignKeyConstraint(
            ["job_id"],
            ["pgqueue_jobs.id"],
            name=op.f("fk_pgqueue_job_steps_job_id_pgqueue_jobs"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("job_id", "name", name=op.f("pk_pgqueue_job_steps")),
    )


def downgrade() -> None:
    op.drop_table("pgqueue_job_steps")
