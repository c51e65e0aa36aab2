"""Statements of durable sleep and signals: send a signal to a job (and wake it when it waits
for that signal), read the signal a handler waits for, wake the jobs a batch of suspensions
just put to sleep whose signal had already arrived, and read what a suspended job waits for.

The ``suspend`` outcome itself lives with the other outcomes (``sql.outcomes.suspend``). A job
waiting for a signal is QUEUED with a ticket at its deadline; waking it moves that ticket to
``now()`` and tells idle workers (``sql.common.woken``). Nothing here is on the claim path.
"""

from __future__ import annotations

from functools import cache
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    ColumnElement,
    Float,
    Select,
    Text,
    bindparam,
    cast,
    exists,
    func,
    literal,
    select,
    true,
    update,
)
from sqlalchemy.dialects.postgresql import insert

from pgqueue.models import Job, JobSignal, JobSuspension, MessageQueue
from pgqueue.sql.common import array_param, woken
from pgqueue.states import JobState


def _current(job_id: Any) -> list[ColumnElement[bool]]:
    """The job ``job_id`` is QUEUED by the suspension recorded for it (no state change since)."""
    return [
        JobSuspension.job_id == job_id,
        Job.id == JobSuspension.job_id,
        Job.state == JobState.QUEUED.value,
        Job.updated_at == JobSuspension.suspended_at,
    ]


@cache
def lock_for_signal() -> Select[JobState]:
    """The state of job ``job_id``, its row locked (``FOR NO KEY UPDATE``) until the
    transaction ends: the first statement of a signal. A suspension being written for the job
    holds the same lock, so the signal's next statement, in a snapshot taken after that lock
    was granted, sees the suspension, or the suspension's own follow-up (``wake_signalled``)
    sees the signal: never neither."""
    return (
        select(Job.state)
        .where(Job.id == bindparam("job_id", type_=BigInteger))
        .with_for_update(key_share=True)
    )


@cache
def send_signal() -> Select[str]:
    """Store signal ``name`` of job ``target`` with ``payload`` (JSON text), unless one of that
    name is stored already; when it is stored and the job is suspended waiting for it, move the
    job's ticket to now and wake idle workers. Returns the name when stored, no row otherwise."""
    # Bound as ``target``, not ``job_id``: an UPDATE would SET the column a bind is named after.
    job_id = bindparam("target", type_=BigInteger)
    name = bindparam("name", type_=Text)
    stored = (
        insert(JobSignal)
        .values(job_id=job_id, name=name, payload=cast(bindparam("payload", type_=Text), JSON))
        .on_conflict_do_nothing(index_elements=[JobSignal.job_id, JobSignal.name])
        .returning(JobSignal.name)
        .cte("stored")
    )
    waiting = exists(
        select(JobSuspension.job_id).where(*_current(job_id), JobSuspension.signal == name)
    )
    # SKIP LOCKED: a ticket locked now is being claimed (its deadline came) or cancelled, and
    # waiting for it while holding the job's row could deadlock with that claim or cancel,
    # which take the ticket first and the job's row next. A claimed job's handler reads the
    # signal once this transaction ends (the claim waits for the job's row).
    ticket = (
        select(MessageQueue.job_id)
        .where(
            MessageQueue.job_id == job_id,
            MessageQueue.run_at > func.now(),
            waiting,
            exists(select(stored.c.name)),
        )
        .with_for_update(skip_locked=True)
        .scalar_subquery()
    )
    woke = (
        update(MessageQueue)
        .where(MessageQueue.job_id == ticket)
        .values(run_at=func.now())
        .returning(MessageQueue.queue, MessageQueue.run_at)
        .cte("signal_wake")
    )
    return select(stored.c.name).add_cte(woke).where(woken(woke))


@cache
def wake_signalled() -> Select[str]:
    """Move to now the tickets of the jobs ``ids`` (array) that a suspension just put to wait
    for a signal already stored (sent while the handler was still running), and wake idle
    workers. Run after ``sql.outcomes.suspend`` in its transaction. Returns their queues."""
    signalled = exists(
        select(JobSignal.job_id).where(
            *_current(MessageQueue.job_id),
            JobSignal.job_id == MessageQueue.job_id,
            JobSignal.name == JobSuspension.signal,
        )
    )
    woke = (
        update(MessageQueue)
        .where(
            MessageQueue.job_id == func.any(array_param("ids", BigInteger)),
            MessageQueue.run_at > func.now(),
            signalled,
        )
        .values(run_at=func.now())
        .returning(MessageQueue.queue, MessageQueue.run_at)
        .cte("signalled")
    )
    return select(woke.c.queue).where(woken(woke))


@cache
def waited_signal() -> Select[float, str | None, float | None]:
    """The database clock, and the payload (JSON text) of signal ``name`` of job ``job_id``
    with when it was stored (both null when none was sent), times in epoch seconds: what
    ``ctx.sleep`` and ``ctx.wait_for_signal`` read."""
    sent = (
        select(cast(JobSignal.payload, Text), JobSignal.sent_at)
        .where(
            JobSignal.job_id == bindparam("job_id", type_=BigInteger),
            JobSignal.name == bindparam("name", type_=Text),
        )
        .subquery("sent")
    )
    now = cast(func.extract("epoch", func.now()), Float)
    return (
        select(now, sent.c.payload, cast(func.extract("epoch", sent.c.sent_at), Float))
        .select_from(select(literal(1)).subquery("clock"))
        .outerjoin(sent, true())
    )


@cache
def suspension() -> Select[str | None, object, bool]:
    """What job ``job_id`` is suspended for, while its suspension is current: the signal it
    waits for (null: it sleeps), its wake time, and whether that signal has arrived."""
    job_id = bindparam("job_id", type_=BigInteger)
    arrived = exists(
        select(JobSignal.job_id).where(
            JobSignal.job_id == JobSuspension.job_id, JobSignal.name == JobSuspension.signal
        )
    )
    return select(JobSuspension.signal, JobSuspension.wake_at, arrived).where(*_current(job_id))
