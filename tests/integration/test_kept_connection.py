"""Single enqueues outside a transaction keep one connection checked out between them.

On an engine pgqueue made, back-to-back ``task.enqueue`` calls run on one backend that stays out
of the pool between them; ``dispose`` gives it back and the server sees it go. A kept
connection the server ended is replaced before the next enqueue, which writes its job once.
A host's engine keeps nothing. A forked child enqueues on a connection of its own and leaves
its parent's working.
"""

from __future__ import annotations

import os

from server_databases import count_on, wait_until_backend_gone
from sqlalchemy import Engine
from sqlalchemy.engine import URL

from pgqueue import PgQueue


def _backend_of_kept(pgq: PgQueue) -> int:
    """The backend pid of the connection kept after the last enqueue."""
    kept = pgq.database._kept
    assert kept is not None and kept._idle is not None
    connection = kept._idle.driver_connection
    assert connection is not None
    return int(connection.info.backend_pid)


def test_back_to_back_enqueues_run_on_one_kept_connection(pgq: PgQueue, database_url: URL) -> None:
    @pgq.task(name="kept.noop")
    def noop(n: int) -> None:
        """Does nothing."""

    noop.enqueue(n=0)
    pid = _backend_of_kept(pgq)
    pool = pgq.engine.pool
    assert pool.checkedout() == 1  # type: ignore[attr-defined]
    for n in range(1, 20):
        noop.enqueue(n=n)
    assert _backend_of_kept(pgq) == pid
    assert pool.checkedout() == 1  # type: ignore[attr-defined]

    pgq.dispose()
    assert pool.checkedout() == 0  # type: ignore[attr-defined]
    wait_until_backend_gone(database_url, pid)
    assert count_on(database_url, "SELECT count(*) FROM pgqueue_jobs") == 20


def test_a_kept_connection_the_server_ended_is_replaced(pgq: PgQueue, database_url: URL) -> None:
    @pgq.task(name="kept.noop")
    def noop(n: int) -> None:
        """Does nothing."""

    noop.enqueue(n=0)
    old = _backend_of_kept(pgq)
    assert count_on(database_url, "SELECT count(pg_terminate_backend(:pid))", pid=old) == 1
    wait_until_backend_gone(database_url, old)

    noop.enqueue(n=1)
    assert _backend_of_kept(pgq) != old
    assert count_on(database_url, "SELECT count(*) FROM pgqueue_jobs") == 2


def test_a_hosts_engine_keeps_no_connection(engine: Engine) -> None:
    pgq = PgQueue(engine)

    @pgq.task(name="kept.noop")
    def noop(n: int) -> None:
        """Does nothing."""

    noop.enqueue(n=0)
    assert pgq.database._kept is None
    assert engine.pool.checkedout() == 0  # type: ignore[attr-defined]


def test_a_forked_child_enqueues_on_its_own_connection(pgq: PgQueue, database_url: URL) -> None:
    @pgq.task(name="kept.noop")
    def noop(n: int) -> None:
        """Does nothing."""

    noop.enqueue(n=0)
    parent_backend = _backend_of_kept(pgq)
    child = os.fork()
    if child == 0:
        status = 1
        try:
            noop.enqueue(n=1)
            status = 0 if _backend_of_kept(pgq) != parent_backend else 2
        finally:
            os._exit(status)
    _, status = os.waitpid(child, 0)
    assert os.waitstatus_to_exitcode(status) == 0

    noop.enqueue(n=2)
    assert _backend_of_kept(pgq) == parent_backend
    assert count_on(database_url, "SELECT count(*) FROM pgqueue_jobs") == 3
