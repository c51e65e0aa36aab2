"""pgqueue 0025: the dashboard's state indexes leave running jobs out.

Revision ID: pgqueue_0025
Revises: pgqueue_0024
Create Date: 2026-11-26

``ix_pgqueue_jobs_queue_state_id`` and ``ix_pgqueue_jobs_task_name_state_id`` become partial,
``WHERE state <> 'running'`` (``models.LISTED_BY_STATE``). A claim moves a job to RUNNING with
an update that is never heap-only, so it wrote a new entry into every index of
``pgqueue_jobs``; now it writes two (the primary key's and the lease index's) instead of four.
The running jobs, as many as the workers' slots, are listed by the lease index, which the
dashboard's statements read for them.

Online when it can be, as 0023: each new index is built ``CONCURRENTLY`` under a temporary
name, the old one dropped ``CONCURRENTLY`` and the new one renamed, so enqueues and workers keep
writing ``pgqueue_jobs`` meanwhile; this needs Alembic to own the migration's transaction
(``pgqueue migrate``, ``PgQueue.migrate()``, a host's Alembic whose ``env.py`` begins it, or
offline SQL). In a transaction its caller opened (``pgqueue.migrations.upgrade(connection)``
from a host's revision) the indexes are built in that transaction: writes to ``pgqueue_jobs``
wait for the builds (a scan of the table each, seconds per million rows). The downgrade puts
the full indexes back the same way. Statements of either version read either index: those of
this one name the predicate, and an index without one serves them too.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa

from alembic import op
from pgqueue.migrations.online import can_leave_transaction, outside_transaction

revision: str = "pgqueue_0025"
down_revision: str | Sequence[str] | None = "pgqueue_0024"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

LISTED_BY_STATE = "state <> 'running'"
# Index name -> the name its replacement is built under, and its columns.
INDEXES = {
    "ix_pgqueue_jobs_queue_state_id": (
        "ix_pgqueue_jobs_queue_state_id_swap",
        ["queue", "state", "id"],
    ),
    "ix_pgqueue_jobs_task_name_state_id": (
        "ix_pgqueue_jobs_task_name_state_id_swap",
        ["task_name", "state", "id"],
    ),
}

# The online swaps, statement by statement (written out: no SQL is formatted). An interrupted
# earlier run may have left an INVALID build behind: each swap first drops it.
_ONLINE_UPGRADE = (
    "DROP INDEX CONCURRENTLY IF EXISTS ix_pgqueue_jobs_queue_state_id_swap",
    "CREATE INDEX CONCURRENTLY ix_pgqueue_jobs_queue_state_id_swap"
    " ON pgqueue_jobs (queue, state, id) WHERE state <> 'running'",
    "DROP INDEX CONCURRENTLY IF EXISTS ix_pgqueue_jobs_queue_state_id",
    "ALTER INDEX ix_pgqueue_jobs_queue_state_id_swap RENAME TO ix_pgqueue_jobs_queue_state_id",
    "DROP INDEX CONCURRENTLY IF EXISTS ix_pgqueue_jobs_task_name_state_id_swap",
    "CREATE INDEX CONCURRENTLY ix_pgqueue_jobs_task_name_state_id_swap"
    " ON pgqueue_jobs (task_name, state, id) WHERE state <> 'running'",
    "DROP INDEX CONCURRENTLY IF EXISTS ix_pgqueue_jobs_task_name_state_id",
    "ALTER INDEX ix_pgqueue_jobs_task_name_state_id_swap"
    " RENAME TO ix_pgqueue_jobs_task_name_state_id",
)
_ONLINE_DOWNGRADE = (
    "DROP INDEX CONCURRENTLY IF EXISTS ix_pgqueue_jobs_queue_state_id_swap",
    "CREATE INDEX CONCURRENTLY ix_pgqueue_jobs_queue_state_id_swap"
    " ON pgqueue_jobs (queue, state, id)",
    "DROP INDEX CONCURRENTLY IF EXISTS ix_pgqueue_jobs_queue_state_id",
    "ALTER INDEX ix_pgqueue_jobs_queue_state_id_swap RENAME TO ix_pgqueue_jobs_queue_state_id",
    "DROP INDEX CONCURRENTLY IF EXISTS ix_pgqueue_jobs_task_name_state_id_swap",
    "CREATE INDEX CONCURRENTLY ix_pgqueue_jobs_task_name_state_id_swap"
    " ON pgqueue_jobs (task_name, state, id)",
    "DROP INDEX CONCURRENTLY IF EXISTS ix_pgqueue_jobs_task_name_state_id",
    "ALTER INDEX ix_pgqueue_jobs_task_name_state_id_swap"
    " RENAME TO ix_pgqueue_jobs_task_name_state_id",
)
_RENAMES = {
    "ix_pgqueue_jobs_queue_state_id": (
        "ALTER INDEX ix_pgqueue_jobs_queue_state_id_swap RENAME TO ix_pgqueue_jobs_queue_state_id"
    ),
    "ix_pgqueue_jobs_task_name_state_id": (
        "ALTER INDEX ix_pgqueue_jobs_task_name_state_id_swap"
        " RENAME TO ix_pgqueue_jobs_task_name_state_id"
    ),
}


def _swap_indexes(online: Sequence[str], predicate: str | None) -> None:
    """Replace both indexes by ones on ``predicate`` (None: every row), under the same names:
    online when Alembic owns the transaction, else in the caller's (see the module)."""
    context = op.get_context()
    if can_leave_transaction(context):
        with outside_transaction(context):
            for statement in online:
                op.execute(statement)
        return
    where = None if predicate is None else sa.text(predicate)
    for name, (swap, columns) in INDEXES.items():
        op.create_index(swap, "pgqueue_jobs", columns, postgresql_where=where)
        op.drop_index(name, table_name="pgqueue_jobs")
        op.execute(_RENAMES[name])


def upgrade() -> None:
    _swap_indexes(_ONLINE_UPGRADE, LISTED_BY_STATE)


def downgrade() -> None:
    _swap_indexes(_ONLINE_DOWNGRADE, None)
