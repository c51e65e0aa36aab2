"""pgqueue 0001: the jobs table, the ticket table, and the wake-up trigger.

Revision ID: pgqueue_0001
Revises:
Create Date: 2026-11-21

Also sets autovacuum on the ticket table: every claim deletes rows from it, so it is vacuumed
after a fixed number of dead rows (not a fraction of a table that is usually near-empty), with no
cost delay, which keeps it small and its claim index tight under sustained load.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql

from alembic import op
from pgqueue.migrations.losses import DropsTable

# A statement-level trigger: one NOTIFY per inserted batch and queue, not per row. The payload is
# the queue name, followed by the epoch of the earliest run_at when that is in the future, so an
# idle worker knows when to wake for a delayed job.
NOTIFY_FUNCTION = """
CREATE FUNCTION pgqueue_notify_tickets() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify(
        'pgqueue',
        CASE WHEN first_run_at <= now() THEN queue
             ELSE queue || ' ' || extract(epoch FROM first_run_at)::text END
    )
    FROM (SELECT queue, min(run_at) AS first_run_at FROM new_tickets GROUP BY queue) AS q;
    RETURN NULL;
END
$$
"""

NOTIFY_TRIGGER = """
CREATE TRIGGER pgqueue_message_queue_notify
AFTER INSERT ON pgqueue_message_queue
REFERENCING NEW TABLE AS new_tickets
FOR EACH STATEMENT EXECUTE FUNCTION pgqueue_notify_tickets()
"""

TICKET_AUTOVACUUM = """
ALTER TABLE pgqueue_message_queue SET (
    autovacuum_vacuum_scale_factor = 0.0,
    autovacuum_vacuum_threshold = 2000,
    autovacuum_vacuum_insert_scale_factor = 0.0,
    autovacuum_vacuum_insert_threshold = 5000,
    autovacuum_analyze_scale_factor = 0.0,
    autovacuum_analyze_threshold = 5000,
    autovacuum_vacuum_cost_delay = 0
)
"""

JOBS_AUTOVACUUM = """
ALTER TABLE pgqueue_jobs SET (
    autovacuum_vacuum_scale_factor = 0.02,
    autovacuum_analyze_scale_factor = 0.02,
    autovacuum_vacuum_cost_delay = 1
)
"""

# revision identifiers, used by Alembic.
revision: str = "pgqueue_0001"
down_revision: str | Sequence[str] | None = None
branch_labels: str | Sequence[str] | None = ("pgqueue",)
depends_on: str | Sequence[str] | None = None

# What downgrade() destroys when it holds data (see pgqueue.migrations.losses).
downgrade_loses = (
    DropsTable("pgqueue_message_queue"),
    DropsTable("pgqueue_jobs"),
)


def upgrade() -> None:
    op.create_table(
        "pgqueue_jobs",
        sa.Column("id", sa.BigInteger(), sa.Identity(always=False), nullable=False),
        sa.Column("task_name", sa.Text(), nullable=False),
        sa.Column("queue", sa.Text(), server_default="default", nullable=False),
        sa.Column("args", sa.JSON(), server_default=sa.text("'[]'::json"), nullable=False),
        sa.Column("kwargs", sa.JSON(), server_default=sa.text("'{}'::json"), nullable=False),
        sa.Column(
            "state",
            sa.Enum(
                "queued",
                "running",
                "retrying",
                "succeeded",
                "failed",
                "cancelled",
                name="job_state",
                native_enum=False,
                create_constraint=True,
                length=16,
            ),
            server_default="queued",
            nullable=False,
        ),
        sa.Column("priority", sa.SmallInteger(), server_default="0", nullable=False),
        sa.Column("attempts", sa.Integer(), server_default="0", nullable=False),
        sa.Column("max_attempts", sa.Integer(), server_default="3", nullable=False),
        sa.Column(
            "run_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False
        ),
        sa.Column(
            "created_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("now()"),
            nullable=False,
        ),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column(
            "updated_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("now()"),
            nullable=False,
        ),
        sa.Column("last_error", sa.Text(), nullable=True),
        sa.Column(
            "errors",
            postgresql.JSONB(astext_type=sa.Text()),
            server_default=sa.text("'[]'::jsonb"),
            nullable=False,
        ),
        sa.Column("result", sa.JSON(), nullable=True),
        sa.Column("lease_owner", sa.Text(), nullable=True),
        sa.Column("lease_token", sa.Uuid(), nullable=True),
        sa.Column("lease_expires_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("unique_key", sa.Text(), nullable=True),
        sa.Column(
            "cancel_requested", sa.Boolean(), server_default=sa.text("false"), nullable=False
        ),
        sa.Column("atomic", sa.Boolean(), server_default=sa.text("false"), nullable=False),
        sa.CheckConstraint("attempts >= 0", name=op.f("ck_pgqueue_jobs_attempts_non_negative")),
        sa.CheckConstraint("max_attempts >= 1", name=op.f("ck_pgqueue_jobs_max_attempts_positive")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_pgqueue_jobs")),
    )
    op.create_index(
        "ix_pgqueue_jobs_finished_at",
        "pgqueue_jobs",
        ["finished_at"],
        unique=False,
        postgresql_where=sa.text("finished_at IS NOT NULL"),
    )
    op.create_index(
        "ix_pgqueue_jobs_lease_expires_at",
        "pgqueue_jobs",
        ["lease_expires_at"],
        unique=False,
        postgresql_where=sa.text("state = 'running'"),
    )
    op.create_index(
        "uq_pgqueue_jobs_unique_key_active",
        "pgqueue_jobs",
        ["unique_key"],
        unique=True,
        postgresql_where=sa.text(
            "unique_key IS NOT NULL AND state IN ('queued', 'running', 'retrying')"
        ),
    )
    op.create_table(
        "pgqueue_message_queue",
        sa.Column("job_id", sa.BigInteger(), nullable=False),
        sa.Column("queue", sa.Text(), nullable=False),
        sa.Column("priority", sa.SmallInteger(), server_default="0", nullable=False),
        sa.Column(
            "run_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False
        ),
        sa.Column("atomic", sa.Boolean(), server_default=sa.text("false"), nullable=False),
        sa.ForeignKeyConstraint(
            ["job_id"],
            ["pgqueue_jobs.id"],
            name=op.f("fk_pgqueue_message_queue_job_id_pgqueue_jobs"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("job_id", name=op.f("pk_pgqueue_message_queue")),
    )
    op.create_index(
        "ix_pgqueue_message_queue_claim",
        "pgqueue_message_queue",
        ["atomic", "priority", "run_at", "job_id"],
        unique=False,
        postgresql_include=["queue"],
    )
    op.execute(NOTIFY_FUNCTION)
    op.execute(NOTIFY_TRIGGER)
    op.execute(TICKET_AUTOVACUUM)
    op.execute(JOBS_AUTOVACUUM)


def downgrade() -> None:
    op.execute("DROP TRIGGER IF EXISTS pgqueue_message_queue_notify ON pgqueue_message_queue")
    op.execute("DROP FUNCTION IF EXISTS pgqueue_notify_tickets()")
    op.drop_index(
        "ix_pgqueue_message_queue_claim",
        table_name="pgqueue_message_queue",
        postgresql_include=["queue"],
    )
    op.drop_table("pgqueue_message_queue")
    op.drop_index(
        "uq_pgqueue_jobs_unique_key_active",
        table_name="pgqueue_jobs",
        postgresql_where=sa.text(
            "unique_key IS NOT NULL AND state IN ('queued', 'running', 'retrying')"
        ),
    )
    op.drop_index(
        "ix_pgqueue_jobs_lease_expires_at",
        table_name="pgqueue_jobs",
        postgresql_where=sa.text("state = 'running'"),
    )
    op.drop_index(
        "ix_pgqueue_jobs_finished_at",
        table_name="pgqueue_jobs",
        postgresql_where=sa.text("finished_at IS NOT NULL"),
    )
    op.drop_table("pgqueue_jobs")
