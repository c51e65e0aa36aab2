"""Handlers that raise ``KeyboardInterrupt``, ``SystemExit`` or another exception that is not an
``Exception``: a worker fails that attempt and runs on, whether the handler is synchronous or
``async def`` (asyncio re-raises the first two out of its event loop); immediate mode, which
runs handlers in its caller's thread, lets them reach the caller, with the job given back."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys

import pytest
from sqlalchemy import URL

from pgqueue import JobState, PgQueue
from pgqueue.testing import immediate, run_jobs


@pytest.mark.timeout(60)
def test_a_worker_fails_only_the_attempts_that_raised_an_interrupt(pgq: PgQueue) -> None:
    @pgq.task(name="async_interrupt", max_attempts=1)
    async def async_interrupt() -> None:
        raise KeyboardInterrupt("async ctrl-c")

    @pgq.task(name="async_exit", max_attempts=1)
    async def async_exit() -> None:
        raise SystemExit(5)

    @pgq.task(name="nested_interrupt", max_attempts=1)
    async def nested_interrupt() -> None:
        async def inner() -> None:
            raise KeyboardInterrupt("in a task of the handler's")

        await asyncio.gather(inner())

    @pgq.task(name="sync_interrupt", max_attempts=1)
    def sync_interrupt() -> None:
        raise KeyboardInterrupt("sync ctrl-c")

    @pgq.task(name="fine")
    async def fine(n: int) -> int:
        await asyncio.sleep(0.01)
        return n

    raising = {
        async_interrupt.enqueue(): "KeyboardInterrupt: async ctrl-c",
        async_exit.enqueue(): "SystemExit: 5",
        nested_interrupt.enqueue(): "KeyboardInterrupt: in a task of the handler's",
        sync_interrupt.enqueue(): "KeyboardInterrupt: sync ctrl-c",
    }
    fine_ids = [fine.enqueue(n) for n in range(6)]
    more_raising = async_interrupt.enqueue()  # after the fine ones: the loop must still run it

    runs = run_jobs(pgq, concurrency=4)

    assert sorted(run.job_id for run in runs) == sorted([*raising, *fine_ids, more_raising])
    for job_id, error in raising.items():
        job = pgq.get_job(job_id)
        assert (job.state, job.attempts) == (JobState.FAILED, 1)
        assert job.last_error is not None and job.last_error.rstrip().endswith(error)
    assert pgq.get_job(more_raising).state is JobState.FAILED
    assert [pgq.get_job(i).result for i in fine_ids] == list(range(6))
    assert {pgq.get_job(i).state for i in fine_ids} == {JobState.SUCCEEDED}


# A program in immediate mode whose handler sleeps until the test presses Ctrl-C: a process of
# its own, whose main thread runs the handler, as a terminal's Ctrl-C reaches it.
CTRL_C_PROGRAM = """
import signal, sys, time
from pgqueue import PgQueue
from pgqueue.testing import immediate

# Ctrl-C as at a terminal: a test run started in the background by a non-interactive shell
# hands its processes SIGINT ignored, which Python then leaves ignored.
signal.signal(signal.SIGINT, signal.default_int_handler)

pgq = PgQueue(sys.argv[1])

@pgq.task(name="slow")
def slow() -> None:
    print("started", flush=True)
    # Short sleeps: a signal that arrives before a sleep starts is only acted on after it.
    for _ in range(300):
        time.sleep(0.1)

began = time.monotonic()
try:
    with immediate(pgq) as mode:
        slow.enqueue()
except KeyboardInterrupt:
    print(f"interrupted after {time.monotonic() - began:.1f}s, {len(mode.runs)} runs")
"""


@pytest.mark.slow
def test_immediate_mode_lets_a_ctrl_c_reach_its_caller_and_gives_the_job_back(
    pgq: PgQueue, database_url: URL
) -> None:
    program = subprocess.Popen(
        [sys.executable, "-c", CTRL_C_PROGRAM, database_url.render_as_string(hide_password=False)],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert program.stdout is not None
    assert program.stdout.readline() == "started\n"
    program.send_signal(signal.SIGINT)
    out, _ = program.communicate(timeout=20)
    assert program.returncode == 0
    seconds = float(out.split()[2].rstrip("s,"))
    assert seconds < 10 and out.endswith(" 0 runs\n"), out
    (job,) = pgq.admin.list_jobs().jobs
    assert (job.state, job.attempts, job.last_error) == (JobState.QUEUED, 0, None)


def test_immediate_mode_lets_a_tests_failure_through_and_records_exceptions(
    pgq: PgQueue,
) -> None:
    @pgq.task(name="fails_the_test")
    def fails_the_test() -> None:
        pytest.fail("the handler saw something wrong")

    @pgq.task(name="async_exits")
    async def async_exits() -> None:
        raise SystemExit(3)

    @pgq.task(name="raises", max_attempts=1)
    def raises() -> None:
        raise ValueError("an ordinary failure")

    with immediate(pgq) as mode:
        with pytest.raises(pytest.fail.Exception, match="the handler saw something wrong"):
            fails_the_test.enqueue()
        with pytest.raises(SystemExit):
            async_exits.enqueue()
        failed = raises.enqueue()
    assert [(run.job_id, run.state) for run in mode.runs] == [(failed, JobState.FAILED)]
    states = {job.task_name: (job.state, job.attempts) for job in pgq.admin.list_jobs().jobs}
    assert states == {
        "fails_the_test": (JobState.QUEUED, 0),
        "async_exits": (JobState.QUEUED, 0),
        "raises": (JobState.FAILED, 1),
    }
