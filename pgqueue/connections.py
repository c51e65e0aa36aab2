"""How pgqueue connects: its engines, their per-connection settings, and dead-connection checks.

pgqueue's own statements are short and planned for index scans, so they must never be
JIT-compiled (compiling one costs far more than running it) and must carry pgqueue's
``statement_timeout``. On a direct connection both are startup ``options`` of pgqueue's own
connections. A pooler (PgBouncer) refuses startup ``options`` and shares one server session
between clients, so behind one pgqueue sends none: it sets the same values with
``set_config(..., true)`` at the start of each transaction it opens (they end with it and never
reach another client), and turns psycopg's prepared statements off (a prepared statement lives
in one server session, which a transaction pooler does not keep).

Connections that sat in the pool can be dead (server restart, failover, an idle timeout in a
proxy, ``pg_terminate_backend``). A checkout looks at the socket without a round trip: a server
that ended the session has already sent its goodbye (or closed the socket), so a readable idle
socket whose input leaves the connection broken is replaced before any statement is sent.
A checkout also drops the plans of the connection's prepared statements once they are a few
seconds old, so a plan PostgreSQL made for a tiny table is not kept while the table grows.

A connection that cannot be opened (a wrong CA, a refused password, a server that is down) says
that it was pgqueue's and where it went (``pgqueue connection to db.example:5432/app failed:
...``), the worker's LISTEN connection as the listener's: the driver's message names only the
server, and no database name.
"""

from __future__ import annotations

import select
import time
from typing import TYPE_CHECKING, Any, Final

import psycopg
from psycopg import pq
from sqlalchemy import Engine, create_engine, event
from sqlalchemy.engine import URL
from sqlalchemy.engine.interfaces import AdaptedConnection
from sqlalchemy.exc import DisconnectionError

from pgqueue.config import Settings
from pgqueue.driver import PLAN_MAX_AGE, CompiledStatement, LocalSettings, translated
from pgqueue.errors import name_connection_failure
from pgqueue.sql.server import discard_plans, set_local_settings
from pgqueue.sqlstates import is_lost_session_state

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncEngine

# Execution option carrying the values a pgqueue transaction sets first behind a pooler.
LOCAL_SETTINGS_OPTION: Final = "pgqueue_local_settings"

# SQLAlchemy's name for psycopg's asyncio driver: the same library, connection parameters and
# settings as ``postgresql+psycopg``.
ASYNC_DRIVERNAME: Final = "postgresql+psycopg_async"


def conninfo(url: URL) -> str:
    """A libpq URI for a SQLAlchemy URL (psycopg does not understand ``+psycopg``)."""
    return url.set(drivername="postgresql").render_as_string(hide_password=False)


def startup_options(settings: Settings) -> str:
    """The ``options`` startup parameter of pgqueue's own direct connections."""
    return " ".join(f"-c {name}={value}" for name, value in _own_settings(settings).items())


def _own_settings(settings: Settings) -> dict[str, str]:
    timeout = settings.statement_timeout_ms
    return {
        "statement_timeout": str(timeout),
        "idle_in_transaction_session_timeout": str(max(timeout * 6, 60_000)),
        "jit": "off",
    }


def create_queue_engine(url: URL, settings: Settings, **pool: Any) -> Engine:
    """The engine for pgqueue's own short statements on ``url``."""
    engine = create_engine(url, **_queue_engine_arguments(settings), **pool)
    _prepare_queue_engine(engine, settings)
    return engine


def create_async_queue_engine(url: URL, settings: Settings, **pool: Any) -> AsyncEngine:
    """The asyncio engine for pgqueue's own short statements on ``url`` (psycopg's async
    driver), with the settings, pooler handling and checks of ``create_queue_engine``."""
    from sqlalchemy.ext.asyncio import create_async_engine

    engine = create_async_engine(
        url.set(drivername=ASYNC_DRIVERNAME), **_queue_engine_arguments(settings), **pool
    )
    _prepare_queue_engine(engine.sync_engine, settings)
    return engine


