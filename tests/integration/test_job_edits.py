"""An operator's edits of one job that has not started (``pgq.admin.reschedule``, ``run_now``,
``set_priority``): the job's row and its ticket change in one transaction with one audit row,
the claim follows the new values, and jobs that are running, finished, suspended or a
workflow's closing marker are refused with nothing written.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import threading

import pytest
from sqlalchemy import Engine, select, text
from sqlalchemy.orm import Session
from support.audit import audit_rows
from support.workers import in_thread
from test_wakeups import listening

from pgqueue import InvalidStateTransition, JobNotFound, JobState, PgQueue, ValidationError, chord
from pgqueue.admin import default_actor
from pgqueue.models import MessageQueue
from pgqueue.testing import run_until_final, wait_for_states
from pgqueue.worker import Worker

UTC = dt.UTC


def _ticket(engine: Engine, job_id: int) -> tuple[dt.datetime, int] | None:
    with Session(engine) as session:
        row = session.execute(
            select(MessageQueue.run_at, MessageQueue.priority).where(MessageQueue.job_id == job_id)
        ).one_or_none()
        return None if row is None else (row[0], row[1])


def _db_now(engine: Engine) -> dt.datetime:
    with engine.connect() as connection:
        now: dt.datetime = connection.execute(text("SELECT now()")).scalar_one()
        return now


def test_reschedule_priority_and_run_now_move_row_and_ticket_with_one_audit_row_each(
    pgq: PgQueue, engine: Engine
) -> None:
    ran: list[str] = []

    @pgq.task(name="edits.record")
    def record(name: str) -> None:
        ran.append(name)

    first = record.enqueue("first")
    later = record.configure(delay=3600).enqueue("later")
    held = pgq.get_job(later)
    target = (dt.datetime.now(UTC) + dt.timedelta(hours=2)).replace(microsecond=0)

    assert pgq.admin.reschedule(later, target, actor="alice", source="dashboard") == target
    job = pgq.get_job(later)
    assert (job.state, job.run_at, job.updated_at) == (JobState.QUEUED, target, held.updated_at)
    assert _ticket(engine, later) == (target, 0)

    pgq.admin.set_priority(later, -5, actor="bob")
    assert pgq.get_job(later).priority == -5
    assert _ticket(engine, later) == (target, -5)

    before = _db_now(engine)
    now = pgq.admin.run_now(later)
    assert before <= now <= _db_now(engine)
    assert pgq.get_job(later).run_at == now
    assert _ticket(engine, later) == (now, -5)

    assert audit_rows(engine, "actor", "source", "action", "filter", "count") == [
        ("alice", "dashboard", "reschedule", {"job_id": later, "run_at": target.isoformat()}, 1),
        ("bob", "api", "set_priority", {"job_id": later, "priority": -5}, 1),
        (default_actor(), "api", "run_now", {"job_id": later, "run_at": now.isoformat()}, 1),
    ]
    # The claim reads the ticket: the job runs now, and first, by its new priority.
    stats = pgq.run_worker(drain=True, concurrency=1)
    assert stats.succeeded == 2
    assert ran == ["later", "first"]
    assert pgq.get_job(first).state is JobState.SUCCEEDED


def test_edits_are_refused_for_running_finished_missing_and_suspended_jobs(
    pgq: PgQueue, engine: Engine
) -> None:
    release = threading.Event()

    @pgq.task(name="edits.blocks")
    def blocks() -> None:
        release.wait(30)

    @pgq.task(name="edits.quick")
    def quick() -> None:
        return None

    later = dt.datetime.now(UTC) + dt.timedelta(hours=1)
    done = quick.enqueue()
    pgq.run_worker(drain=True)
    with pytest.raises(InvalidStateTransition, match=f"cannot reschedule job {done}: it has "):
        pgq.admin.reschedule(done, later)
    with pytest.raises(InvalidStateTransition, match="it has succeeded"):
        pgq.admin.set_priority(done, 3)
    with pytest.raises(JobNotFound):
        pgq.admin.run_now(10_000)

    running = blocks.enqueue()
    with in_thread(Worker(pgq, concurrency=1)):
        wait_for_states(pgq, [running], {JobState.RUNNING}, timeout=30)
        with pytest.raises(InvalidStateTransition, match="it is running"):
            pgq.admin.run_now(running)
        with pytest.raises(InvalidStateTransition, match="it is running"):
            pgq.admin.set_priority(running, 1)
        release.set()

    # A suspended job (as ``ctx.sleep`` leaves it): its ticket's run_at is its wake time.
    sleeper = quick.configure(delay=600).enqueue()
    with engine.begin() as connection:
        connection.execute(
            text(
                "INSERT INTO pgqueue_job_suspensions (job_id, signal, wake_at, suspended_at) "
                "SELECT id, NULL, run_at, updated_at FROM pgqueue_jobs WHERE id = :id"
            ),
            {"id": sleeper},
        )
    wake = _ticket(engine, sleeper)
    with pytest.raises(InvalidStateTransition, match="it is suspended"):
        pgq.admin.run_now(sleeper)
    assert _ticket(engine, sleeper) == wake
    # Its priority may change: the suspension still describes it (its updated_at is kept).
    pgq.admin.set_priority(sleeper, 7)
    assert _ticket(engine, sleeper) == (wake[0], 7) if wake else False
    explained = pgq.explain_job(sleeper)
    assert [b.kind.value for b in explained.blockers][:1] == ["suspended"]
    assert [
        row[2] for row in audit_rows(engine, "actor", "source", "action", "filter", "count")
    ] == ["set_priority"]


def test_a_queued_row_without_a_ticket_is_refused_naming_the_missing_ticket(
    pgq: PgQueue, engine: Engine
) -> None:
    with engine.begin() as connection:
        job_id = connection.execute(
            text(
                "INSERT INTO pgqueue_jobs (task_name, queue, state, args) "
                "VALUES ('by.hand', 'default', 'queued', '[]') RETURNING id"
            )
        ).scalar_one()
    held = pgq.get_job(job_id)
    for edit in (
        lambda: pgq.admin.run_now(job_id),
        lambda: pgq.admin.set_priority(job_id, 4),
        lambda: pgq.admin.reschedule(job_id, dt.datetime.now(UTC) + dt.timedelta(hours=1)),
    ):
        with pytest.raises(InvalidStateTransition, match="it is queued but has no ticket"):
            edit()
    job = pgq.get_job(job_id)
    assert (job.run_at, job.priority, job.updated_at) == (
        held.run_at,
        held.priority,
        held.updated_at,
    )
    assert audit_rows(engine, "action") == []


def test_bad_arguments_are_refused_before_any_sql(pgq: PgQueue, engine: Engine) -> None:
    @pgq.task(name="edits.any")
    def any_task() -> None:
        return None

    job_id = any_task.enqueue()
    far = dt.datetime.now(UTC) + dt.timedelta(days=3651)
    for call, message in [
        (lambda: pgq.admin.reschedule(job_id, dt.datetime(2030, 1, 1)), "timezone-aware"),
        (lambda: pgq.admin.reschedule(job_id, far), "within 3650 days"),
        (lambda: pgq.admin.reschedule(job_id, None), "use run_now"),  # type: ignore[arg-type]
        (lambda: pgq.admin.set_priority(job_id, 40_000), "within -32768..32767"),
        (lambda: pgq.admin.set_priority(job_id, True), "priority must be an int"),
        (lambda: pgq.admin.run_now(0), "job id must be a positive int"),
        (lambda: pgq.admin.run_now(job_id, actor=""), "actor must be"),
        (lambda: pgq.admin.run_now(job_id, source="web"), "source must be one of"),
        (lambda: pgq.cancel_job(job_id, source="web"), "source must be one of"),
    ]:
        with pytest.raises(ValidationError, match=message):
            call()
    assert pgq.get_job(job_id).state is JobState.QUEUED
    assert audit_rows(engine, "actor", "source", "action", "filter", "count") == []


def test_waiting_jobs_and_workflow_members_are_edited_and_closing_markers_refused(
    pgq: PgQueue, engine: Engine
) -> None:
    @pgq.task(name="edits.square")
    def square(x: int) -> int:
        return x * x

    @pgq.task(name="edits.collect")
    def collect(results: list[int]) -> list[int]:
        return results

    parent = square.configure(delay=3600).enqueue(9)
    child = square.configure(depends_on=[parent]).enqueue(5)
    target = (dt.datetime.now(UTC) + dt.timedelta(minutes=30)).replace(microsecond=0)
    pgq.admin.reschedule(child, target)
    pgq.admin.set_priority(child, 2)
    job = pgq.get_job(child)
    assert (job.state, job.run_at, job.priority) == (JobState.WAITING, target, 2)
    assert _ticket(engine, child) is None

    # A member's run_at and priority change when and in what order it runs, never its result.
    wf = chord([square.s(1), square.s(2).set(delay=3600), square.s(3)], collect.s()).enqueue()
    delayed = wf.job_ids[1]
    pgq.admin.run_now(delayed, actor="ops")
    pgq.admin.set_priority(delayed, -1, actor="ops")
    with pytest.raises(InvalidStateTransition, match="closing marker of workflow"):
        pgq.admin.run_now(wf.closing_job_id)
    assert run_until_final(pgq, [wf.closing_job_id]) == {wf.closing_job_id: JobState.SUCCEEDED}
    assert pgq.get_workflow(wf.id).result == [1, 4, 9]


def test_async_edits_run_the_same_bodies(pgq: PgQueue, engine: Engine) -> None:
    @pgq.task(name="edits.async")
    def later() -> None:
        return None

    job_id = later.configure(delay=3600).enqueue()
    target = (dt.datetime.now(UTC) + dt.timedelta(hours=3)).replace(microsecond=0)

    async def main() -> dt.datetime:
        assert await pgq.admin.areschedule(job_id, target, actor="a") == target
        await pgq.admin.aset_priority(job_id, 4, actor="a")
        with pytest.raises(JobNotFound):
            await pgq.admin.arun_now(10_000, actor="a")
        now = await pgq.admin.arun_now(job_id, actor="a")
        page = await pgq.admin.aaudit_log(limit=10)
        assert [e.action for e in page.entries] == ["run_now", "set_priority", "reschedule"]
        await pgq.adispose()
        return now

    now = asyncio.run(main())
    assert _ticket(engine, job_id) == (now, 4)


def test_a_rescheduled_ticket_wakes_idle_workers_and_a_new_priority_does_not(
    pgq: PgQueue, engine: Engine
) -> None:
    @pgq.task(name="edits.wake", queue="wakes")
    def wake() -> None:
        return None

    job_id = wake.configure(delay=3600).enqueue()
    later = dt.datetime.now(UTC) + dt.timedelta(hours=2)
    with listening(engine) as received:
        pgq.admin.set_priority(job_id, 1)
        assert received() == []
        pgq.admin.run_now(job_id)
        assert received() == ["wakes"]
        pgq.admin.reschedule(job_id, later)
        (payload,) = received()
        queue, epoch = payload.split(" ")
        assert (queue, float(epoch)) == ("wakes", pytest.approx(later.timestamp(), abs=1e-6))
