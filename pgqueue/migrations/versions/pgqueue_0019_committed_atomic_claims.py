"""pgqueue 0019: atomic jobs are claimed in a committed statement; their run records go.

Revision ID: pgqueue_0019
Revises: pgqueue_0018
Create Date: 2026-11-25

- ``pgqueue_atomic_runs`` is dropped. An atomic job's claim now commits on its own, counting the
  attempt before the handler's transaction begins, so no record of a run is needed to count an
  attempt whose transaction was lost. Workers of a version that still records runs fail to
  record one once the table is gone: their claim rolls back with the job unrun and untouched,
  and a worker of this version runs it.

Dropping a table nobody reads takes a short exclusive lock on it and on ``pgqueue_jobs``'s
foreign-key trigger list; the downgrade recreates it empty.
"""

from collections.abc import Sequence

import sqlalchemy as sa

from alembic import op

revision: str = "pgqueue_0019"
down_revision: str | Sequence[str] | None = "pgqueue_0018"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.drop_table("pgqueue_atomic_runs")


def downgrade() -> None:
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
