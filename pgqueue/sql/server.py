"""Statements about the server and its sessions rather than jobs: creating, marking and dropping
a database (the demo, the embedded server's application databases, and the test databases of
``pgqueue.testing``), which data directory a server runs on (the embedded server's), the
listeners' ``LISTEN`` and session name (and what the finished-jobs listener hears), the
settings each transaction begins with behind a pooler, and dropping the plans of prepared
statements. Whoever owns a connection runs these, not the data layer. Pure, like the rest of
``pgqueue.sql``: builders, and the reading of an announcement's payload.

``CREATE``/``DROP DATABASE`` and ``COMMENT ON DATABASE`` take a name, so they are constructs
compiled with the dialect's identifier preparer (quoted as the dialect quotes it, never pasted
in). The transaction settings are a construct too, compiled once by ``connections``. The others
run on a raw psycopg connection and are composed by psycopg, as the ``COPY`` statements are.
"""

from __future__ import annotations

from functools import cache
from typing import Any

from psycopg import sql
from sqlalchemy import (
    ColumnElement,
    Select,
    String,
    Text,
    bindparam,
    column,
    func,
    literal_column,
    select,
    table,
)
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.schema import ExecutableDDLElement
from sqlalchemy.sql.compiler import DDLCompiler

from pgqueue.sql.common import ALL_FINISHED, FINISHED_CHANNEL, NOTIFY_CHANNEL


class _DatabaseStatement(ExecutableDDLElement):
    """A statement on the database ``name``, whose text depends on the name: not cached."""

    inherit_cache = False

    def __init__(self, name: str) -> None:
        self.name = name


class _CreateDatabase(_DatabaseStatement):
    """``CREATE DATABASE name`` (``TEMPLATE template`` when given)."""

    def __init__(self, name: str, template: str | None = None) -> None:
        super().__init__(name)
        self.template = template


class _DropDatabase(_DatabaseStatement):
    """``DROP DATABASE IF EXISTS name WITH (FORCE)``."""


class _CommentOnDatabase(_DatabaseStatement):
    """``COMMENT ON DATABASE name IS 'comment'``."""

    def __init__(self, name: str, comment: str) -> None:
        super().__init__(name)
        self.comment = comment


@compiles(_CreateDatabase)
def _compile_create(element: _CreateDatabase, compiler: DDLCompiler, **kw: Any) -> str:
    statement = "CREATE DATABASE " + compiler.preparer.quote(element.name)
    if element.template is not None:
        statement += " TEMPLATE " + compiler.preparer.quote(element.template)
    return statement


@compiles(_DropDatabase)
def _compile_drop(element: _DropDatabase, compiler: DDLCompiler, **kw: Any) -> str:
    return "DROP DATABASE IF EXISTS " + compiler.preparer.quote(element.name) + " WITH (FORCE)"


@compiles(_CommentOnDatabase)
def _compile_comment(element: _CommentOnDatabase, compiler: DDLCompiler, **kw: Any) -> str:
    # A utility statement takes no parameters: the comment is rendered as a quoted literal.
    comment = compiler.sql_compiler.render_literal_value(element.comment, String())
    return f"COMMENT ON DATABASE {compiler.preparer.quote(element.name)} IS {comment}"


def create_database(name: str, template: str | None = None) -> ExecutableDDLElement:
    """``CREATE DATABASE name``, a copy of database ``template`` when given (run outside a
    transaction, e.g. on an AUTOCOMMIT engine)."""
    return _CreateDatabase(name, template)


def drop_database(name: str) -> ExecutableDDLElement:
    """``DROP DATABASE IF EXISTS name WITH (FORCE)``: ends the sessions still connected to it."""
    return _DropDatabase(name)


def comment_on_database(name: str, comment: str) -> ExecutableDDLElement:
    """``COMMENT ON DATABASE name IS 'comment'`` (needs the database's owner)."""
    return _CommentOnDatabase(name, comment)


_PG_DATABASE = table("pg_database", column("oid"), column("datname"))
# Written out: the catalog's name, a constant of the statement rather than a parameter.
_CATALOG: ColumnElement[str] = literal_column("'pg_database'")


@cache
def database_comment() -> Select[str | None]:
    """The comment on database ``name`` (NULL when it has none); no row when it does not exist."""
    return select(func.shobj_description(_PG_DATABASE.c.oid, _CATALOG, type_=Text)).where(
        _PG_DATABASE.c.datname == bindparam("name", type_=Text)
    )


@cache
def listen() -> sql.Composed:
    """``LISTEN`` on pgqueue's wake-up channel (``NOTIFY_CHANNEL``)."""
    return sql.SQL("LISTEN {}").format(sql.Identifier(NOTIFY_CHANNEL))


@cache
def listen_finished() -> sql.Composed:
    """``LISTEN`` on the channel where the statements that end jobs announce them
    (``FINISHED_CHANNEL``)."""
    return sql.SQL("LISTEN {}").format(sql.Identifier(FINISHED_CHANNEL))


def announced_job_ids(payload: str) -> list[int] | None:
    """The ids of the jobs an announcement heard on ``FINISHED_CHANNEL`` names
    (``sql.common.announced`` wrote it); None when it stands for every job (``ALL_FINISHED``)
    or is not pgqueue's, so that whoever waits reads again rather than guess."""
    if payload == ALL_FINISHED:
        return None
    try:
        return [int(part) for part in payload.split(",")]
    except ValueError:
        return None


@cache
def data_directory() -> sql.SQL:
    """The data directory of the server the session is on: whether the cluster answering on a
    socket is the one an embedded server started."""
    return sql.SQL("SELECT current_setting('data_directory')")


@cache
def name_listener_session() -> sql.SQL:
    """Name the current session ``pgqueue-listener`` (its ``application_name``)."""
    return sql.SQL("SELECT set_config('application_name', 'pgqueue-listener', false)")


@cache
def set_local_settings() -> Select[Any]:
    """pgqueue's timeouts and ``jit = off`` for the current transaction only (used behind a
    pooler, where a session setting would reach other clients). Binds ``statement_timeout`` and
    ``idle_timeout`` (milliseconds, as text)."""
    return select(
        func.set_config("statement_timeout", bindparam("statement_timeout", type_=Text), True),
        func.set_config(
            "idle_in_transaction_session_timeout", bindparam("idle_timeout", type_=Text), True
        ),
        func.set_config("jit", "off", True),
    )


@cache
def discard_plans() -> sql.SQL:
    """Drop the plans PostgreSQL cached for the session's prepared statements, keeping the
    statements: each is planned again, for the tables as they are, at its next run. The names
    the driver knows stay valid, so its cache and the session's cannot disagree."""
    return sql.SQL("DISCARD PLANS")
