"""A leased handler whose session's connection broke: the rollback pgqueue does after the
handler raised fails too (the transaction is gone with its connection). That must end the
attempt like any failure, retried, and leave the worker's thread and slot free for the next
job, not escape as a worker thread error."""

from __future__ import annotations

import logging

import pytest
from sqlalchemy import text
from support.workers import in_thread

from pgqueue import JobContext, JobState, PgQueue, backoff
from pgqueue.worker import Worker


def test_a_handler_whose_session_connection_broke_fails_its_attempt_and_frees_its_slot(
    pgq: PgQueue, caplog: pytest.LogCaptureFixture
) -> None:
    @pgq.task(
        name="breaks_its_session", pass_context=True, max_attempts=2, retry=backoff.constant(0)
    )
    def breaks_its_session(ctx: JobContext) -> str:
        if ctx.attempt == 1:
            ctx.session.execute(text("SELECT 1"))
            with pgq.engine.begin() as other:
                pid = ctx.session.execute(text("SELECT pg_backend_pid()")).scalar_one()
                other.execute(text("SELECT pg_terminate_backend(:pid)"), {"pid": pid})
            raise RuntimeError("the handler failed after its connection was cut")
        return "second attempt"

    @pgq.task(name="after")
    def after() -> str:
        return "ran"

    first = breaks_its_session.enqueue()
    second = after.enqueue()
    with (
        caplog.at_level(logging.WARNING, logger="pgqueue"),
        in_thread(Worker(pgq, concurrency=1)),
    ):
        done = {i: pgq.wait_for(i, timeout=30) for i in (first, second)}
    assert (done[first].state, done[first].attempts, done[first].result) == (
        JobState.SUCCEEDED,
        2,
        "second attempt",
    )
    assert "the handler failed after its connection was cut" in str(done[first].errors)
    assert done[second].state is JobState.SUCCEEDED
    assert "worker thread error" not in caplog.text
