"""The migration's timeouts (``migration_settings``: no ``statement_timeout``, a deliberate
``lock_timeout``), and what the revisions that build indexes ``CONCURRENTLY`` share: whether
they may leave the migration's transaction to do so, and how they leave it.

``CREATE INDEX CONCURRENTLY`` cannot run inside a transaction block. Alembic's
``autocommit_block`` commits the migration's transaction, runs its statements in autocommit and
begins a new one, which is only right when Alembic began that transaction itself or writes
offline SQL. Alembic owns the transaction under ``pgqueue migrate``, ``PgQueue.migrate()`` and
``flask pgqueue migrate`` (pgqueue commits its own reads before it configures the migration),
and under a host's Alembic whose ``env.py`` begins it. When the revision runs in a transaction
its caller opened (``pgqueue.migrations.upgrade(connection)`` from a host's revision, which
commits nothing of the caller's), the revision builds its index in that transaction instead.

:func:`outside_transaction` is ``autocommit_block`` plus the migration's timeouts: the new
transaction Alembic begins after the block has the session's settings, not the ``SET LOCAL``
ones pgqueue gave the first, so it gives them again when the context carries them
(:data:`LOCK_TIMEOUT_KEY`, set by pgqueue's own runs and its shipped ``env.py``). It also notes
in :data:`COMMITS_KEY`, when present, that the run has committed, so a failure later can say so.

The statements inside the block run outside any transaction, so no ``SET LOCAL`` governs them,
and a session ``SET`` would outlive the migration on a pooled server connection (PgBouncer in
transaction mode): they run with the session's ``statement_timeout`` and ``lock_timeout``.
``pgqueue migrate`` and ``PgQueue.migrate()`` connect through the handlers' engine, whose
sessions carry none of pgqueue's settings (its own engine's startup ``statement_timeout`` would
cancel a build of more than a few seconds), so these are the server's, database's or role's
(PostgreSQL's defaults: none). No limit is needed to protect writers: ``CREATE INDEX
CONCURRENTLY``, ``DROP INDEX CONCURRENTLY`` and ``ALTER INDEX ... RENAME`` take ``SHARE UPDATE
EXCLUSIVE`` locks, which inserts, updates and deletes do not conflict with (only DDL, ``VACUUM``
and other builds do), and a concurrent build then waits for every transaction older than it to
end, holding nobody up meanwhile: the migration takes as long as the longest of them. A build
cancelled (a role's ``statement_timeout``, an administrator) leaves an INVALID index under the
temporary name, which the next run drops before it builds again.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, Final

from sqlalchemy import Connection

from pgqueue.data import schema as schema_data
from pgqueue.db import ConnectionExecutor

# MigrationContext opts pgqueue adds: the migration's lock_timeout (milliseconds, as text) to
# give again after an autocommit block; and a list to which each block appends once it has
# committed the run so far.
LOCK_TIMEOUT_KEY: Final = "pgqueue_lock_timeout"
COMMITS_KEY: Final = "pgqueue_commits"


def can_leave_transaction(context: Any) -> bool:
    """Whether ``autocommit_block`` can run on this ``MigrationContext``: offline SQL, or a
    transaction Alembic began itself (not one its caller had open when it configured the
    context)."""
    if context.as_sql:
        return True
    return not getattr(context, "_in_external_transaction", True)


def has_committed(context: Any) -> bool:
    """Whether this run has already committed part of its work (an earlier online step), so
    that a revision refusing now must not say that nothing changed."""
    return bool(context.opts.get(COMMITS_KEY))


@contextmanager
def outside_transaction(context: Any) -> Iterator[None]:
    """``context.autocommit_block()``, after which the new transaction gets the migration's
    timeouts again (no ``statement_timeout``, the ``lock_timeout`` under
    :data:`LOCK_TIMEOUT_KEY`) when the context carries them; a host's own ``env.py`` that
    does not gets nothing set."""
    commits = context.opts.get(COMMITS_KEY)
    with context.autocommit_block():
        if commits is not None:
            commits.append(True)
        yield
    lock_timeout = context.opts.get(LOCK_TIMEOUT_KEY)
    if lock_timeout is not None and not context.as_sql:
        schema_data.set_timeouts(ConnectionExecutor(context.connection), "0", str(lock_timeout))


def migration_settings(connection: Connection, lock_timeout: float) -> None:
    """Give the rest of ``connection``'s transaction a migration's timeouts: no
    ``statement_timeout``, ``lock_timeout`` seconds of waiting for a lock (0: no limit)."""
    set_timeouts(connection, "0", milliseconds(lock_timeout))


def set_timeouts(connection: Connection, statement_timeout: str, lock_timeout: str) -> None:
    """Give the rest of ``connection``'s transaction these timeouts (as the settings show them)."""
    schema_data.set_timeouts(ConnectionExecutor(connection), statement_timeout, lock_timeout)


def milliseconds(seconds: float) -> str:
    """``seconds`` as whole milliseconds, the unit of the timeout settings (never negative)."""
    return str(max(0, round(seconds * 1000)))
