"""What the revisions that build indexes ``CONCURRENTLY`` share: whether they may leave the
migration's transaction to do so.

``CREATE INDEX CONCURRENTLY`` cannot run inside a transaction block. Alembic's
``autocommit_block`` commits the migration's transaction, runs its statements in autocommit and
begins a new one, which is only right when Alembic began that transaction itself (a host's
Alembic whose ``env.py`` begins it) or writes offline SQL. When the revision runs in a
transaction its caller opened (``pgqueue migrate``, ``PgQueue.migrate()``,
``pgqueue.migrations.upgrade(connection)``, none of which commits the caller's work), the
revision builds its index in that transaction instead.
"""

from __future__ import annotations

from typing import Any


def can_leave_transaction(context: Any) -> bool:
    """Whether ``autocommit_block`` can run on this ``MigrationContext``: offline SQL, or a
    transaction Alembic began itself (not one its caller had open when it configured the
    context)."""
    if context.as_sql:
        return True
    return not getattr(context, "_in_external_transaction", True)