def _queue_engine_arguments(settings: Settings) -> dict[str, Any]:
    """What both of pgqueue's queue engines are created with."""
    from pgqueue import codec

    connect_args: dict[str, Any] = {"application_name": "pgqueue"}
    execution_options: dict[str, Any] = {}
    if settings.behind_pooler:
        connect_args["prepare_threshold"] = None
        own = _own_settings(settings)
        execution_options[LOCAL_SETTINGS_OPTION] = {
            "statement_timeout": own["statement_timeout"],
            "idle_timeout": own["idle_in_transaction_session_timeout"],
        }
    else:
        connect_args["options"] = startup_options(settings)
    return {
        # Bound values are job arguments, results and error texts: a database error's message
        # (logged, or stored as a job's last_error) must not carry them.
        "hide_parameters": True,
        "json_deserializer": codec.load_json,
        "connect_args": connect_args,
        "execution_options": execution_options,
    }


def _prepare_queue_engine(engine: Engine, settings: Settings) -> None:
    install_dead_connection_check(engine)
    if settings.behind_pooler:
        _set_locals_on_begin(engine)
    else:
        event.listen(engine, "checkout", _drop_old_plans)
    name_connect_failures(engine)


# ``record.info`` key: when the pooled connection's prepared statements were last dropped.
_PLANS_SINCE: Final = "pgqueue_plans_since"


def _drop_old_plans(dbapi_connection: Any, record: Any, proxy: Any) -> None:
    """At checkout, drop the plans of the connection's prepared statements when they are older
    than ``PLAN_MAX_AGE`` (as the worker's claim connection does), so no statement of pgqueue's
    runs for long on a plan made for a much smaller table: the next ones are planned for the
    tables as they are. One round trip per connection every few seconds at most, and none
    for a connection that has nothing prepared (an idle worker's maintenance connections)."""
    now = time.monotonic()
    since = record.info.setdefault(_PLANS_SINCE, now)
    if now - since <= PLAN_MAX_AGE:
        return
    record.info[_PLANS_SINCE] = now
    if not _has_prepared_statements(record.driver_connection):
        return
    # ``DISCARD PLANS`` keeps the statements psycopg prepared, so its names for them stay
    # valid. In autocommit: no transaction of its own (BEGIN, COMMIT) around it. Through the
    # DB-API connection, which under an asyncio engine is SQLAlchemy's adapter (it awaits).
    autocommit = dbapi_connection.autocommit
    try:
        dbapi_connection.autocommit = True
        if isinstance(dbapi_connection, AdaptedConnection):
            dbapi_connection.run_async(lambda raw: raw.execute(discard_plans(), prepare=False))
        else:
            dbapi_connection.execute(discard_plans(), prepare=False)
        dbapi_connection.autocommit = autocommit
    except psycopg.Error as exc:
        # The pool drops this connection and checks out (or opens) another.
        raise DisconnectionError(f"pooled connection failed to drop its plans: {exc}") from exc


def _has_prepared_statements(connection: Any) -> bool:
    """Whether psycopg has prepared a statement on ``connection``. psycopg keeps their names in
    its (private) prepare manager; should a release move it, assume there are some."""
    names = getattr(getattr(connection, "_prepared", None), "_names", None)
    return names is None or bool(names)


def create_handler_engine(url: URL, settings: Settings, **pool: Any) -> Engine:
    """The engine for handlers' sessions on ``url``: no pgqueue timeouts on the app's queries,
    but pooler-safe statements when a pooler is in the path."""
    connect_args: dict[str, Any] = {"application_name": "pgqueue-handler"}
    if settings.behind_pooler:
        connect_args["prepare_threshold"] = None
    # Handlers bind job arguments into their own queries; their errors become a job's last_error.
    engine = create_engine(
        url, hide_parameters=True, pool_pre_ping=True, connect_args=connect_args, **pool
    )
    name_connect_failures(engine)
    return engine


def name_connect_failures(engine: Engine) -> None:
    """Make a failure to open a connection of ``engine`` (one pgqueue created) say it was
    pgqueue's, and where it went.

    Only on pgqueue's own engines: the hook opens the connection itself, which ends the
    ``do_connect`` chain, so on an application's engine it would skip hooks added after it.
    """

    @event.listens_for(engine, "do_connect")
    def connect(dialect: Any, record: Any, cargs: Any, cparams: dict[str, Any]) -> Any:
        try:
            return dialect.connect(*cargs, **cparams)
        except dialect.loaded_dbapi.Error as exc:
            name_connection_failure(
                exc, None, target(cparams.get("host"), cparams.get("port"), cparams.get("dbname"))
            )
            raise


def target(host: object, port: object, database: object) -> str:
    """``host:port/database`` for messages (libpq's defaults where a part is not given)."""
    return f"{host or 'local socket'}:{port or 5432}" + (f"/{database}" if database else "")


