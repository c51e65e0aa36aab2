"""pgqueue 0013: the partitioned history of finished jobs (opt-in layout).

Revision ID: pgqueue_0013
Revises: pgqueue_0012
Create Date: 2026-11-23

- ``pgqueue_job_history``: ``pgqueue_jobs``' columns, partitioned by range of ``finished_at``,
  primary key ``(id, finished_at)``, the dashboard's two filter indexes and one on
  ``finished_at``. Empty and unread until
  ``history="partitioned"`` is set; day partitions are created by ``pgqueue history maintain``.
- ``pgqueue_job_history_default``: its DEFAULT partition, so a finished job whose day has no
  partition yet is still moved (the command reports rows found there).
"""

from collections.abc import Sequence

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql

from alembic import op
from pgqueue.migrations.losses import DropsTable

revision: str = "pgqueue_0013"
down_revision: str | Sequence[str] | None = "pgqueue_0012"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# What downgrade() destroys when it holds data (see pgqueue.migrations.losses).
downgrade_loses = (DropsTable("pgqueue_job_history"),)

_STATE_CHECK = (
    "state::text = ANY ('{queued,waiting,running,retrying,succeeded,failed,cancelled}'::text[])"
)


def upgrade() -> None:
    timestamp = sa.DateTime(timezone=True)
    op.create_table(
        "pgqueue_job_history",
        sa.Column("id", sa.BigInteger(), nullable=False),
        sa.Column("finished_at", timestamp, nullable=False),
        sa.Column("task_name", sa.Text(), nullable=False),
        sa.Column("queue", sa.Text(), nullable=False),
        sa.Column("args", sa.JSON(), nullable=False),
        sa.Column("kwargs", sa.JSON(), nullable=False),
        sa.Column("state", sa.String(length=16), nullable=False),
        sa.Column("priority", sa.SmallInteger(), nullable=False),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("max_attempts", sa.Integer(), nullable=False),
        sa.Column("run_at", timestamp, nullable=False),
        sa.Column("created_at", timestamp, nullable=False),
        sa.Column("started_at", timestamp, nullable=True),
        sa.Column("updated_at", timestamp, nullable=False),
        sa.Column("last_error", sa.Text(), nullable=True),
        sa.Column("errors", postgresql.JSONB(astext_type=sa.Text()), nullable=False),
        sa.Column("result", sa.JSON(), nullable=True),
        sa.Column("lease_owner", sa.Text(), nullable=True),
        sa.Column("lease_token", sa.Uuid(), nullable=True),
        sa.Column("lease_expires_at", timestamp, nullable=True),
        sa.Column("unique_key", sa.Text(), nullable=True),
        sa.Column("cancel_requested", sa.Boolean(), nullable=False),
        sa.Column("atomic", sa.Boolean(), nullable=False),
        sa.Column("depends_on", postgresql.ARRAY(sa.BigInteger()), nullable=True),
        sa.Column("dependents", postgresql.ARRAY(sa.BigInteger()), nullable=True),
        sa.Column("trace_context", sa.JSON(), nullable=True),
        sa.Column("awaited", sa.Boolean(), nullable=False),
        sa.Column("snoozes", sa.Integer(), nullable=False),
        sa.Column("progress", sa.Float(), nullable=True),
        sa.Column("progress_message", sa.Text(), nullable=True),
        sa.Column("progress_at", timestamp, nullable=True),
        sa.Column("concurrency_key", sa.Text(), nullable=True),
        sa.CheckConstraint(_STATE_CHECK, name=op.f("ck_pgqueue_job_history_state_valid")),
        sa.PrimaryKeyConstraint("id", "finished_at", name=op.f("pk_pgqueue_job_history")),
        postgresql_partition_by="RANGE (finished_at)",
    )
    op.create_index(
        "ix_pgqueue_job_history_queue_state_id",
        "pgqueue_job_history",
        ["queue", "state", "id"],
    )
    op.create_index(
        "ix_pgqueue_job_history_task_name_state_id",
        "pgqueue_job_history",
        ["task_name", "state", "id"],
    )
    op.create_index("ix_pgqueue_job_history_finished_at", "pgqueue_job_history", ["finished_at"])
    op.execute("CREATE TABLE pgqueue_job_history_default PARTITION OF pgqueue_job_history DEFAULT")


def downgrade() -> None:
    # Dropping the parent drops every partition, the DEFAULT one included.
    op.drop_table("pgqueue_job_history")
