"""What every table of pgqueue's shares: its own ``MetaData`` with a naming convention (so
constraint names are deterministic and the shipped migrations match the models exactly), the
declarative ``Base``, and the column types of job data (``job_state_type``, ``StoredJSON``).
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import JSON, Enum, MetaData, Text, TypeDecorator, cast, type_coerce
from sqlalchemy.engine import Dialect
from sqlalchemy.orm import DeclarativeBase
from sqlalchemy.sql.elements import ColumnElement

from pgqueue import codec
from pgqueue.states import JobState

NAMING_CONVENTION = {
    "ix": "ix_%(table_name)s_%(column_0_N_name)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}

metadata = MetaData(naming_convention=NAMING_CONVENTION)

TABLE_PREFIX = "pgqueue_"

# Values of JobState stored as text with a CHECK constraint rather than a native enum type: new
# states can be added by a migration without ALTER TYPE, and text compares as fast here.
job_state_type = Enum(
    JobState,
    name="job_state",
    native_enum=False,
    create_constraint=False,  # STATE_CHECK instead
    length=16,
    values_callable=lambda states: [s.value for s in states],
    validate_strings=True,
)

# The states as one array constant, not the IN list of seven that the Enum would generate:
# PostgreSQL prepares a table's CHECK expressions again for every statement that writes it,
# and an IN list costs more than twice the array form there. A unit test keeps it equal to
# JobState.
STATE_CHECK = (
    "state::text = ANY ('{queued,waiting,running,retrying,succeeded,failed,cancelled}'::text[])"
)


class StoredJSON(TypeDecorator[Any]):
    """``json`` that reading a job never fails on: selected as its text and decoded here, one
    value at a time, so a value Python cannot decode (nesting deeper than the recursion limit,
    an integer longer than ``sys.get_int_max_str_digits()``, written by another client or by
    hand) reads as a ``codec.UndecodableJSON`` instead of raising. The driver would
    otherwise decode it during the fetch, with the engine's loader (a host's own engine's, under
    Flask), and fail every row of the answer with it. Binds, and the column type the migrations
    see, are plain ``JSON``'s."""

    impl = JSON
    cache_ok = True
    # As JSON's (``none_as_null=False``): the ORM binds a Python None as JSON null.
    should_evaluate_none = True

    def column_expression(self, column: ColumnElement[Any]) -> ColumnElement[Any]:
        # The coercion keeps this type on the fetched column, so process_result_value decodes.
        return type_coerce(cast(column, Text), self)

    def process_result_value(self, value: Any, dialect: Dialect) -> Any:
        return None if value is None else codec.load_stored_json(value)


class Base(DeclarativeBase):
    """Declarative base bound to pgqueue's own MetaData (never the host application's)."""

    metadata = metadata
