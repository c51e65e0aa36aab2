"""A check-out that finds every connection it tries dead is a lost connection, not a bug.

With ``pool_pre_ping`` the pool tests each connection it hands out and replaces a dead one; when
the replacement is dead too (the server cutting connections as they come, a restart under way)
SQLAlchemy gives up with ``InvalidRequestError("This connection is closed")``. That is not a
DBAPI error, so nothing treated it as a lost connection: a worker's claim retried on a pooled
connection during a connection storm logged it with its traceback. The pool is made to find each
connection dead here the way SQLAlchemy's own pessimistic check does it, a ``checkout`` listener
raising ``DisconnectionError``.
"""

from __future__ import annotations

from typing import Any

import pytest
from sqlalchemy import create_engine, event
from sqlalchemy.engine import URL
from sqlalchemy.exc import DisconnectionError

from pgqueue import driver
from pgqueue.sqlstates import is_connection_error


def test_a_checkout_whose_every_connection_is_dead_raises_a_lost_connection(
    database_url: URL,
) -> None:
    engine = create_engine(database_url, pool_pre_ping=True)
    dead = [True]

    def refuse(dbapi_connection: Any, record: Any, proxy: Any) -> None:
        if dead[0]:
            raise DisconnectionError("the server cut this connection")

    event.listen(engine, "checkout", refuse)
    try:
        with pytest.raises(Exception) as raised:
            driver.checkout(engine)
        assert is_connection_error(raised.value), repr(raised.value)
        dead[0] = False  # the server is back: the next check-out works
        connection = driver.checkout(engine)
        connection.close()
    finally:
        engine.dispose()
