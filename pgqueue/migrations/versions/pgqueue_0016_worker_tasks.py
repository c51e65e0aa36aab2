"""pgqueue 0016: the tasks each worker registers, in the worker registry.

Revision ID: pgqueue_0016
Revises: pgqueue_0015
Create Date: 2026-12-02

- ``pgqueue_workers.tasks``: the names of the tasks the worker registers. A worker claims only
  jobs of its tasks, so ``pgqueue explain`` and the metrics can tell a job that waits because no
  live worker registers its task. Null for rows written by earlier versions.

Nullable with no default: adding it rewrites nothing and takes a moment's lock.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql

from alembic import op
from pgqueue.migrations.losses import DropsColumn

revision: str = "pgqueue_0016"
down_revision: str | Sequence[str] | None = "pgqueue_0015"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# What downgrade() destroys when it holds data (see pgqueue.migrations.losses).
downgrade_loses = (DropsColumn("pgqueue_workers", "tasks"),)


def upgrade() -> None:
    op.add_column("pgqueue_workers", sa.Column("tasks", postgresql.ARRAY(sa.Text()), nullable=True))


def downgrade() -> None:
    op.drop_column("pgqueue_workers", "tasks")
