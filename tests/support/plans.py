"""Executed query plans as the plan tests read them: a statement's custom plan (for the values
sent) and its generic plan (values unknown), which the server may switch to once psycopg has
prepared a statement run several times."""

from __future__ import annotations

import itertools
import re
from collections.abc import Iterator
from typing import Any

import psycopg.sql
from sqlalchemy import Connection

# PREPARE needs a name per statement for the connection's life.
_names = itertools.count()


def executed_plans(
    connection: Connection, statement: str, parameters: dict[str, Any]
) -> Iterator[tuple[str, dict[str, Any]]]:
    """``("custom plan", explain)`` then ``("generic plan", explain)``: each EXPLAIN (ANALYZE,
    FORMAT JSON) entry whole (its ``Plan``, and ``JIT`` when the server compiled it), each run
    in a transaction rolled back."""
    custom = connection.exec_driver_sql("EXPLAIN (ANALYZE, FORMAT JSON) " + statement, parameters)
    yield "custom plan", custom.scalar_one()[0]
    connection.rollback()
    names: list[str] = []

    def placeholder(match: re.Match[str]) -> str:
        if match.group(1) not in names:
            names.append(match.group(1))
        return f"${names.index(match.group(1)) + 1}"

    numbered = re.sub(r"%\((\w+)\)s", placeholder, statement)
    driver = connection.connection.driver_connection
    assert driver is not None
    values = ", ".join(psycopg.sql.Literal(parameters[n]).as_string(driver) for n in names)
    values = values.replace("%", "%%")  # not placeholders: the driver reads this text too
    arguments = f"({values})" if names else ""
    name = f"plan_statement_{next(_names)}"
    connection.exec_driver_sql("SET plan_cache_mode = force_generic_plan")
    connection.exec_driver_sql(f"PREPARE {name} AS {numbered}")
    generic = connection.exec_driver_sql(
        f"EXPLAIN (ANALYZE, FORMAT JSON) EXECUTE {name}{arguments}"
    )
    yield "generic plan", generic.scalar_one()[0]
    connection.rollback()
