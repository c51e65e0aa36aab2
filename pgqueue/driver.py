"""pgqueue's statements sent on a psycopg connection directly, past SQLAlchemy's execution layer.

The worker claims, writes outcomes and enqueues thousands of times per second, and for a
one-row statement SQLAlchemy's per-execution work costs as much client CPU as the round trip.
Here a statement of ``pgqueue.sql`` is compiled once (``CompiledStatement``, kept by
``CompiledStatements``) and sent as compiled: the SQL text SQLAlchemy would send, with the
parameters its bind processors would give. Errors leave as SQLAlchemy's ``DBAPIError``
subclasses (``translated``), as on the SQLAlchemy path, so callers classify them one way.

``pgqueue.db`` decides when this path is used; nothing else here knows about that choice.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Final, NamedTuple, TypeVar

import psycopg
from psycopg import pq
from sqlalchemy import Engine
from sqlalchemy.engine import Dialect
from sqlalchemy.exc import DBAPIError, InvalidRequestError, StatementError
from sqlalchemy.sql import Executable
from sqlalchemy.types import ARRAY, BigInteger, Text, Uuid
from sqlalchemy.util import await_only

from pgqueue.jobs import IN_PLACE, JobTables
from pgqueue.sql.server import discard_plans

T = TypeVar("T")

TUPLES_OK = pq.ExecStatus.TUPLES_OK

# How long a pgqueue connection keeps the plans PostgreSQL made for its prepared statements: a
# plan made while a table was tiny scans it whole however large it grows, until the table's next
# ANALYZE or VACUUM, which a busy autovacuum may put off for minutes.
PLAN_MAX_AGE = 5.0

# ``record.info`` key of a pooled connection: the cursor pgqueue sends its statements with there.
_CURSOR: Final = "pgqueue_cursor"


class LocalSettings(NamedTuple):
    """The statement, ready for the driver, that gives one transaction pgqueue's settings."""

    sql: str
    params: dict[str, Any]


class CompiledStatement:
    """A statement compiled once for the driver: its SQL text, the values of the binds it
    carries itself (literals), and a converter per bind the caller gives, so ``params`` gives
    what SQLAlchemy would send (arrays of ids and tokens as array literals, see
    ``array_literal``)."""

    def __init__(self, statement: Executable, dialect: Dialect) -> None:
        compiled: Any = statement.compile(dialect=dialect)  # type: ignore[attr-defined]
        if compiled.positional or compiled.literal_execute_params or compiled.post_compile_params:
            raise AssertionError("a driver statement needs named, fully rendered parameters")
        self.statement = statement
        self.sql: str = str(compiled)
        self.defaults: dict[str, Any] = {}
        self.converters: dict[str, Callable[[Any], Any]] = {}
        for bind, name in compiled.bind_names.items():
            convert = _converter(bind.type, dialect)
            if bind.required:
                if convert is not None:
                    self.converters[name] = convert
            elif bind.value is not None:
                self.defaults[name] = convert(bind.value) if convert else bind.value

    def params(self, given: Mapping[str, Any]) -> dict[str, Any]:
        """The values to send for the caller's ``given`` parameters."""
        values = {**self.defaults, **given}
        for name, convert in self.converters.items():
            if name in values:
                values[name] = convert(values[name])
        return values


def _converter(bind_type: Any, dialect: Dialect) -> Callable[[Any], Any] | None:
    """What turns a value of ``bind_type`` into what is sent: ``array_literal`` for arrays of
    ids (``BIGINT``) and UUIDs, ``text_array_literal`` for texts, else SQLAlchemy's bind
    processor (None when it has none)."""
    if isinstance(bind_type, ARRAY):
        if isinstance(bind_type.item_type, (BigInteger, Uuid)):
            return array_literal
        if isinstance(bind_type.item_type, Text):
            return text_array_literal
    processor: Callable[[Any], Any] | None = bind_type.dialect_impl(dialect).bind_processor(dialect)
    return processor


