"""The process pool (``pool="process"``): sync handlers run in child processes of the worker.

- A handler past its ``timeout`` has its child stopped at the deadline: the attempt is failed
  on time with the signal named, nothing the handler would do after the deadline happens, its
  ``ctx.session`` writes never commit, and its retry does not overlap it.
- ``soft_timeout`` raises ``SoftTimeout`` inside the handler first.
- A child that segfaults, calls ``os._exit`` or grows past ``max_memory_per_child`` costs only
  its own job: the worker goes on with a new child.
- ``max_tasks_per_child`` recycles children.
- Inside a child a handler has what it has in a thread: its context (progress, steps, session,
  snooze, durable sleep, signals), its result, its workflow, its run's span in the enqueuing
  trace; an atomic job's transaction lives in its child.
"""

from __future__ import annotations

import ctypes
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from opentelemetry import trace
from sqlalchemy import Engine, text
from sqlalchemy.engine import URL
from support.effects import committed_effects, effects_table, write_effect
from support.polling import wait_until
from support.tracing_spans import child_spans, read_child_spans
from support.workers import in_thread

from pgqueue import JobContext, JobState, PgQueue, Snooze, SoftTimeout, backoff, chain
from pgqueue.config import Settings
from pgqueue.testing import wait_for_states
from pgqueue.worker import Worker

TIMEOUT = 1.0
LATE_BY_AT_MOST = 1.5
# How long a timed-out handler would run on past its start, were its child not stopped.
RUNS_ON_FOR = 3 * TIMEOUT


@pytest.fixture
def settings() -> Settings:
    # Leases of 60 s: the heartbeat beats every 20 s, so only a deadline of its own stops a
    # child on time.
    return Settings(poll_interval=0.2, rescue_interval=0.5, lease_seconds=60.0)


@pytest.fixture
def side_table(engine: Engine) -> Iterator[None]:
    with effects_table(engine):
        yield


def _process_worker(pgq: PgQueue, **options: Any) -> Worker:
    return Worker(pgq, pool="process", **options)


def test_a_timed_out_child_is_stopped_and_nothing_after_its_deadline_happens(
    pgq: PgQueue, engine: Engine, side_table: None, tmp_path: Path
) -> None:
    after_deadline = tmp_path / "after-deadline"

    @pgq.task(
        name="pool.hangs",
        timeout=TIMEOUT,
        max_attempts=2,
        retry=backoff.constant(0),
        concurrency_key="K",
        key_limit=1,
        pass_context=True,
    )
    def hangs(ctx: JobContext) -> int:
        write_effect(ctx)
        if ctx.attempt == 1:
            time.sleep(RUNS_ON_FOR)
            after_deadline.write_text("ran on")  # must never happen: the child is gone
        return os.getpid()

    with in_thread(_process_worker(pgq, concurrency=2)):
        job_id = hangs.enqueue()
        wait_until(lambda: pgq.get_job(job_id).started_at, 30, "the first attempt's start")
        began = time.monotonic()
        final = wait_for_states(pgq, [job_id], timeout=30)
        # Past when the first run would have written, had its child lived on.
        time.sleep(max(began + RUNS_ON_FOR + 0.5 - time.monotonic(), 0))
    assert final == {job_id: JobState.SUCCEEDED}
    assert not after_deadline.exists()
    job = pgq.get_job(job_id)
    assert job.attempts == 2
    error = job.errors[0]["error"]
    assert "JobTimeout" in error and "SIGTERM" in error, error
    assert job.result != os.getpid()
    # Only the second attempt's session committed.
    assert committed_effects(engine) == [(job_id, 2)]


