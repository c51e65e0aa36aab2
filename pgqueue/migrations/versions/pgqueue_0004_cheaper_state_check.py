"""pgqueue 0004: the job state CHECK as one array constant instead of an IN list.

Revision ID: pgqueue_0004
Revises: pgqueue_0003
Create Date: 2026-11-23

PostgreSQL prepares a table's CHECK expressions again for every statement that inserts or
updates rows, so their cost is paid by every enqueue, claim and outcome. ``state IN (...)`` over
seven states costs more than twice the server time per statement of the array form
(BENCHMARKS.md): ``state = ANY ('{...}'::text[])`` allows the same rows.
Like 0002's change of this constraint, adding it checks the existing rows once.
"""

from collections.abc import Sequence

from alembic import op

revision: str = "pgqueue_0004"
down_revision: str | Sequence[str] | None = "pgqueue_0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

OLD_CHECK = "job_state"
NEW_CHECK = "ck_pgqueue_jobs_state_valid"
# As in pgqueue.models.STATE_CHECK (a revision's text is frozen, so it is repeated).
NEW_RULE = (
    "state::text = ANY ('{queued,waiting,running,retrying,succeeded,failed,cancelled}'::text[])"
)
# As pgqueue_0002 created it.
OLD_RULE = (
    "state IN ('queued', 'waiting', 'running', 'retrying', 'succeeded', 'failed', 'cancelled')"
)


def upgrade() -> None:
    op.drop_constraint(OLD_CHECK, "pgqueue_jobs", type_="check")
    op.create_check_constraint(op.f(NEW_CHECK), "pgqueue_jobs", NEW_RULE)


def downgrade() -> None:
    op.drop_constraint(NEW_CHECK, "pgqueue_jobs", type_="check")
    op.create_check_constraint(op.f(OLD_CHECK), "pgqueue_jobs", OLD_RULE)
