"""pgqueue 0027: operators pause and resume periodic schedules.

Revision ID: pgqueue_0027
Revises: pgqueue_0026
Create Date: 2026-11-30

- ``pgqueue_schedules``: one row per schedule an operator paused or resumed (``paused``, and
  when it last changed), read by every scheduler at its next pass and by the insert of each
  tick. A new, empty table: nothing else is rewritten or locked.

The audit records of the actions on one job or one schedule (reschedule, run now, priority,
signal, retry, cancel, delete, pause, resume, run a schedule now) need no new column:
``pgqueue_audit.filter`` holds what the action was taken on (``{"job_id": ...}`` or
``{"schedule": ...}``) with the values it wrote.
"""

from collections.abc import Sequence

import sqlalchemy as sa

from alembic import op
from pgqueue.migrations.losses import DropsTable

revision: str = "pgqueue_0027"
down_revision: str | Sequence[str] | None = "pgqueue_0026"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# What downgrade() destroys when it holds data (see pgqueue.migrations.losses).
downgrade_loses = (DropsTable("pgqueue_schedules"),)


def upgrade() -> None:
    op.create_table(
        "pgqueue_schedules",
        sa.Column("name", sa.Text(), nullable=False),
        sa.Column("paused", sa.Boolean(), server_default=sa.text("false"), nullable=False),
        sa.Column(
            "changed_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False
        ),
        sa.PrimaryKeyConstraint("name", name=op.f("pk_pgqueue_schedules")),
    )


def downgrade() -> None:
    op.drop_table("pgqueue_schedules")