def array_literal(items: Iterable[Any] | None) -> str | None:
    """Ids or UUIDs (never null) as a PostgreSQL array literal (``{1,2,3}``), or None.

    psycopg dumps a list element by element in Python, the largest single cost of a batch of
    outcomes if left to it; the statements cast every array bind (``::BIGINT[]``,
    ``::UUID[]``), so a literal built by ``str.join`` reads the same. The ``str`` of an int or
    a UUID is its canonical text, which needs no quoting."""
    if items is None:
        return None
    return "{" + ",".join(map(str, items)) + "}"


def text_array_literal(items: Sequence[Any] | None) -> Sequence[Any] | str | None:
    """Texts that are all ``null`` (JSON results of handlers that return nothing, the common
    case) as the literal ``{"null",...}``; anything else as it is, for psycopg to dump."""
    if items and all(item == "null" for item in items):
        return "{" + ",".join(['"null"'] * len(items)) + "}"
    return items


class CompiledStatements:
    """``CompiledStatement``s for one dialect, each compiled on first use. Statements of
    ``pgqueue.sql`` are cached there, so each is one object for the process's life; the entry
    keeps its statement alive, so its ``id`` is never reused while cached."""

    def __init__(self, dialect: Dialect) -> None:
        self.dialect = dialect
        self._compiled: dict[int, CompiledStatement] = {}

    def get(self, statement: Executable) -> CompiledStatement:
        found = self._compiled.get(id(statement))
        if found is None or found.statement is not statement:
            found = self._compiled[id(statement)] = CompiledStatement(statement, self.dialect)
        return found


def reused_cursor(raw: Any) -> psycopg.Cursor[Any]:
    """The cursor pgqueue sends its statements with on the pooled connection ``raw``, made once
    per connection and kept in its pool record (which the pool clears when it drops the
    connection). ``Connection.execute`` makes a cursor per statement, and with it psycopg's
    adaptation state for the parameters: a visible share of a single enqueue's client time."""
    info = raw.info
    cursor: psycopg.Cursor[Any] | None = info.get(_CURSOR)
    if cursor is None or cursor.closed:
        cursor = info[_CURSOR] = raw.driver_connection.cursor()
    return cursor


class DriverExecutor:
    """``pgqueue.db.Executor`` on a psycopg connection, in whatever transaction state the
    connection is (the caller opens and ends transactions); statements go through ``cursor``,
    one of that connection's."""

    def __init__(
        self,
        connection: psycopg.Connection[Any],
        statements: CompiledStatements,
        cursor: psycopg.Cursor[Any],
        tables: JobTables = IN_PLACE,
    ):
        self.connection = connection
        self.statements = statements
        self.cursor = cursor
        self.tables = tables

    def rows(self, statement: Executable, params: Mapping[str, Any] | None = None) -> Sequence[Any]:
        return self.timed_rows(statement, params)[0]

    def timed_rows(
        self, statement: Executable, params: Mapping[str, Any] | None = None
    ) -> tuple[Sequence[Any], float]:
        compiled = self.statements.get(statement)
        values = compiled.params(params or {})
        sent = time.monotonic()
        cursor = self.cursor
        cursor.execute(compiled.sql, values)
        return _all_rows(cursor), sent

    def copy(self, statement: Any, chunks: Iterable[str]) -> None:
        with self.connection.cursor() as cursor, cursor.copy(statement) as copy:
            for chunk in chunks:
                copy.write(chunk)


def _all_rows(cursor: Any) -> Sequence[Any]:
    """The rows of an executed cursor; none for a statement that returns none."""
    if not _returned_rows(cursor):
        return ()
    rows: Sequence[Any] = cursor.fetchall()
    return rows


def _returned_rows(cursor: Any) -> bool:
    """Whether the statement just executed on ``cursor`` returned rows (read from the result's
    status: ``cursor.description`` would build a column object per column)."""
    result = cursor.pgresult
    return result is not None and result.status == TUPLES_OK


