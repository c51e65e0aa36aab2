"""pgqueue 0012: flow control, per-key concurrency limits and rate limits.

Revision ID: pgqueue_0012
Revises: pgqueue_0011
Create Date: 2026-11-23

- ``pgqueue_jobs.concurrency_key``: the job's concurrency key; ``pgqueue_message_queue.key_hash``
  and ``keyed``: its hash and whether it has one, on its tickets. Nullable without a default, or
  with a constant default, so adding them rewrites nothing. A partial index holds the keyed
  tickets only.
- ``pgqueue_queues.rate_limit``, ``rate_per`` and ``recent_starts``: a queue's rate limit and
  the sliding window of its latest starts, on the row the claim locks.
- ``pgqueue_concurrency_keys``: one row per key (its limit from the task, its RUNNING counter,
  its latest starts).
- ``pgqueue_key_limits``: operators' overrides by key or key prefix.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql

from alembic import op
from pgqueue.migrations.losses import DropsColumn, DropsTable

revision: str = "pgqueue_0012"
down_revision: str | Sequence[str] | None = "pgqueue_0011"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# What downgrade() destroys when it holds data (see pgqueue.migrations.losses).
downgrade_loses = (
    DropsTable("pgqueue_key_limits"),
    DropsTable("pgqueue_concurrency_keys"),
    DropsColumn("pgqueue_queues", "recent_starts"),
    DropsColumn("pgqueue_queues", "rate_per"),
    DropsColumn("pgqueue_queues", "rate_limit"),
    DropsColumn("pgqueue_message_queue", "keyed", default=False),
    DropsColumn("pgqueue_message_queue", "key_hash"),
    DropsColumn("pgqueue_jobs", "concurrency_key"),
)

_RATE_VALID = "(rate_limit IS NULL AND rate_per IS NULL) OR (rate_limit >= 1 AND rate_per > 0)"


def upgrade() -> None:
    op.add_column("pgqueue_jobs", sa.Column("concurrency_key", sa.Text(), nullable=True))
    op.add_column("pgqueue_message_queue", sa.Column("key_hash", sa.Integer(), nullable=True))
    op.add_column(
        "pgqueue_message_queue",
        sa.Column("keyed", sa.Boolean(), server_default=sa.text("false"), nullable=False),
    )
    op.create_index(
        "ix_pgqueue_message_queue_keyed",
        "pgqueue_message_queue",
        ["key_hash", "atomic", "priority", "run_at", "job_id"],
        postgresql_include=["queue"],
        postgresql_where=sa.text("key_hash IS NOT NULL"),
    )
    op.add_column("pgqueue_queues", sa.Column("rate_limit", sa.Integer(), nullable=True))
    op.add_column("pgqueue_queues", sa.Column("rate_per", sa.Float(), nullable=True))
    op.add_column(
        "pgqueue_queues",
        sa.Column("recent_starts", postgresql.ARRAY(sa.DateTime(timezone=True)), nullable=True),
    )
    op.create_check_constraint(op.f("ck_pgqueue_queues_rate_valid"), "pgqueue_queues", _RATE_VALID)
    op.create_table(
        "pgqueue_concurrency_keys",
        sa.Column("key", sa.Text(), nullable=False),
        sa.Column("key_limit", sa.Integer(), nullable=True),
        sa.Column("running", sa.Integer(), server_default="0", nullable=False),
        sa.Column("recent_starts", postgresql.ARRAY(sa.DateTime(timezone=True)), nullable=True),
        sa.CheckConstraint(
            "key_limit IS NULL OR key_limit >= 1",
            name=op.f("ck_pgqueue_concurrency_keys_limit_positive"),
        ),
        sa.PrimaryKeyConstraint("key", name=op.f("pk_pgqueue_concurrency_keys")),
    )
    op.create_table(
        "pgqueue_key_limits",
        sa.Column("prefix", sa.Text(), nullable=False),
        sa.Column("key_limit", sa.Integer(), nullable=True),
        sa.Column("rate_limit", sa.Integer(), nullable=True),
        sa.Column("rate_per", sa.Float(), nullable=True),
        sa.Column(
            "updated_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False
        ),
        sa.CheckConstraint(
            "key_limit IS NULL OR key_limit >= 1",
            name=op.f("ck_pgqueue_key_limits_limit_positive"),
        ),
        sa.CheckConstraint(_RATE_VALID, name=op.f("ck_pgqueue_key_limits_rate_valid")),
        sa.PrimaryKeyConstraint("prefix", name=op.f("pk_pgqueue_key_limits")),
    )


def downgrade() -> None:
    op.drop_table("pgqueue_key_limits")
    op.drop_table("pgqueue_concurrency_keys")
    op.drop_constraint(op.f("ck_pgqueue_queues_rate_valid"), "pgqueue_queues", type_="check")
    op.drop_column("pgqueue_queues", "recent_starts")
    op.drop_column("pgqueue_queues", "rate_per")
    op.drop_column("pgqueue_queues", "rate_limit")
    op.drop_index("ix_pgqueue_message_queue_keyed", table_name="pgqueue_message_queue")
    op.drop_column("pgqueue_message_queue", "keyed")
    op.drop_column("pgqueue_message_queue", "key_hash")
    op.drop_column("pgqueue_jobs", "concurrency_key")
