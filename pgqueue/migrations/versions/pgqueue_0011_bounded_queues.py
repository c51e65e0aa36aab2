"""pgqueue 0011: bounded queues, the ``max_depth`` of a queue's control row.

Revision ID: pgqueue_0011
Revises: pgqueue_0010
Create Date: 2026-11-23

A nullable column without a default (no table rewrite) and its check; ``pgqueue_queues`` holds
a handful of rows, so validating the check reads almost nothing.
"""

from collections.abc import Sequence

import sqlalchemy as sa

from alembic import op
from pgqueue.migrations.losses import DropsColumn

revision: str = "pgqueue_0011"
down_revision: str | Sequence[str] | None = "pgqueue_0010"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# What downgrade() destroys when it holds data (see pgqueue.migrations.losses).
downgrade_loses = (DropsColumn("pgqueue_queues", "max_depth"),)


def upgrade() -> None:
    op.add_column("pgqueue_queues", sa.Column("max_depth", sa.Integer(), nullable=True))
    op.create_check_constraint(
        op.f("ck_pgqueue_queues_max_depth_positive"),
        "pgqueue_queues",
        "max_depth IS NULL OR max_depth >= 1",
    )


def downgrade() -> None:
    op.drop_constraint(
        op.f("ck_pgqueue_queues_max_depth_positive"), "pgqueue_queues", type_="check"
    )
    op.drop_column("pgqueue_queues", "max_depth")
