"""pgqueue 0005: statistics for the queue-control table, kept fresh by autoanalyze.

Revision ID: pgqueue_0005
Revises: pgqueue_0004
Create Date: 2026-11-22

The claim reads ``pgqueue_queues`` (paused and limited queues) on every run. The table holds a
handful of rows and changes rarely, so autovacuum's default threshold (50 changed rows) is
never reached and it is never analyzed. A never-analyzed table is planned as ten pages of rows
(hundreds here): the claim with queue limits then plans one ticket scan per imagined limited queue,
and its estimated cost passes ``jit_above_cost`` on servers with JIT on, so each claim is
JIT-compiled. Analyzed once now, and again after any change, it is planned as the
few rows it has.
"""

from collections.abc import Sequence

from alembic import op

revision: str = "pgqueue_0005"
down_revision: str | Sequence[str] | None = "pgqueue_0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.execute(
        "ALTER TABLE pgqueue_queues SET "
        "(autovacuum_analyze_threshold = 1, autovacuum_analyze_scale_factor = 0.0)"
    )
    op.execute("ANALYZE pgqueue_queues")


def downgrade() -> None:
    op.execute(
        "ALTER TABLE pgqueue_queues RESET (autovacuum_analyze_threshold, "
        "autovacuum_analyze_scale_factor)"
    )
