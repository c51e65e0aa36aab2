"""pgqueue 0002: periodic ticks, queue pause/limits, job dependencies, the WAITING state.

Revision ID: pgqueue_0002
Revises: pgqueue_0001
Create Date: 2026-11-22

The state column is text with a CHECK constraint generated from ``JobState``; adding ``waiting``
replaces that constraint (no enum type to alter). The new job columns are nullable or have
constant defaults, so adding them rewrites nothing on a large ``pgqueue_jobs``.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql

from alembic import op
from pgqueue.migrations.losses import DropsColumn, DropsTable, RewritesRows

revision: str = "pgqueue_0002"
down_revision: str | Sequence[str] | None = "pgqueue_0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# What downgrade() destroys when it holds data (see pgqueue.migrations.losses).
downgrade_loses = (
    DropsTable("pgqueue_periodic_ticks"),
    DropsTable("pgqueue_queues"),
    DropsColumn("pgqueue_jobs", "dependents"),
    DropsColumn("pgqueue_jobs", "depends_on"),
    RewritesRows("pgqueue_jobs", "state", "waiting", "cancels jobs waiting for dependencies"),
)

# The name 0001 got for the Enum's constraint (created without the naming convention).
STATE_CHECK = "job_state"
OLD_STATES = ("queued", "running", "retrying", "succeeded", "failed", "cancelled")
NEW_STATES = ("queued", "waiting", "running", "retrying", "succeeded", "failed", "cancelled")


def _state_check(states: Sequence[str]) -> str:
    return "state IN (" + ", ".join(f"'{s}'" for s in states) + ")"


def upgrade() -> None:
    op.drop_constraint(STATE_CHECK, "pgqueue_jobs", type_="check")
    op.create_check_constraint(op.f(STATE_CHECK), "pgqueue_jobs", _state_check(NEW_STATES))
    op.add_column("pgqueue_jobs", sa.Column("depends_on", postgresql.ARRAY(sa.BigInteger())))
    op.add_column("pgqueue_jobs", sa.Column("dependents", postgresql.ARRAY(sa.BigInteger())))
    op.create_table(
        "pgqueue_queues",
        sa.Column("name", sa.Text(), nullable=False),
        sa.Column("paused", sa.Boolean(), server_default=sa.text("false"), nullable=False),
        sa.Column("concurrency_limit", sa.Integer(), nullable=True),
        sa.Column("running", sa.Integer(), server_default="0", nullable=False),
        sa.Column(
            "updated_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("now()"),
            nullable=False,
        ),
        sa.CheckConstraint(
            "concurrency_limit IS NULL OR concurrency_limit >= 1",
            name=op.f("ck_pgqueue_queues_limit_positive"),
        ),
        sa.PrimaryKeyConstraint("name", name=op.f("pk_pgqueue_queues")),
    )
    op.create_table(
        "pgqueue_periodic_ticks",
        sa.Column("schedule_name", sa.Text(), nullable=False),
        sa.Column("scheduled_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("job_id", sa.BigInteger(), nullable=True),
        sa.Column(
            "created_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("now()"),
            nullable=False,
        ),
        sa.PrimaryKeyConstraint(
            "schedule_name", "scheduled_at", name=op.f("pk_pgqueue_periodic_ticks")
        ),
    )


def downgrade() -> None:
    op.drop_table("pgqueue_periodic_ticks")
    op.drop_table("pgqueue_queues")
    op.drop_column("pgqueue_jobs", "dependents")
    op.drop_column("pgqueue_jobs", "depends_on")
    # Jobs blocked on dependencies cannot be represented before this revision.
    op.execute("UPDATE pgqueue_jobs SET state = 'cancelled' WHERE state = 'waiting'")
    op.drop_constraint(STATE_CHECK, "pgqueue_jobs", type_="check")
    op.create_check_constraint(op.f(STATE_CHECK), "pgqueue_jobs", _state_check(OLD_STATES))
