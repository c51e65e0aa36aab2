"""pgqueue 0022: workflows (chain, group, chord).

Revision ID: pgqueue_0022
Revises: pgqueue_0021
Create Date: 2026-11-25

- ``pgqueue_workflows``: one row per workflow: its state, timestamps, the jobs whose results
  are its result, its closing marker job and its ``on_failure`` job.
- ``pgqueue_jobs`` (and ``pgqueue_job_history``, which keeps the same columns) get
  ``workflow_id``, ``pending_dependencies`` and ``workflow_role``, all nullable, and a partial
  index on ``workflow_id`` for workflow jobs.

Nullable columns without defaults are added without rewriting the table; the index is built
on the jobs that have a workflow, none yet, so it takes no time.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql

from alembic import op
from pgqueue.migrations.losses import DropsColumn, DropsTable

revision: str = "pgqueue_0022"
down_revision: str | Sequence[str] | None = "pgqueue_0021"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_NEW_JOB_COLUMNS = ("workflow_id", "pending_dependencies", "workflow_role")

# What downgrade() destroys when it holds data (see pgqueue.migrations.losses).
downgrade_loses = (
    DropsTable("pgqueue_workflows"),
    *(DropsColumn("pgqueue_jobs", name) for name in _NEW_JOB_COLUMNS),
    *(DropsColumn("pgqueue_job_history", name) for name in _NEW_JOB_COLUMNS),
)


def upgrade() -> None:
    op.create_table(
        "pgqueue_workflows",
        sa.Column("id", sa.BigInteger(), sa.Identity(always=False), nullable=False),
        sa.Column("state", sa.Text(), server_default="running", nullable=False),
        sa.Column(
            "created_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False
        ),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("final_job_ids", postgresql.ARRAY(sa.BigInteger()), nullable=False),
        sa.Column("closing_job_id", sa.BigInteger(), nullable=False),
        sa.Column("on_failure_job_id", sa.BigInteger(), nullable=True),
        sa.Column("job_count", sa.Integer(), nullable=False),
        sa.CheckConstraint(
            "state = ANY ('{running,succeeded,failed,cancelled}'::text[])",
            name=op.f("ck_pgqueue_workflows_state_valid"),
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_pgqueue_workflows")),
    )
    op.create_index("ix_pgqueue_workflows_closing_job_id", "pgqueue_workflows", ["closing_job_id"])
    op.create_index("ix_pgqueue_workflows_state", "pgqueue_workflows", ["state"])
    for table in ("pgqueue_jobs", "pgqueue_job_history"):
        op.add_column(table, sa.Column("workflow_id", sa.BigInteger(), nullable=True))
        op.add_column(table, sa.Column("pending_dependencies", sa.Integer(), nullable=True))
        op.add_column(table, sa.Column("workflow_role", sa.SmallInteger(), nullable=True))
    op.create_index(
        "ix_pgqueue_jobs_workflow_id",
        "pgqueue_jobs",
        ["workflow_id"],
        postgresql_where=sa.text("workflow_id IS NOT NULL"),
    )


def downgrade() -> None:
    op.drop_index("ix_pgqueue_jobs_workflow_id", table_name="pgqueue_jobs")
    op.drop_column("pgqueue_job_history", "workflow_role")
    op.drop_column("pgqueue_job_history", "pending_dependencies")
    op.drop_column("pgqueue_job_history", "workflow_id")
    op.drop_column("pgqueue_jobs", "workflow_role")
    op.drop_column("pgqueue_jobs", "pending_dependencies")
    op.drop_column("pgqueue_jobs", "workflow_id")
    op.drop_index("ix_pgqueue_workflows_state", table_name="pgqueue_workflows")
    op.drop_index("ix_pgqueue_workflows_closing_job_id", table_name="pgqueue_workflows")
    op.drop_table("pgqueue_workflows")
