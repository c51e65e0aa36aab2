"""Tickets without a foreign key: no path leaves one behind, and one that is
left behind anyway (a host deleting job rows by hand) runs nothing and blocks nothing.

- ``delete_job`` (dashboard) and pruning delete the tickets of the jobs they delete, in the same
  statement (no foreign key cascades the delete).
- A claim that picks a ticket whose job is gone, or whose job is not waiting, deletes the ticket,
  returns no job for it, changes no job, and does not count it against a queue's limit.
"""

from __future__ import annotations

from sqlalchemy import Engine, text

from pgqueue import JobState, PgQueue
from pgqueue.data import admin as admin_data
from pgqueue.db import executor_for
from pgqueue.sql.claim import ClaimVariant, claim


def _tickets(engine: Engine) -> list[int]:
    with engine.connect() as connection:
        rows = connection.execute(text("SELECT job_id FROM pgqueue_message_queue ORDER BY 1"))
        return [row[0] for row in rows]


def _execute(engine: Engine, sql: str, **params: object) -> None:
    with engine.begin() as connection:
        connection.execute(text(sql), params)


def _claim(pgq: PgQueue, *, limits: bool) -> list[int]:
    """One claim of up to 10 jobs with the chosen claim variant, committed."""
    params = {"limit": 10, "worker": "test", "lease_seconds": 30.0}
    stmt = claim(
        ClaimVariant(atomic=False, some_queues=False, queue_limits=limits, task_leases=False)
    )
    with pgq.sessions() as session, session.begin():
        return sorted(row.id for row in session.connection().execute(stmt, params))


def test_delete_job_deletes_its_ticket(pgq: PgQueue, engine: Engine) -> None:
    @pgq.task(name="t")
    def t(n: int) -> None:
        return None

    queued, delayed, kept = t.enqueue(1), t.configure(delay=3600).enqueue(2), t.enqueue(3)
    with pgq.sessions() as session, session.begin():
        assert admin_data.delete_job(executor_for(session), queued)
        assert admin_data.delete_job(executor_for(session), delayed)
        assert not admin_data.delete_job(executor_for(session), queued)  # already gone
    assert _tickets(engine) == [kept]
    [running] = _claim(pgq, limits=False)
    with pgq.sessions() as session, session.begin():
        assert not admin_data.delete_job(
            executor_for(session), running
        )  # its worker still holds it
    assert pgq.get_job(running).state is JobState.RUNNING


def test_prune_deletes_the_tickets_of_pruned_jobs(pgq: PgQueue, engine: Engine) -> None:
    @pgq.task(name="t")
    def t(n: int) -> None:
        return None

    old, waiting = t.enqueue(1), t.enqueue(2)
    # A finished job that still has a ticket (only a hand edit can make one): pruning it must
    # not leave the ticket behind.
    _execute(
        engine,
        "UPDATE pgqueue_jobs SET state = 'succeeded', finished_at = now() - interval '30 days'"
        " WHERE id = :id",
        id=old,
    )
    assert pgq.prune() == 1
    assert _tickets(engine) == [waiting]
    assert pgq.get_job(waiting).state is JobState.QUEUED


def test_claim_deletes_an_orphan_ticket_and_runs_nothing(pgq: PgQueue, engine: Engine) -> None:
    @pgq.task(name="t")
    def t(n: int) -> None:
        return None

    for limits in (False, True):
        gone, finished, real = t.enqueue(1), t.enqueue(2), t.enqueue(3)
        _execute(engine, "DELETE FROM pgqueue_jobs WHERE id = :id", id=gone)
        _execute(engine, "UPDATE pgqueue_jobs SET state = 'succeeded' WHERE id = :id", id=finished)
        assert _tickets(engine) == [gone, finished, real]
        assert _claim(pgq, limits=limits) == [real]
        assert _tickets(engine) == []
        assert pgq.get_job(finished).state is JobState.SUCCEEDED
        assert pgq.get_job(finished).attempts == 0


def test_orphan_tickets_do_not_count_against_a_queue_limit(pgq: PgQueue, engine: Engine) -> None:
    @pgq.task(name="t", queue="limited")
    def t(n: int) -> None:
        return None

    pgq.set_queue_limit("limited", 3)
    gone, finished, real = t.enqueue(1), t.enqueue(2), t.enqueue(3)
    _execute(engine, "DELETE FROM pgqueue_jobs WHERE id = :id", id=gone)
    _execute(engine, "UPDATE pgqueue_jobs SET state = 'succeeded' WHERE id = :id", id=finished)
    assert _claim(pgq, limits=True) == [real]
    assert pgq.admin.queue_settings()["limited"].running == 1
    # The limit's room is what it should be: two more jobs run, the third waits.
    more = [t.enqueue(n) for n in range(4, 7)]
    assert _claim(pgq, limits=True) == more[:2]
    assert _tickets(engine) == [more[2]]
