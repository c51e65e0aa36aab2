"""pgqueue 0028: where each worker runs its handlers, in the worker registry.

Revision ID: pgqueue_0028
Revises: pgqueue_0027
Create Date: 2026-11-30

- ``pgqueue_workers.pool``: the worker's pool (``Settings.pool``): ``thread`` or ``process``,
  so operators see which workers can stop a handler at its hard timeout. Null for rows written
  by earlier versions.

Nullable with no default: adding it rewrites nothing and takes a moment's lock.
"""

from collections.abc import Sequence

import sqlalchemy as sa

from alembic import op
from pgqueue.migrations.losses import DropsColumn

revision: str = "pgqueue_0028"
down_revision: str | Sequence[str] | None = "pgqueue_0027"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# What downgrade() destroys when it holds data (see pgqueue.migrations.losses).
downgrade_loses = (DropsColumn("pgqueue_workers", "pool"),)


def upgrade() -> None:
    op.add_column("pgqueue_workers", sa.Column("pool", sa.Text(), nullable=True))


def downgrade() -> None:
    op.drop_column("pgqueue_workers", "pool")