def test_a_child_stopped_at_its_deadline_fails_its_attempt_on_time(pgq: PgQueue) -> None:
    @pgq.task(name="pool.sleeps", timeout=TIMEOUT, max_attempts=1)
    def sleeps() -> None:
        time.sleep(30)

    with in_thread(_process_worker(pgq, concurrency=1)):
        job_id = sleeps.enqueue()
        assert wait_for_states(pgq, [job_id], timeout=30) == {job_id: JobState.FAILED}
    job = pgq.get_job(job_id)
    assert job.started_at is not None and job.finished_at is not None
    assert (job.finished_at - job.started_at).total_seconds() < TIMEOUT + LATE_BY_AT_MOST


def test_soft_timeout_is_raised_inside_the_handler_first(pgq: PgQueue) -> None:
    @pgq.task(name="pool.soft", timeout=3.0, soft_timeout=0.3, max_attempts=1)
    def soft() -> str:
        try:
            time.sleep(10)
        except SoftTimeout:
            return "cleaned up"
        return "slept"

    with in_thread(_process_worker(pgq, concurrency=1)):
        job_id = soft.enqueue()
        assert wait_for_states(pgq, [job_id], timeout=30) == {job_id: JobState.SUCCEEDED}
    assert pgq.get_job(job_id).result == "cleaned up"


def test_a_dying_child_fails_only_its_own_job(pgq: PgQueue) -> None:
    @pgq.task(name="pool.segfault", max_attempts=1)
    def segfault() -> None:
        ctypes.string_at(0)  # reads address 0: SIGSEGV

    @pgq.task(name="pool.exits", max_attempts=1)
    def exits() -> None:
        os._exit(3)

    @pgq.task(name="pool.grows", max_attempts=1)
    def grows() -> int:
        held = bytearray(2 * 1024**3)  # 2 GB, touched so that it is resident
        for offset in range(0, len(held), 4096):
            held[offset] = 1
        return os.getpid()

    @pgq.task(name="pool.pid")
    def pid() -> int:
        return os.getpid()

    with in_thread(_process_worker(pgq, concurrency=2, max_memory_per_child=300)) as worker:
        crashed, exited = segfault.enqueue(), exits.enqueue()
        grown = grows.enqueue()
        others = pid.enqueue_many([[]] * 10)
        states = wait_for_states(pgq, [crashed, exited, grown, *others], timeout=60)
        after = pid.enqueue()
        assert wait_for_states(pgq, [after], timeout=30) == {after: JobState.SUCCEEDED}
        started = worker.processes.children_started if worker.processes else 0
    assert states == {
        crashed: JobState.FAILED,
        exited: JobState.FAILED,
        grown: JobState.SUCCEEDED,
        **{job_id: JobState.SUCCEEDED for job_id in others},
    }
    assert "killed by signal SIGSEGV (11)" in (pgq.get_job(crashed).last_error or "")
    assert "exited with code 3" in (pgq.get_job(exited).last_error or "")
    # The child that grew past the cap finished its job and was replaced: no later job ran in it.
    grown_pid = pgq.get_job(grown).result
    later = {pgq.get_job(job_id).result for job_id in [*others, after]}
    assert grown_pid not in later and os.getpid() not in later
    assert started >= 4  # two slots' first children, and one after each of the three


def test_children_are_recycled_after_max_tasks_per_child(pgq: PgQueue) -> None:
    @pgq.task(name="pool.pid", pass_context=True)
    def pid(ctx: JobContext) -> int:
        ctx.progress(1.0, "done")
        return os.getpid()

    ids = pid.enqueue_many([[]] * 20)
    with in_thread(_process_worker(pgq, concurrency=2, max_tasks_per_child=5)):
        states = wait_for_states(pgq, ids, timeout=60)
    assert set(states.values()) == {JobState.SUCCEEDED}
    pids = [pgq.get_job(job_id).result for job_id in ids]
    assert len(set(pids)) >= 4 and os.getpid() not in pids
    assert all(pids.count(p) <= 5 for p in set(pids))
    assert pgq.get_job(ids[0]).progress_message == "done"


