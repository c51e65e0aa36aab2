"""``Job.steps`` on real PostgreSQL wherever a user reads a job: loaded by ``get_job`` and
``aget_job``, loaded on first read in the caller's open session, and, on a job detached without
them (``list_jobs``, a closed session), a ``DetachedInstanceError`` that names the job and says
to read them with ``get_job``."""

from __future__ import annotations

import asyncio

import pytest
from sqlalchemy import select
from sqlalchemy.orm import selectinload
from sqlalchemy.orm.exc import DetachedInstanceError

from pgqueue import Job, JobContext, JobState, PgQueue
from pgqueue.testing import immediate


def job_with_two_steps(pgq: PgQueue) -> int:
    @pgq.task(name="two_steps", pass_context=True)
    def two_steps(ctx: JobContext) -> str:
        ctx.step("fetch", lambda: {"rows": 3})
        ctx.step("store", lambda: "stored")
        return "done"

    with immediate(pgq):
        job_id = two_steps.enqueue()
    assert pgq.get_job(job_id).state is JobState.SUCCEEDED
    return job_id


def detached_message(job_id: int) -> str:
    return (
        f"job {job_id}'s steps were not loaded with it and it is detached from its session: "
        f"read them with pgq.get_job({job_id}).steps"
    )


def test_get_job_and_aget_job_return_the_steps_loaded(pgq: PgQueue) -> None:
    job_id = job_with_two_steps(pgq)
    assert [(s.name, s.result) for s in pgq.get_job(job_id).steps] == [
        ("fetch", {"rows": 3}),
        ("store", "stored"),
    ]
    job = asyncio.run(pgq.aget_job(job_id))
    assert [s.name for s in job.steps] == ["fetch", "store"]


def test_a_listed_job_read_without_its_steps_says_which_job_and_to_use_get_job(
    pgq: PgQueue,
) -> None:
    job_id = job_with_two_steps(pgq)
    [listed] = pgq.admin.list_jobs().jobs
    assert listed.id == job_id
    with pytest.raises(DetachedInstanceError) as raised:
        listed.steps
    assert str(raised.value).startswith(detached_message(job_id))


def test_a_job_of_the_callers_session_loads_its_steps_while_the_session_is_open(
    pgq: PgQueue,
) -> None:
    job_id = job_with_two_steps(pgq)
    with pgq.sessions() as session:
        job = session.get(Job, job_id)
        assert job is not None
        assert [s.name for s in job.steps] == ["fetch", "store"]
        eager = session.scalars(
            select(Job).where(Job.id == job_id).options(selectinload(Job.steps))
        ).one()
        assert [s.name for s in eager.steps] == ["fetch", "store"]
    assert [s.name for s in job.steps] == ["fetch", "store"]  # loaded: still readable


def test_a_job_of_a_closed_session_read_without_its_steps_says_which_job(pgq: PgQueue) -> None:
    job_id = job_with_two_steps(pgq)
    with pgq.sessions() as session:
        job = session.get(Job, job_id)
        assert job is not None
    with pytest.raises(DetachedInstanceError) as raised:
        job.steps
    assert str(raised.value).startswith(detached_message(job_id))
