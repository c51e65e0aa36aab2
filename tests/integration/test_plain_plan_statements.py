"""A plan with no parents, roles or dependencies (``enqueue_many``'s) costs one statement.

Counted through SQLAlchemy's ``before_cursor_execute``: ``enqueue_many`` of 10 plain jobs sends
exactly one statement, and so does a plan of keyed jobs whose keys are free; one whose key is
held adds the lookup of its holder, whose id comes back in that job's place (the others' ids in
the plan's order, though the rows go in in key order). The statement's guard stops at a
bound that this process has not seen (set by another): a batch that does not fit raises
``QueueFull`` with nothing written, one that fits goes in through the queue's lock.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import pytest
from sqlalchemy import Engine, event, func, select
from sqlalchemy.engine import URL

from pgqueue import Job, MessageQueue, PgQueue, QueueFull, Settings, Task
from pgqueue.data import enqueue as enqueue_data
from pgqueue.db import ConnectionExecutor
from pgqueue.jobs import NewJob, Plan


@pytest.fixture
def report(pgq: PgQueue) -> Task[[int], None]:
    @pgq.task(name="report", queue="reports")
    def report(n: int) -> None:
        pass

    return report


@pytest.fixture
def other(database_url: URL, settings: Settings) -> Iterator[PgQueue]:
    """A second PgQueue on the same database: another process's view."""
    queue = PgQueue(database_url.render_as_string(hide_password=False), settings=settings)
    yield queue
    queue.dispose()


@contextmanager
def statements(engine: Engine) -> Iterator[list[str]]:
    """The statements sent on ``engine`` meanwhile (a listener also keeps the driver path off,
    so every statement passes through SQLAlchemy)."""
    sent: list[str] = []

    def record(*args: object) -> None:
        sent.append(str(args[2]))

    event.listen(engine, "before_cursor_execute", record)
    try:
        yield sent
    finally:
        event.remove(engine, "before_cursor_execute", record)


def written(pgq: PgQueue, queue: str) -> tuple[int, int]:
    """(jobs of ``queue``, their tickets)."""
    with pgq.engine.connect() as connection:
        jobs = connection.scalar(select(func.count()).where(Job.queue == queue)) or 0
        tickets = connection.scalar(select(func.count()).where(MessageQueue.queue == queue)) or 0
    return jobs, tickets


def test_enqueue_many_of_plain_jobs_is_one_statement(
    pgq: PgQueue, report: Task[[int], None]
) -> None:
    with statements(pgq.engine) as sent:
        ids = report.enqueue_many([[n] for n in range(10)])
    assert len(sent) == 1, sent
    with pgq.engine.connect() as connection:
        args = dict(connection.execute(select(Job.id, Job.args).where(Job.id.in_(ids))).all())
    assert [args[i] for i in ids] == [[n] for n in range(10)]
    assert written(pgq, "reports") == (10, 10)


def test_a_plain_plan_of_keyed_jobs_is_one_statement_and_a_held_key_adds_its_lookup(
    pgq: PgQueue,
) -> None:
    def job(n: int, key: str | None) -> NewJob:
        return NewJob("t", "keyed", f"[{n}]", "{}", 0, 3, None, None, key, False)

    with statements(pgq.engine) as sent, pgq.engine.begin() as connection:
        first = enqueue_data.write(ConnectionExecutor(connection), Plan([job(0, "b"), job(9, "d")]))
    assert len(sent) == 1, sent
    holder = first.ids[0]
    # The keys out of the plan's order.
    plan = Plan([job(1, "c"), job(2, None), job(3, "b"), job(4, "a")])
    with statements(pgq.engine) as sent, pgq.engine.begin() as connection:
        ids = enqueue_data.write(ConnectionExecutor(connection), plan).ids
    assert len(sent) == 2, sent
    assert ids[2] == holder
    with pgq.engine.connect() as connection:
        args = dict(connection.execute(select(Job.id, Job.args).where(Job.id.in_(ids))).all())
    assert [args[i] for i in ids] == [[1], [2], [0], [4]]
    assert ids[0] < ids[1] < ids[3]
    assert written(pgq, "keyed") == (5, 5)


def test_the_guard_of_a_plain_plan_stops_at_a_bound_this_process_has_not_seen(
    pgq: PgQueue, other: PgQueue, report: Task[[int], None]
) -> None:
    other.set_queue_max_depth("reports", 5)
    with pytest.raises(QueueFull) as raised:
        report.enqueue_many([[n] for n in range(6)])
    assert (raised.value.depth, raised.value.asked, raised.value.max_depth) == (0, 6, 5)
    assert written(pgq, "reports") == (0, 0)
    other.set_queue_max_depth("reports", None)
    report.enqueue_many([[0]])  # unbounded, as this process now learns
    other.set_queue_max_depth("reports", 5)
    ids = report.enqueue_many([[n] for n in range(4)])
    assert len(ids) == len(set(ids)) == 4
    assert written(pgq, "reports") == (5, 5)
    with pytest.raises(QueueFull):
        report.enqueue_many([[n] for n in range(2)])
    assert written(pgq, "reports") == (5, 5)
