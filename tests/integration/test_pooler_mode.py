"""``Settings(pooler=...)``: what pgqueue leaves on a server session it shares with others.

Behind a pooler the next transaction on a server session may be another client's, so pgqueue's
settings must live inside its own transactions and nothing may stay prepared. Checked here on a
direct connection, where the session can be inspected after pgqueue's transaction ends.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from sqlalchemy import text
from sqlalchemy.engine import URL

from pgqueue import PgQueue, Settings

SESSION_STATE = text(
    "SELECT current_setting('jit'), current_setting('statement_timeout'), "
    "(SELECT count(*) FROM pg_prepared_statements), pg_backend_pid()"
)


def session_state(pgq: PgQueue) -> tuple[str, str, int, int]:
    """The state of a pooled session between transactions, read on the driver in autocommit
    (so that no pgqueue transaction, with its own settings, is begun to read it)."""
    raw = pgq.engine.raw_connection()
    try:
        driver = raw.driver_connection
        driver.autocommit = True
        row = driver.execute(str(SESSION_STATE)).fetchone()
        driver.autocommit = False
    finally:
        raw.close()
    return tuple(row)  # type: ignore[return-value]


@pytest.fixture
def pooled(database_url: URL) -> Iterator[PgQueue]:
    queue = PgQueue(
        database_url, settings=Settings(pooler="transaction", statement_timeout_ms=4321)
    )
    yield queue
    queue.dispose()


def test_settings_live_inside_pgqueue_transactions_only(pooled: PgQueue) -> None:
    with pooled.sessions() as session, session.begin():
        jit, timeout, _, inside_pid = session.execute(SESSION_STATE).one()
    assert (jit, timeout) == ("off", "4321ms")
    jit, timeout, _, pid = session_state(pooled)
    assert pid == inside_pid  # the same server session, after pgqueue's transaction
    assert (jit, timeout) == ("on", "0")


def test_nothing_stays_prepared_after_many_enqueues(pooled: PgQueue) -> None:
    @pooled.task(name="noop")
    def noop(i: int) -> int:
        return i

    for i in range(20):
        noop.enqueue(i)
    noop.enqueue_many([{"i": i} for i in range(1500)])
    assert session_state(pooled)[2] == 0


def test_direct_connections_carry_pgqueue_settings_for_the_session(database_url: URL) -> None:
    direct = PgQueue(database_url, settings=Settings(statement_timeout_ms=4321))
    with direct.engine.connect() as connection:
        jit, timeout, _, _ = connection.execute(SESSION_STATE).one()
        connection.rollback()
    direct.dispose()
    assert (jit, timeout) == ("off", "4321ms")


def test_workers_poll_behind_a_transaction_pooler_unless_given_a_listen_url(
    database_url: URL,
) -> None:
    assert not PgQueue(database_url, settings=Settings(pooler="transaction")).can_listen
    assert PgQueue(database_url, settings=Settings(pooler="session")).can_listen
    direct = database_url.render_as_string(hide_password=False)
    assert PgQueue(
        database_url, settings=Settings(pooler="transaction", listen_database_url=direct)
    ).can_listen


def test_a_connection_lost_as_a_pgqueue_transaction_begins_is_a_lost_connection(
    pooled: PgQueue,
) -> None:
    """The settings are set by a begin listener, whose errors SQLAlchemy passes through as the
    driver raised them: a backend ended between checkout and begin must still surface as
    SQLAlchemy's DBAPIError marked as a lost connection, which every retry loop (a worker
    waiting for the database at start, the store) knows; the next transaction gets a new
    connection."""
    import time

    from sqlalchemy import event
    from sqlalchemy.exc import DBAPIError

    from pgqueue.sqlstates import is_connection_error

    with pooled.engine.connect() as warm:
        victim = warm.execute(text("SELECT pg_backend_pid()")).scalar_one()
        warm.rollback()

    def end_the_backend(*_: object) -> None:
        # After pgqueue's own dead-connection check at checkout: the backend ends between the
        # checkout and the begin.
        with pooled.engine.connect() as killer:
            killer.execute(text("SELECT pg_terminate_backend(:pid)"), {"pid": victim})
            killer.commit()
        time.sleep(0.3)

    event.listen(pooled.engine, "checkout", end_the_backend, once=True)
    with pytest.raises(DBAPIError) as raised, pooled.engine.begin() as connection:
        connection.execute(text("SELECT 1"))
    assert is_connection_error(raised.value)
    with pooled.engine.begin() as connection:
        assert connection.execute(text("SELECT pg_backend_pid()")).scalar_one() != victim