def translated(exc: psycopg.Error, *, lost: bool = False) -> StatementError:
    """``exc`` as the ``DBAPIError`` subclass SQLAlchemy would raise for it; ``lost``: the
    connection it came from was closed by then, which marks it as a lost connection the way
    SQLAlchemy's own disconnect test does. Behind PgBouncer a backend terminated inside a
    transaction surfaces at COMMIT as psycopg's InternalError ("received 2 results"), with no
    SQLSTATE, on a connection PgBouncer has closed."""
    return DBAPIError.instance(None, None, exc, psycopg.Error, connection_invalidated=lost)


def checkout(engine: Engine) -> Any:
    """A pooled connection of ``engine``; a failure to connect is raised as SQLAlchemy's own
    checkout raises it (``DBAPIError``), so callers classify it the same way."""
    try:
        return engine.raw_connection()
    except psycopg.Error as exc:
        raise translated(exc) from exc
    except InvalidRequestError as exc:
        # The pool's check found each connection it tried dead ("This connection is closed":
        # the server cuts them as they come): a lost connection, to be tried again like one.
        lost = psycopg.OperationalError(f"no live connection to check out ({exc})")
        raise translated(lost, lost=True) from exc


# A connection in one of these states after an error cannot be given back to the pool: ACTIVE,
# a command was sent and its answer never read (a socket closed under a statement raises before
# libpq marks the connection bad, so the dialect's test passes it), and the pool's reset on
# return, a ROLLBACK, fails on it ("another command is already in progress") and logs a
# traceback; UNKNOWN, the connection is bad.
_UNUSABLE = (pq.TransactionStatus.ACTIVE, pq.TransactionStatus.UNKNOWN)


def _unusable(engine: Engine, raw: Any, error: psycopg.Error) -> bool:
    """Whether the pooled connection ``raw`` must be dropped after ``error``: lost, left in
    the middle of a command, or with prepared statements other than psycopg believes (the
    engine's ``is_disconnect`` says so, see ``connections.install_dead_connection_check``)."""
    if engine.dialect.is_disconnect(error, raw.dbapi_connection, None):  # type: ignore[arg-type]
        return True
    driver = raw.driver_connection
    return bool(driver.closed or driver.pgconn.transaction_status in _UNUSABLE)


def _drop_if_broken(engine: Engine, raw: Any, error: psycopg.Error) -> None:
    """Invalidate the pooled connection ``raw`` when ``error`` left it unusable."""
    if _unusable(engine, raw, error):
        raw.invalidate(error)


def run(
    engine: Engine,
    statements: CompiledStatements,
    local: LocalSettings | None,
    work: Callable[[DriverExecutor], T],
    *,
    autocommit: bool,
    tables: JobTables = IN_PLACE,
) -> T:
    """``work`` on a pooled connection of ``engine``, once: in autocommit mode, or in one
    transaction (opened with ``local`` settings behind a pooler) committed at the end; its
    executor reads jobs in ``tables``. A lost connection is dropped from the pool."""
    raw = checkout(engine)
    driver: Any = raw.driver_connection
    executor = DriverExecutor(driver, statements, reused_cursor(raw), tables)
    try:
        if autocommit:
            driver.autocommit = True
            try:
                return work(executor)
            finally:
                # Not on a connection left mid-command: the switch would raise over the error
                # being raised (and the connection is dropped below anyway).
                if not driver.closed and driver.pgconn.transaction_status not in _UNUSABLE:
                    driver.autocommit = False
        with driver.transaction():
            if local is not None:
                executor.cursor.execute(local.sql, local.params)
            return work(executor)
    except psycopg.Error as exc:
        lost = bool(driver.closed)
        _drop_if_broken(engine, raw, exc)
        raise translated(exc, lost=lost) from exc
    finally:
        raw.close()