def test_steps_and_the_session_work_in_a_child(
    pgq: PgQueue, engine: Engine, side_table: None
) -> None:
    @pgq.task(name="pool.stepped", pass_context=True, max_attempts=2, retry=backoff.constant(0))
    def stepped(ctx: JobContext) -> list[int]:
        first = ctx.step("first", lambda: os.getpid())
        write_effect(ctx)
        if ctx.attempt == 1:
            raise RuntimeError("once")
        return [first, os.getpid()]

    with in_thread(_process_worker(pgq, concurrency=1)):
        job_id = stepped.enqueue()
        assert wait_for_states(pgq, [job_id], timeout=30) == {job_id: JobState.SUCCEEDED}
    first, second = pgq.get_job(job_id).result
    # The step's value was saved by the first attempt and read back by the second.
    assert first != os.getpid() and second != os.getpid()
    assert committed_effects(engine) == [(job_id, 2)]


def test_snooze_and_a_durable_sleep_suspend_a_job_run_in_a_child(
    pgq: PgQueue, engine: Engine, tmp_path: Path
) -> None:
    snoozed = tmp_path / "snoozed"

    @pgq.task(name="pool.pauses", pass_context=True)
    def pauses(ctx: JobContext) -> int:
        if not snoozed.exists():
            snoozed.write_text("once")
            raise Snooze(0.1)
        ctx.sleep(0.2)
        return os.getpid()

    job_id = pauses.enqueue()
    with in_thread(_process_worker(pgq, concurrency=1)):
        assert wait_for_states(pgq, [job_id], timeout=30) == {job_id: JobState.SUCCEEDED}
    job = pgq.get_job(job_id)
    assert job.result != os.getpid()
    assert job.snoozes == 1 and job.errors == []
    with engine.connect() as connection:
        steps = connection.execute(
            text("SELECT name FROM pgqueue_job_steps WHERE job_id = :id"), {"id": job_id}
        ).scalars()
        assert list(steps) == ["pgqueue:sleep:1"]


def test_a_run_in_a_child_is_traced_as_a_child_of_its_enqueue(
    database_url: URL, settings: Settings, tmp_path: Path
) -> None:
    pgq = PgQueue(
        database_url.render_as_string(hide_password=False), settings=settings.replace(tracing=True)
    )
    tracer = trace.get_tracer("tests.process_pool")

    @pgq.task(name="pool.traced")
    def traced() -> None:
        with tracer.start_as_current_span("inside the handler"):
            pass

    try:
        with child_spans(tmp_path / "spans.jsonl") as path:
            with tracer.start_as_current_span("request") as request:
                job_id = traced.enqueue()
            with in_thread(_process_worker(pgq, concurrency=1)):
                assert wait_for_states(pgq, [job_id], timeout=30) == {job_id: JobState.SUCCEEDED}
            spans = {span["name"]: span for span in read_child_spans(path)}
    finally:
        pgq.dispose()
    run, inside = spans["pgqueue run pool.traced"], spans["inside the handler"]
    trace_id = f"0x{request.get_span_context().trace_id:032x}"
    assert run["context"]["trace_id"] == inside["context"]["trace_id"] == trace_id
    assert inside["parent_id"] == run["context"]["span_id"]
    assert run["attributes"]["messaging.message.id"] == str(job_id)


