"""pgqueue 0021: durable sleep and signals.

Revision ID: pgqueue_0021
Revises: pgqueue_0020
Create Date: 2026-11-25

- ``pgqueue_job_signals``: one row per signal sent to a job (``pgq.signal``), keyed by job id
  and signal name, holding its JSON payload and when it was stored.
- ``pgqueue_job_suspensions``: one row per job whose handler suspended it (``ctx.sleep``,
  ``ctx.wait_for_signal``): the signal it waits for and its wake time.

Two new tables, so nothing existing is rewritten; their foreign keys to ``pgqueue_jobs`` take a
brief ``SHARE ROW EXCLUSIVE`` lock on it while being added (within ``migration_lock_timeout``),
which blocks no read and no claim for longer than that. Each deletes its rows with the job.
"""

from collections.abc import Sequence

import sqlalchemy as sa

from alembic import op
from pgqueue.migrations.losses import DropsTable

revision: str = "pgqueue_0021"
down_revision: str | Sequence[str] | None = "pgqueue_0020"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# What downgrade() destroys when it holds data (see pgqueue.migrations.losses).
downgrade_loses = (
    DropsTable("pgqueue_job_suspensions"),
    DropsTable("pgqueue_job_signals"),
)


def upgrade() -> None:
    op.create_table(
        "pgqueue_job_signals",
        sa.Column("job_id", sa.BigInteger(), nullable=False),
        sa.Column("name", sa.Text(), nullable=False),
        sa.Column("payload", sa.JSON(), nullable=False),
        sa.Column(
            "sent_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False
        ),
        sa.ForeignKeyConstraint(
            ["job_id"],
            ["pgqueue_jobs.id"],
            name=op.f("fk_pgqueue_job_signals_job_id_pgqueue_jobs"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("job_id", "name", name=op.f("pk_pgqueue_job_signals")),
    )
    op.create_table(
        "pgqueue_job_suspensions",
        sa.Column("job_id", sa.BigInteger(), nullable=False),
        sa.Column("signal", sa.Text(), nullable=True),
        sa.Column("wake_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("suspended_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["job_id"],
            ["pgqueue_jobs.id"],
            name=op.f("fk_pgqueue_job_suspensions_job_id_pgqueue_jobs"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("job_id", name=op.f("pk_pgqueue_job_suspensions")),
    )


def downgrade() -> None:
    op.drop_table("pgqueue_job_suspensions")
    op.drop_table("pgqueue_job_signals")