class _OneUsersConnection:
    """What ``HeldConnection`` and ``AwaitedConnection`` share: the engine their connection
    comes from, the statements and settings they send, where jobs are (``tables``, set by their
    owner), and when the plans of the connection's prepared statements were last dropped (see
    ``HeldConnection``)."""

    tables: JobTables = IN_PLACE

    def __init__(
        self,
        engine: Engine,
        statements: CompiledStatements,
        local: LocalSettings | None,
        *,
        plan_max_age: float = PLAN_MAX_AGE,
    ) -> None:
        self.engine = engine
        self._statements = statements
        self._local = local
        self._plan_max_age = plan_max_age
        self._plans_since = 0.0

    def _plans_due(self, connection: Any) -> bool:
        """Whether the plans of ``connection``'s prepared statements are to be dropped now
        (never where nothing is prepared, behind a pooler); counted as done from now."""
        if connection.prepare_threshold is None:
            return False
        now = time.monotonic()
        if now - self._plans_since <= self._plan_max_age:
            return False
        self._plans_since = now
        return True


class HeldConnection(_OneUsersConnection):
    """One pooled connection kept checked out by a single user (the worker's claimer) in
    autocommit mode. Against ``run`` it saves, per statement, the pool checkout and return
    (with its reset) and two autocommit switches, a visible share of an idle worker's pick-up
    latency.

    The plans of its prepared statements are dropped every ``plan_max_age`` seconds (``DISCARD
    PLANS``; the statements stay, so psycopg's names for them stay right). PostgreSQL may keep
    one generic plan for a prepared statement for the connection's life, and a plan made while
    a table was tiny (a fresh install, an idle queue) scans it sequentially however large it
    grows; the next plan is made for the table as it is then. Behind a pooler nothing is
    prepared.

    Not thread-safe: its user serializes the calls. After any error the connection goes back to
    the pool (dropped when the error was a lost connection) and the next call checks out another,
    so a broken connection is never reused.
    """

    _raw: Any = None

    def rows(self, statement: Executable, params: Mapping[str, Any] | None = None) -> Sequence[Any]:
        """All rows of ``statement``, run in autocommit (behind a pooler, in a transaction of
        its own that carries pgqueue's settings)."""
        return self.timed_rows(statement, params)[0]

    def timed_rows(
        self, statement: Executable, params: Mapping[str, Any] | None = None
    ) -> tuple[Sequence[Any], float]:
        """``rows``, and the monotonic time just before the statement itself was sent."""
        raw = self._raw
        if raw is None:
            raw = checkout(self.engine)
            raw.driver_connection.autocommit = True
            self._raw = raw
            self._plans_since = time.monotonic()
        driver = raw.driver_connection
        compiled = self._statements.get(statement)
        values = compiled.params(params or {})
        try:
            if self._plans_due(driver):
                driver.execute(discard_plans(), prepare=False)
            cursor = reused_cursor(raw)
            if self._local is None:
                sent = time.monotonic()
                cursor.execute(compiled.sql, values)
            else:
                with driver.transaction():
                    cursor.execute(self._local.sql, self._local.params)
                    sent = time.monotonic()
                    cursor.execute(compiled.sql, values)
            rows: Sequence[Any] = _all_rows(cursor)
        except psycopg.Error as exc:
            lost = bool(driver.closed)
            self._release(exc)
            raise translated(exc, lost=lost) from exc
        return rows, sent

    def copy(self, statement: Any, chunks: Iterable[str]) -> None:
        raise NotImplementedError("the held connection runs autocommit statements, not COPY")

    @property
    def driver_connection(self) -> Any:
        """The psycopg connection held now, or None between checkouts."""
        return None if self._raw is None else self._raw.driver_connection

    def drop(self) -> None:
        """Drop the held connection from the pool (the server has ended it); the next
        statement checks out another."""
        raw, self._raw = self._raw, None
        if raw is not None:
            raw.invalidate()

    def close(self) -> None:
        """Give the connection back to the pool (a later ``rows`` checks out another)."""
        self._release(None)

    def _release(self, error: psycopg.Error | None) -> None:
        raw, self._raw = self._raw, None
        if raw is None:
            return
        driver = raw.driver_connection
        if error is not None and _unusable(self.engine, raw, error):
            raw.invalidate(error)
        elif not driver.closed:
            try:
                driver.autocommit = False
            except psycopg.Error as exc:
                raw.invalidate(exc)
        raw.close()


