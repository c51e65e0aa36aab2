"""pgqueue 0023: a WAITING job holds its unique key (workflow members with a ``unique_key``).

Revision ID: pgqueue_0023
Revises: pgqueue_0022
Create Date: 2026-11-26

- The partial unique index ``uq_pgqueue_jobs_unique_key_active`` covers ``waiting`` jobs too
  (``models.UNIQUE_KEY_HELD``): a keyed workflow member holds its key while it waits for its
  parents, so its release to QUEUED never meets another holder.
- ``pgqueue_enqueue(...)`` (0020) is replaced by the same function whose ``ON CONFLICT`` and
  lookup of the holder name the new predicate (a held key still returns the holder's id, a
  waiting holder's too); the downgrade puts 0020's body back.

Online when it can be: the new index is built ``CONCURRENTLY`` under a temporary name, the old
one dropped ``CONCURRENTLY`` and the new one renamed, so enqueues and workers keep writing
``pgqueue_jobs`` meanwhile. Statements the old code prepared keep working against the new index
(their predicate implies it). ``CONCURRENTLY`` cannot run inside a transaction block, so this
needs Alembic to own the migration's transaction (``pgqueue migrate``, ``PgQueue.migrate()``, a
host's Alembic whose ``env.py`` begins it, or offline SQL): the revisions before this one are
committed first (``pgqueue.migrations.online``). When the revision runs in a transaction its
caller opened (``pgqueue.migrations.upgrade(connection)`` from a host's revision, which commits
nothing of the caller's), the index is built in that transaction instead: writes to
``pgqueue_jobs`` wait for the build (a scan of the table, seconds per million rows), as for
0006's indexes.

The upgrade refuses (``MigrationRefused``, nothing changed) when a waiting job's key is held by another job that has
not ended (only possible for rows written by hand: no earlier pgqueue writes a waiting job with
a key). The downgrade refuses (``MigrationRefused``; nothing changed, unless 0025's downgrade in
the same run already committed its online swap) while a waiting job has a unique key: the older
schema would let another job take that key, and the waiting job's release would then fail on
the unique index in its parent's outcome transaction. Let such jobs start or end, or cancel
them, then downgrade again.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Sequence
from pathlib import Path

import sqlalchemy as sa

from alembic import op
from pgqueue.errors import MigrationRefused
from pgqueue.migrations.online import (
    can_leave_transaction,
    has_committed,
    outside_transaction,
)

revision: str = "pgqueue_0023"
down_revision: str | Sequence[str] | None = "pgqueue_0022"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

INDEX = "uq_pgqueue_jobs_unique_key_active"
# The name the replacement is built under, before the old index is dropped.
SWAP = "uq_pgqueue_jobs_unique_key_swap"

OLD_HELD = "unique_key IS NOT NULL AND state IN ('queued', 'running', 'retrying')"
NEW_HELD = "unique_key IS NOT NULL AND state IN ('queued', 'running', 'retrying', 'waiting')"
OLD_LOOKUP = "AND j.state IN ('queued', 'running', 'retrying');"
NEW_LOOKUP = "AND j.state IN ('queued', 'running', 'retrying', 'waiting');"


def _function_0020() -> str:
    """0020's ``CREATE FUNCTION pgqueue_enqueue`` text, as a ``CREATE OR REPLACE``."""
    path = Path(__file__).with_name("pgqueue_0020_sql_enqueue_function.py")
    spec = importlib.util.spec_from_file_location("pgqueue_0020_sql_enqueue_function", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    body: str = module.ENQUEUE_FUNCTION
    return body.replace("CREATE FUNCTION", "CREATE OR REPLACE FUNCTION", 1)


def _replaced(text: str, old: str, new: str) -> str:
    """``text`` with its one occurrence of ``old`` replaced by ``new``."""
    if text.count(old) != 1:  # pragma: no cover - 0020's text is fixed
        raise RuntimeError(f"0020's pgqueue_enqueue does not hold {old!r} once")
    return text.replace(old, new)


def _function_0023() -> str:
    """``pgqueue_enqueue`` with the new predicate in its ``ON CONFLICT`` and its lookup."""
    body = _replaced(_function_0020(), f"WHERE {OLD_HELD}", f"WHERE {NEW_HELD}")
    return _replaced(body, OLD_LOOKUP, NEW_LOOKUP)


# The online swap to each predicate, statement by statement (written out: no SQL is formatted).
_ONLINE_SWAP = {
    NEW_HELD: (
        "DROP INDEX CONCURRENTLY IF EXISTS uq_pgqueue_jobs_unique_key_swap",
        "CREATE UNIQUE INDEX CONCURRENTLY uq_pgqueue_jobs_unique_key_swap"
        " ON pgqueue_jobs (unique_key) WHERE unique_key IS NOT NULL"
        " AND state IN ('queued', 'running', 'retrying', 'waiting')",
        "DROP INDEX CONCURRENTLY IF EXISTS uq_pgqueue_jobs_unique_key_active",
        "ALTER INDEX uq_pgqueue_jobs_unique_key_swap RENAME TO uq_pgqueue_jobs_unique_key_active",
    ),
    OLD_HELD: (
        "DROP INDEX CONCURRENTLY IF EXISTS uq_pgqueue_jobs_unique_key_swap",
        "CREATE UNIQUE INDEX CONCURRENTLY uq_pgqueue_jobs_unique_key_swap"
        " ON pgqueue_jobs (unique_key) WHERE unique_key IS NOT NULL"
        " AND state IN ('queued', 'running', 'retrying')",
        "DROP INDEX CONCURRENTLY IF EXISTS uq_pgqueue_jobs_unique_key_active",
        "ALTER INDEX uq_pgqueue_jobs_unique_key_swap RENAME TO uq_pgqueue_jobs_unique_key_active",
    ),
}
_RENAME_SWAP = (
    "ALTER INDEX uq_pgqueue_jobs_unique_key_swap RENAME TO uq_pgqueue_jobs_unique_key_active"
)


def _swap_index(predicate: str) -> None:
    """Replace the unique index with one on ``predicate`` (``NEW_HELD`` or ``OLD_HELD``), under
    the same name (see the module): online when Alembic owns the transaction, else in the
    caller's."""
    context = op.get_context()
    if can_leave_transaction(context):
        with outside_transaction(context):
            # An interrupted earlier run may have left an INVALID build behind: the first
            # statement drops it.
            for statement in _ONLINE_SWAP[predicate]:
                op.execute(statement)
        return
    op.create_index(
        SWAP, "pgqueue_jobs", ["unique_key"], unique=True, postgresql_where=sa.text(predicate)
    )
    op.drop_index(INDEX, table_name="pgqueue_jobs")
    op.execute(_RENAME_SWAP)


def upgrade() -> None:
    clashes = (
        op.get_bind()
        .execute(
            sa.text(
                "SELECT w.unique_key, w.id, h.id FROM pgqueue_jobs AS w"
                " JOIN pgqueue_jobs AS h ON h.unique_key = w.unique_key AND h.id <> w.id"
                " AND h.state IN ('queued', 'running', 'retrying', 'waiting')"
                " WHERE w.state = 'waiting' AND w.unique_key IS NOT NULL"
                " ORDER BY w.id LIMIT 5"
            )
        )
        .all()
        if not op.get_context().as_sql
        else []
    )
    if clashes:
        named = "; ".join(f"key {key!r}: waiting job {w} and job {h}" for key, w, h in clashes)
        raise MigrationRefused(
            "upgrade to pgqueue_0023 refused, nothing changed: waiting jobs share a unique key "
            f"with another job that has not ended ({named}); clear one's unique_key or cancel it"
        )
    _swap_index(NEW_HELD)
    op.execute(_function_0023())


def downgrade() -> None:
    held = (
        op.get_bind()
        .execute(
            sa.text(
                "SELECT id, unique_key FROM pgqueue_jobs"
                " WHERE state = 'waiting' AND unique_key IS NOT NULL ORDER BY id LIMIT 6"
            )
        )
        .all()
        if not op.get_context().as_sql
        else []
    )
    if held:
        named = ", ".join(f"job {job_id} ({key!r})" for job_id, key in held[:5])
        more = " and more" if len(held) > 5 else ""
        # 0025's downgrade, run before this one, may have committed its online swap already.
        unchanged = "" if has_committed(op.get_context()) else ", nothing changed"
        raise MigrationRefused(
            f"downgrade below pgqueue_0023 refused{unchanged}: waiting jobs hold unique "
            f"keys ({named}{more}), which the older schema would let another job take; let them "
            "start or end, or cancel them (pgq.cancel_workflow), then downgrade again"
        )
    # The old body first: its predicate implies the new index's, so it keeps working until
    # the swap.
    op.execute(_function_0020())
    _swap_index(OLD_HELD)
