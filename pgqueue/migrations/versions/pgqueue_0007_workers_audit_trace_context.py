"""pgqueue 0007: the worker registry, the audit log of bulk actions, and a job's trace context.

Revision ID: pgqueue_0007
Revises: pgqueue_0006
Create Date: 2026-11-22

- ``pgqueue_workers``: one row per running worker process, written at start, refreshed by its
  heartbeat and deleted at a clean stop; rows whose ``last_seen_at`` is older than the stale
  interval are deleted by any worker's maintenance.
- ``pgqueue_audit``: one row per bulk action (retry, cancel or delete by filter), written in
  the action's own transaction.
- ``pgqueue_jobs.trace_context``: the enqueuing code's trace context (W3C ``traceparent`` and
  ``tracestate``), null unless tracing is enabled. A nullable column without a default, so
  adding it rewrites nothing.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql

from alembic import op
from pgqueue.migrations.losses import DropsColumn, DropsTable

revision: str = "pgqueue_0007"
down_revision: str | Sequence[str] | None = "pgqueue_0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# What downgrade() destroys when it holds data (see pgqueue.migrations.losses).
downgrade_loses = (
    DropsColumn("pgqueue_jobs", "trace_context"),
    DropsTable("pgqueue_audit"),
    DropsTable("pgqueue_workers"),
)


def upgrade() -> None:
    op.create_table(
        "pgqueue_workers",
        sa.Column("id", sa.Text(), nullable=False),
        sa.Column("host", sa.Text(), nullable=False),
        sa.Column("pid", sa.Integer(), nullable=False),
        sa.Column("queues", postgresql.ARRAY(sa.Text()), nullable=False),
        sa.Column("concurrency", sa.Integer(), nullable=False),
        sa.Column("version", sa.Text(), nullable=False),
        sa.Column(
            "started_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False
        ),
        sa.Column(
            "last_seen_at",
            sa.DateTime(timezone=True),
            server_default=sa.func.now(),
            nullable=False,
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_pgqueue_workers")),
    )
    op.create_table(
        "pgqueue_audit",
        sa.Column("id", sa.BigInteger(), sa.Identity(always=False), nullable=False),
        sa.Column("at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False),
        sa.Column("actor", sa.Text(), nullable=False),
        sa.Column("source", sa.Text(), nullable=False),
        sa.Column("action", sa.Text(), nullable=False),
        sa.Column("filter", postgresql.JSONB(astext_type=sa.Text()), nullable=False),
        sa.Column("count", sa.Integer(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_pgqueue_audit")),
    )
    op.add_column("pgqueue_jobs", sa.Column("trace_context", sa.JSON(), nullable=True))


def downgrade() -> None:
    op.drop_column("pgqueue_jobs", "trace_context")
    op.drop_table("pgqueue_audit")
    op.drop_table("pgqueue_workers")