def adapt_given_engine(engine: Engine, settings: Settings) -> None:
    """Make an application's own engine safe for pgqueue's use: dead pooled connections are
    replaced at checkout, and behind a pooler its connections prepare no statements."""
    install_dead_connection_check(engine)
    if settings.behind_pooler:

        @event.listens_for(engine, "connect")
        def no_prepared_statements(dbapi_connection: Any, record: Any) -> None:
            # The psycopg connection itself (under an asyncio engine, the one its adapter wraps).
            record.driver_connection.prepare_threshold = None


def local_settings(engine: Engine) -> LocalSettings | None:
    """What a transaction of pgqueue's on ``engine`` runs first (behind a pooler), else None."""
    params = engine.get_execution_options().get(LOCAL_SETTINGS_OPTION)
    if params is None:
        return None
    compiled = CompiledStatement(set_local_settings(), engine.dialect)
    return LocalSettings(compiled.sql, compiled.params(params))


def _set_locals_on_begin(engine: Engine) -> None:
    local = local_settings(engine)
    assert local is not None

    @event.listens_for(engine, "begin")
    def set_locals(connection: Any) -> None:
        driver = connection.connection.driver_connection
        if driver.autocommit:
            return  # each statement is its own transaction: nothing to carry settings into
        # On the driver, not through ``connection``: this runs inside SQLAlchemy's begin.
        adapted = connection.connection.dbapi_connection
        try:
            if isinstance(adapted, AdaptedConnection):  # asyncio: awaited in the greenlet
                adapted.run_async(lambda raw: raw.execute(local.sql, local.params))
            else:
                driver.execute(local.sql, local.params)
        except psycopg.Error as exc:
            # SQLAlchemy does not wrap what a begin listener raises: without this a lost
            # connection here would escape every caller's handling of DBAPIError (and the pool
            # would try to roll the dead connection back on its return).
            lost = bool(driver.closed) or engine.dialect.is_disconnect(exc, adapted, None)  # type: ignore[arg-type]
            if lost:
                connection.invalidate(exc)
            raise translated(exc, lost=lost) from exc


def install_dead_connection_check(engine: Engine) -> None:
    """Replace a pooled connection the server already ended, at checkout, without a round trip,
    and drop one whose prepared statements disagree with psycopg's after the error that shows
    it (idempotent per engine)."""
    if event.contains(engine, "checkout", _replace_if_dead):
        return
    event.listen(engine, "checkout", _replace_if_dead)
    _count_lost_session_state_as_disconnect(engine.dialect)


def _count_lost_session_state_as_disconnect(dialect: Any) -> None:
    """Make ``dialect`` (one engine's own) call a lost-session-state error a disconnect.

    SQLAlchemy asks the dialect after every error whether the connection is still good, and
    drops it from the pool when it is not; so does pgqueue's driver path. A connection whose
    prepared statements are gone would fail the same way at every later use (psycopg sends the
    same name again), so it is dropped like a closed one. Not an error-handler event: an engine
    with one sends its statements through SQLAlchemy (``db.watches_statements``)."""
    base = dialect.is_disconnect

    def is_disconnect(error: Any, connection: Any, cursor: Any) -> bool:
        return is_lost_session_state(error) or bool(base(error, connection, cursor))

    dialect.is_disconnect = is_disconnect


def _replace_if_dead(dbapi_connection: Any, record: Any, proxy: Any) -> None:
    # The driver's own connection: under an asyncio engine, the psycopg AsyncConnection that
    # SQLAlchemy's adapter wraps (the socket test is the same and needs no await).
    if is_dead(record.driver_connection):
        # The pool drops this connection and checks out (or opens) another.
        raise DisconnectionError("pooled connection was closed by the server")


def is_dead(connection: Any) -> bool:
    """Whether an idle psycopg connection was ended by the server: its socket is readable (an
    idle session gets nothing unasked but a goodbye, a notice or a notification) and reading
    leaves the connection broken."""
    if connection.closed:
        return True
    pgconn = connection.pgconn
    try:
        # A second read when the first left the socket readable: in nonblocking mode (an asyncio
        # connection's) the first read takes the server's goodbye, the second finds the end.
        for _ in range(2):
            readable, _, _ = select.select([pgconn.socket], [], [], 0)
            if not readable:
                break
            pgconn.consume_input()
    except (OSError, ValueError, psycopg.OperationalError):
        return True
    return bool(pgconn.status != pq.ConnStatus.OK)
