"""pgqueue 0015: whether each worker's claims work, in the worker registry.

Revision ID: pgqueue_0015
Revises: pgqueue_0014
Create Date: 2026-11-25

- ``pgqueue_workers.claim_error``: the error of the worker's latest claim while its claims fail
  (null while they work), so a worker that is alive but claims nothing shows as unhealthy.
- ``pgqueue_workers.claim_failing_since``: when its claims began to fail (database clock).

Both nullable with no default: adding them rewrites nothing and takes a moment's lock.
"""

from collections.abc import Sequence

import sqlalchemy as sa

from alembic import op
from pgqueue.migrations.losses import DropsColumn

revision: str = "pgqueue_0015"
down_revision: str | Sequence[str] | None = "pgqueue_0014"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# What downgrade() destroys when it holds data (see pgqueue.migrations.losses).
downgrade_loses = (
    DropsColumn("pgqueue_workers", "claim_failing_since"),
    DropsColumn("pgqueue_workers", "claim_error"),
)


def upgrade() -> None:
    op.add_column("pgqueue_workers", sa.Column("claim_error", sa.Text(), nullable=True))
    op.add_column(
        "pgqueue_workers",
        sa.Column("claim_failing_since", sa.DateTime(timezone=True), nullable=True),
    )


def downgrade() -> None:
    op.drop_column("pgqueue_workers", "claim_failing_since")
    op.drop_column("pgqueue_workers", "claim_error")
