"""What a downgrade destroys, declared by each revision and checked before any step runs.

A revision whose downgrade removes data lists it in a module-level ``downgrade_loses``: the
tables it drops (``DropsTable``), the columns it drops (``DropsColumn``) and the rows it rewrites
(``RewritesRows``). A downgrade counts as destructive when, in the database as it is, one of
those holds something:

- a dropped table has at least one row (a partitioned table: in any partition);
- a dropped column has a value in some row other than NULL and the column's constant default
  (a column that only ever held its default loses nothing the upgrade would not put back);
- rewritten rows exist (e.g. dependency-waiting jobs that a downgrade below 0002 cancels).

Dropping an index, a constraint, a trigger or a function loses nothing and is not declared; nor
is deleting tickets whose job no longer exists. ``tests/unit/test_downgrade_losses.py`` checks
that each revision declares every table and column its ``downgrade()`` drops.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection

from pgqueue.data import schema as schema_data
from pgqueue.db import ConnectionExecutor


@dataclass(frozen=True, slots=True)
class DropsTable:
    """The downgrade drops ``table``: destructive when it holds a row."""

    table: str

    def holds_data(self, connection: Connection) -> bool:
        return schema_data.table_has_rows(ConnectionExecutor(connection), self.table)

    def describe(self) -> str:
        return f"drops table {self.table}, which holds rows"


@dataclass(frozen=True, slots=True)
class DropsColumn:
    """The downgrade drops ``table.column``: destructive when a row holds a value other than
    NULL and ``default`` (the column's constant server default, None if it has none)."""

    table: str
    column: str
    default: Any = None

    def holds_data(self, connection: Connection) -> bool:
        return schema_data.column_holds_values(
            ConnectionExecutor(connection), self.table, self.column, self.default
        )

    def describe(self) -> str:
        return f"drops column {self.table}.{self.column}, which holds values"


@dataclass(frozen=True, slots=True)
class RewritesRows:
    """The downgrade overwrites the rows of ``table`` whose ``column`` is ``value`` (``what``
    says with what): destructive when there are such rows."""

    table: str
    column: str
    value: Any
    what: str

    def holds_data(self, connection: Connection) -> bool:
        return schema_data.rows_where_equal(
            ConnectionExecutor(connection), self.table, self.column, self.value
        )

    def describe(self) -> str:
        return f"{self.what} ({self.table} rows with {self.column} = {self.value!r})"


Loss = DropsTable | DropsColumn | RewritesRows


def found(connection: Connection, steps: Iterable[Any]) -> list[str]:
    """``revision: what it destroys`` for each declared loss of the downgrade ``steps``
    (Alembic's revision steps, newest first) that holds data in ``connection``'s database."""
    lines = []
    for step in steps:
        script = step.revision
        declared: tuple[Loss, ...] = getattr(script.module, "downgrade_loses", ())
        for loss in declared:
            # A table a newer revision dropped is recreated empty by that revision's downgrade
            # before this one runs: it holds nothing to lose.
            if not schema_data.table_exists(ConnectionExecutor(connection), loss.table):
                continue
            if loss.holds_data(connection):
                lines.append(f"{script.revision} {loss.describe()}")
    return lines