class AwaitedConnection(_OneUsersConnection):
    """``pgqueue.db.Executor`` for single-statement units of work started from asyncio code
    (``task.aenqueue`` outside a caller's session): one psycopg ``AsyncConnection``, made as the
    AsyncEngine makes its connections and kept in autocommit between units, each statement
    awaited from the greenlet in which SQLAlchemy's bridge runs synchronous code
    (``greenlet_spawn``). Its methods must run in such a greenlet, ``close`` anywhere.

    The connection is detached from the engine's pool: a pooled connection still checked out
    when its event loop ends cannot be given back, and SQLAlchemy warns when the garbage
    collector finds one. Its prepared statements' plans are refreshed every ``plan_max_age``
    seconds, as ``HeldConnection``'s are. After any error it is closed, and the next statement
    makes another.
    """

    connection: psycopg.AsyncConnection[Any] | None = None
    _cursor: psycopg.AsyncCursor[Any] | None = None

    def rows(self, statement: Executable, params: Mapping[str, Any] | None = None) -> Sequence[Any]:
        return self.timed_rows(statement, params)[0]

    def timed_rows(
        self, statement: Executable, params: Mapping[str, Any] | None = None
    ) -> tuple[Sequence[Any], float]:
        connection, cursor = self._connected()
        compiled = self._statements.get(statement)
        values = compiled.params(params or {})
        try:
            if self._plans_due(connection):
                await_only(connection.execute(discard_plans(), prepare=False))
            sent = time.monotonic()
            rows = await_only(_awaited_rows(connection, cursor, compiled.sql, values, self._local))
        except psycopg.Error as exc:
            lost = bool(connection.closed)
            self.close()
            raise translated(exc, lost=lost) from exc
        return rows, sent

    def copy(self, statement: Any, chunks: Iterable[str]) -> None:
        connection, _ = self._connected()
        await_only(awaited_copy(connection, statement, chunks))

    def close(self) -> None:
        """Close the connection (the next statement makes another). Nothing is awaited: it
        may run where no event loop does, such as for a loop that has ended."""
        connection, self.connection, self._cursor = self.connection, None, None
        if connection is not None and not connection.closed:
            connection.pgconn.finish()

    def _connected(self) -> tuple[psycopg.AsyncConnection[Any], psycopg.AsyncCursor[Any]]:
        connection, cursor = self.connection, self._cursor
        if connection is None or cursor is None:
            raw = checkout(self.engine)
            connection = raw.driver_connection
            raw.detach()
            try:
                await_only(connection.set_autocommit(True))
            except psycopg.Error as exc:
                connection.pgconn.finish()
                raise translated(exc, lost=True) from exc
            cursor = connection.cursor()
            self.connection, self._cursor = connection, cursor
            self._plans_since = time.monotonic()
        return connection, cursor


async def _awaited_rows(
    connection: psycopg.AsyncConnection[Any],
    cursor: psycopg.AsyncCursor[Any],
    sql: str,
    values: dict[str, Any],
    local: LocalSettings | None,
) -> Sequence[Any]:
    """The rows of ``sql`` sent on ``cursor`` (behind a pooler, in a transaction of its own
    that carries pgqueue's settings)."""
    if local is None:
        await cursor.execute(sql, values)
    else:
        async with connection.transaction():
            await cursor.execute(local.sql, local.params)
            await cursor.execute(sql, values)
    if not _returned_rows(cursor):
        return ()
    return await cursor.fetchall()


async def awaited_copy(
    connection: psycopg.AsyncConnection[Any], statement: Any, chunks: Iterable[str]
) -> None:
    """``COPY`` of ``chunks`` by ``statement`` on an asyncio connection, in its transaction."""
    async with connection.cursor() as cursor, cursor.copy(statement) as copy:
        for chunk in chunks:
            await copy.write(chunk)
