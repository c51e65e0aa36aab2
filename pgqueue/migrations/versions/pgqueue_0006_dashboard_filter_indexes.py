"""pgqueue 0006: indexes for the dashboard's filters, queue list and counts.

Revision ID: pgqueue_0006
Revises: pgqueue_0005
Create Date: 2026-11-22

The dashboard lists the newest jobs of a queue or a task in a state, lists the queues that have
jobs, and counts jobs per queue and state (up to a cap). Without these indexes each of those
reads the whole history of ``pgqueue_jobs``; with them each reads a bounded stretch of one
index: ``(queue, state, id)`` for queue and state filters, the loose scan over queue names and
the capped counts, ``(task_name, state, id)`` for task filters.

``CREATE INDEX`` blocks writes to ``pgqueue_jobs`` while it builds (a few seconds per million
rows); on a large table, run this upgrade when a short pause of enqueues is acceptable.
"""

from collections.abc import Sequence

from alembic import op

revision: str = "pgqueue_0006"
down_revision: str | Sequence[str] | None = "pgqueue_0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_index(
        "ix_pgqueue_jobs_queue_state_id", "pgqueue_jobs", ["queue", "state", "id"], unique=False
    )
    op.create_index(
        "ix_pgqueue_jobs_task_name_state_id",
        "pgqueue_jobs",
        ["task_name", "state", "id"],
        unique=False,
    )


def downgrade() -> None:
    op.drop_index("ix_pgqueue_jobs_task_name_state_id", table_name="pgqueue_jobs")
    op.drop_index("ix_pgqueue_jobs_queue_state_id", table_name="pgqueue_jobs")