def test_an_atomic_transaction_lives_in_its_child(
    pgq: PgQueue, engine: Engine, side_table: None, tmp_path: Path
) -> None:
    """An atomic job's transaction is its child's: its writes commit with its outcome; at its
    timeout it is ended and the child stopped, its writes rolled back and nothing after the
    deadline done; a child that dies takes only its transaction with it."""
    after_deadline = tmp_path / "after-deadline"

    @pgq.task(name="pool.atomic_ok", atomic=True, pass_context=True)
    def atomic_ok(ctx: JobContext) -> int:
        write_effect(ctx)
        return os.getpid()

    @pgq.task(
        name="pool.atomic_hangs", atomic=True, pass_context=True, timeout=TIMEOUT, max_attempts=1
    )
    def atomic_hangs(ctx: JobContext) -> None:
        write_effect(ctx)
        time.sleep(RUNS_ON_FOR)
        after_deadline.write_text("ran on")

    @pgq.task(name="pool.atomic_dies", atomic=True, pass_context=True, max_attempts=1)
    def atomic_dies(ctx: JobContext) -> None:
        write_effect(ctx)
        ctx.session.flush()
        os._exit(4)

    ok, hangs, dies = atomic_ok.enqueue(), atomic_hangs.enqueue(), atomic_dies.enqueue()
    began = time.monotonic()
    with in_thread(_process_worker(pgq, concurrency=3)):
        states = wait_for_states(pgq, [ok, hangs, dies], timeout=30)
        time.sleep(max(began + RUNS_ON_FOR + 0.5 - time.monotonic(), 0))
    assert states == {ok: JobState.SUCCEEDED, hangs: JobState.FAILED, dies: JobState.FAILED}
    assert pgq.get_job(ok).result != os.getpid()
    hung = pgq.get_job(hangs)
    assert "JobTimeout" in (hung.last_error or "")
    assert hung.started_at is not None and hung.finished_at is not None
    assert (hung.finished_at - hung.started_at).total_seconds() < TIMEOUT + LATE_BY_AT_MOST
    assert not after_deadline.exists()
    assert "exited with code 4" in (pgq.get_job(dies).last_error or "")
    assert committed_effects(engine) == [(ok, 1)]


def test_a_chain_and_a_signal_wait_run_in_children(pgq: PgQueue) -> None:
    @pgq.task(name="pool.add")
    def add(a: int, b: int) -> int:
        return a + b

    @pgq.task(name="pool.approval", pass_context=True)
    def approval(ctx: JobContext) -> Any:
        return [ctx.wait_for_signal("approved", timeout=60), os.getpid()]

    wf = chain(add.s(2, 2), add.s(4), add.s(10)).enqueue()
    waiting = approval.enqueue()
    with in_thread(_process_worker(pgq, concurrency=2)):
        status = pgq.wait_for_workflow(wf.id, timeout=30)
        wait_until(
            lambda: (
                pgq.get_job(waiting).state is JobState.QUEUED
                and pgq.get_job(waiting).started_at is not None
            ),
            30,
            "the handler's wait",
        )
        assert pgq.signal(waiting, "approved", {"by": "ana"}) is True
        done = pgq.wait_for(waiting, timeout=30)
    assert (status.state, status.result) == ("succeeded", 18)
    decision, pid = done.result
    assert decision == {"by": "ana"} and pid != os.getpid()


def test_a_child_killed_while_idle_is_replaced_before_the_next_job(pgq: PgQueue) -> None:
    @pgq.task(name="pool.pid_once", max_attempts=1)
    def pid_once() -> int:
        return os.getpid()

    def one_by_one(count: int) -> list[int]:
        ids = []
        for _ in range(count):
            ids.append(pid_once.enqueue())
            state = wait_for_states(pgq, ids[-1:], timeout=30)[ids[-1]]
            assert state is JobState.SUCCEEDED, pgq.get_job(ids[-1]).last_error
        return [pgq.get_job(job_id).result for job_id in ids]

    # One job at a time goes to each pool thread in turn: every thread gets its child.
    with in_thread(_process_worker(pgq, concurrency=1)):
        children = set(one_by_one(6))
        for child in children:
            os.kill(child, signal.SIGKILL)  # as the OOM killer would, between two jobs
        wait_until(lambda: all(_ended(child) for child in children), 10, "their end")
        later = one_by_one(6)
    assert not children & set(later)


def _ended(pid: int) -> bool:
    """Whether process ``pid`` ended and was reaped (by the fork server): a dying process
    loses its command line before it closes its files, so only its reaping says it is gone."""
    return not Path(f"/proc/{pid}").exists()
