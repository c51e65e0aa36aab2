"""The worker's pure logic, without a database: slot accounting, dispatch, the pauses between
its own tries and its writes apart, the decision of what follows a failed attempt, and the transition each outcome
kind names."""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
import time
import uuid
from typing import Any

import psycopg
import pytest
from support.polling import wait_until

from pgqueue import Retry, backoff
from pgqueue.config import Settings
from pgqueue.jobs import ClaimedJob, Outcome
from pgqueue.states import TRANSITIONS, JobState, OutcomeKind
from pgqueue.tasks import Task, TaskRegistry
from pgqueue.worker import completer as completer_module
from pgqueue.worker.completer import Completer
from pgqueue.worker.dispatch import Dispatcher, WorkQueue
from pgqueue.worker.execution import Execution
from pgqueue.worker.executor import Executor
from pgqueue.worker.patience import Pauses, write_apart
from pgqueue.worker.slots import MIN_HUNG_THREADS, Slots
from pgqueue.worker.stats import OutcomeReport, WorkerStats


def _job(job_id: int = 1, *, attempt: int = 1, max_attempts: int = 3) -> ClaimedJob:
    token = str(uuid.uuid4())
    return ClaimedJob(job_id, "t", "default", [], {}, attempt, max_attempts, 0, token, False, False)


def _execution(job_id: int, *, timeout: float | None = None, started: float = 0.0) -> Execution:
    return Execution(_job(job_id), 30.0, timeout, started)


# --- slots -----------------------------------------------------------------------------------


def test_a_slot_is_free_again_when_the_handler_returns_before_its_outcome_is_written() -> None:
    slots = Slots(concurrency=2)
    assert slots.free() == 2
    first, second = _execution(1), _execution(2)
    slots.add([first, second])
    assert slots.free() == 0
    assert slots.handler_returned(first) == (True, True, None)
    assert slots.free() == 1
    assert slots.running_ids() == [1, 2]  # still held (heartbeats) until written
    slots.start_writing([first])
    slots.written([first])
    assert slots.running_ids() == [2]
    assert slots.free() == 1


def test_attempts_held_unwritten_are_bounded_at_twice_the_concurrency() -> None:
    slots = Slots(concurrency=2)
    executions = [_execution(i) for i in range(1, 5)]
    slots.add(executions[:2])
    for execution in executions[:2]:
        slots.handler_returned(execution)
    assert slots.free() == 2  # both handlers returned, their outcomes not written yet
    slots.add(executions[2:])
    results = [slots.handler_returned(execution) for execution in executions[2:]]
    assert results == [(True, False, None)] * 2  # at the bound: no room to hold more
    assert slots.free() == 0  # no handler runs, but four outcomes wait for their write
    slots.written(executions[:1])
    assert slots.free() == 1


def test_atomic_runners_take_slots_until_they_end() -> None:
    slots = Slots(concurrency=3)
    slots.atomic_started()
    slots.add([_execution(1)])
    assert slots.free() == 1
    assert slots.busy()
    slots.atomic_finished()
    assert slots.free() == 2


def test_written_forgets_only_the_attempt_it_wrote() -> None:
    slots = Slots(concurrency=2)
    old, again = _execution(7), _execution(7)  # a retry with no delay, claimed again
    slots.add([old])
    slots.handler_returned(old)
    slots.add([again])
    slots.written([old])
    assert slots.running_ids() == [7]
    assert slots.lookup([7]) == {7: again}


def _timed_out(execution: Execution) -> Outcome:
    return Outcome.retry(execution.job, "JobTimeout", 0.0)


def test_a_timeout_decides_the_attempt_once_and_hands_its_slot_on_within_the_bound() -> None:
    slots = Slots(concurrency=1, prefetch=1)
    hanging = [_execution(i, timeout=1.0) for i in range(MIN_HUNG_THREADS + 2)]
    overdue: list[Execution] = []
    for execution in hanging[:-1]:
        assert slots.add([execution]) == [execution]  # its slot is free: it starts at once
        found, hung = slots.take_overdue(now=10.0, timed_out=_timed_out)
        # A sync handler runs on: its outcome waits for its thread, nothing is written now.
        assert [outcome for _, outcome in found] == [None]
        overdue += [execution for execution, _ in found]
    assert overdue == hanging[:-1]
    assert hung == MIN_HUNG_THREADS
    assert [e.replaced for e in hanging] == [True] * MIN_HUNG_THREADS + [False] * 2
    assert all(e.decided and e.timed_out for e in hanging[:-1])
    # No slot is free (the last timed-out handler keeps its own): a claimed attempt waits, and
    # its timeout does not run before it starts.
    assert slots.add([hanging[-1]]) == []
    assert slots.take_overdue(now=20.0, timed_out=_timed_out) == ([], MIN_HUNG_THREADS)
    # The handler that returned later hands over the timeout's outcome, not its own; its
    # thread retires.
    kept = hanging[0].timeout_outcome
    assert kept is not None and kept.error == "JobTimeout"
    assert slots.handler_returned(hanging[0])[0] is kept
    assert slots.take_overdue(now=30.0, timed_out=_timed_out)[1] == MIN_HUNG_THREADS - 1
    # The one that kept its slot passes it to the waiting attempt, timed from now.
    write, _, following = slots.handler_returned(hanging[-2])
    assert isinstance(write, Outcome) and following is hanging[-1]
    assert hanging[-1].started > 30.0 and not hanging[-1].decided
    # A stopping worker writes the outcomes of the threads still running, once.
    assert [e for e, _ in slots.take_timeout_outcomes()] == hanging[1:-2]
    assert slots.take_timeout_outcomes() == []
    assert slots.handler_returned(hanging[1])[0] is False


def test_a_handler_back_past_its_deadline_never_commits_though_nobody_decided_in_time() -> None:
    slots = Slots(concurrency=2)
    slots.timed_out = _timed_out
    late, early = _execution(1, timeout=1.0), _execution(2, timeout=60.0)
    slots.add([late, early])
    late.started = early.started = time.monotonic() - 2.0  # the deadlines' thread stalled
    assert slots.settle_by_handler(late) is False
    assert late.decided and late.timed_out
    kept = late.timeout_outcome
    assert kept is not None and kept.error == "JobTimeout"
    assert slots.handler_returned(late)[0] is kept  # written instead of the handler's own
    assert slots.settle_by_handler(early) is True
    assert slots.take_overdue(time.monotonic(), _timed_out) == ([], 0)


def test_an_attempt_whose_job_is_claimed_again_is_still_timed_out() -> None:
    # Its lease expired (the worker was frozen), the job was rescued and this worker claimed
    # it again while the first attempt's handler still ran: both are timed out.
    slots = Slots(concurrency=2)
    first, again = _execution(7, timeout=1.0), _execution(7, timeout=1.0, started=5.0)
    slots.add([first])
    slots.add([again])
    assert slots.lookup([7]) == {7: again}  # heartbeats go to the new attempt
    assert slots.next_deadline() == 1.0
    overdue, _ = slots.take_overdue(now=2.0, timed_out=_timed_out)
    assert [e for e, _ in overdue] == [first] and first.timed_out
    # Its outcome (refused later: its lease is gone) is written once its thread returns, and
    # the write forgets it.
    write, _, _ = slots.handler_returned(first)
    assert isinstance(write, Outcome)
    slots.written([first])
    assert slots.take_overdue(now=10.0, timed_out=_timed_out)[0] == [(again, None)]


def test_an_async_handler_past_its_timeout_keeps_its_slot_until_its_future_ends() -> None:
    slots = Slots(concurrency=1)
    execution = _execution(1, timeout=1.0)
    execution.async_future = concurrent.futures.Future()
    slots.add([execution])
    overdue, hung = slots.take_overdue(now=5.0, timed_out=_timed_out)
    # Its future is cancelled: the outcome is written at once.
    assert [(e, o is not None) for e, o in overdue] == [(execution, True)]
    assert hung == 0 and not execution.replaced
    assert slots.free() == 0
    assert slots.handler_returned(execution)[0] is False


def test_heartbeats_skip_attempts_being_written_or_known_lost() -> None:
    slots = Slots(concurrency=3)
    writing, lost, held = _execution(1), _execution(2), _execution(3)
    slots.add([writing, lost, held])
    slots.start_writing([writing])
    lost.lease_lost = True
    assert [lease[0] for lease in slots.leases()] == [3]


def test_a_heartbeat_is_in_flight_from_taking_its_leases_until_its_statement_ended() -> None:
    slots = Slots(concurrency=2)
    slots.add([_execution(1), _execution(2)])
    assert not slots.heartbeat_in_flight()
    slots.leases()
    assert slots.heartbeat_in_flight()  # outcome writes lock their rows in its order meanwhile
    slots.leases()
    slots.beat_done()
    assert slots.heartbeat_in_flight()
    slots.beat_done()
    assert not slots.heartbeat_in_flight()


class _RecordingOutcomeStore:
    """An ``OutcomeStore`` that writes nothing and notes each call's ``lock_rows``."""

    def __init__(self) -> None:
        self.lock_rows: list[bool] = []
        self.batches: list[tuple[float, list[int]]] = []  # (monotonic time, job ids) per write

    def record_outcomes(
        self, outcomes: Any, *, lock_wait: float | None = None, lock_rows: bool = True
    ) -> set[int]:
        self.batches.append((time.monotonic(), [outcome.job_id for outcome in outcomes]))
        self.lock_rows.append(lock_rows)
        return set()


def _completer(slots: Slots, store: _RecordingOutcomeStore) -> Completer:
    report = OutcomeReport(WorkerStats(), log_successes=False, log_args=False, on_outcome=None)
    return Completer(
        store=store,
        slots=slots,
        report=report,
        unrecorded=lambda job, outcome, exc: outcome,
        wake=threading.Event(),
    )


def _finish(slots: Slots, completer: Completer, execution: Execution) -> None:
    slots.handler_returned(execution)
    completer.buffer.put((execution, Outcome.complete(execution.job)))


def _wait_for_writes(store: _RecordingOutcomeStore, count: int) -> None:
    wait_until(lambda: len(store.batches) >= count, 10, f"{count} batch writes", interval=0.001)


def test_outcomes_that_come_in_right_after_a_write_wait_and_go_in_one_batch(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(completer_module, "WRITE_SPACING", 0.3)
    slots = Slots(concurrency=3, prefetch=10)  # three held of at most 26
    store = _RecordingOutcomeStore()
    completer = _completer(slots, store)
    first, second, third = _execution(1), _execution(2), _execution(3)
    slots.add([first, second, third])
    thread = threading.Thread(target=completer.run)
    thread.start()
    try:
        _finish(slots, completer, first)  # after a quiet spell: written at once
        _wait_for_writes(store, 1)
        _finish(slots, completer, second)
        time.sleep(0.05)
        _finish(slots, completer, third)
        _wait_for_writes(store, 2)
    finally:
        completer.stop()
        thread.join(10)
    assert [ids for _, ids in store.batches] == [[1], [2, 3]]
    assert store.batches[1][0] - store.batches[0][0] >= 0.3


def test_outcomes_are_written_at_once_while_half_the_room_is_held(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """One slot and no prefetch: a worker holds two attempts at most, so its next claim waits
    for each outcome write, which must not wait for the spacing."""
    monkeypatch.setattr(completer_module, "WRITE_SPACING", 30.0)
    slots = Slots(concurrency=1)
    store = _RecordingOutcomeStore()
    completer = _completer(slots, store)
    thread = threading.Thread(target=completer.run)
    thread.start()
    try:
        for job_id in (1, 2):
            execution = _execution(job_id)
            slots.add([execution])
            _finish(slots, completer, execution)
            _wait_for_writes(store, job_id)
    finally:
        completer.stop()
        thread.join(10)
    assert [ids for _, ids in store.batches] == [[1], [2]]


def test_the_completer_locks_rows_first_only_while_a_heartbeat_is_in_flight() -> None:
    slots = Slots(concurrency=2)
    store = _RecordingOutcomeStore()
    completer = _completer(slots, store)
    first, second = _execution(1), _execution(2)
    slots.add([first, second])
    thread = threading.Thread(target=completer.run)
    thread.start()
    slots.handler_returned(first)
    completer.buffer.put((first, Outcome.complete(first.job)))
    wait_until(lambda: store.lock_rows, 10, "the first batch write", interval=0.01)
    slots.leases()  # a heartbeat takes its leases: the second attempt's among them
    slots.handler_returned(second)
    completer.buffer.put((second, Outcome.complete(second.job)))
    completer.stop()
    thread.join(10)
    slots.beat_done()
    assert store.lock_rows == [False, True]
    assert slots.running_ids() == []


def test_shutdown_gives_up_only_undecided_attempts() -> None:
    slots = Slots(concurrency=2)
    returned, running = _execution(1), _execution(2)
    slots.add([returned, running])
    slots.handler_returned(returned)
    assert slots.give_up_unfinished() == [running]
    assert slots.handler_returned(running)[0] is False


# --- dispatch --------------------------------------------------------------------------------


def test_work_is_taken_in_the_order_it_was_put() -> None:
    work = WorkQueue()
    work.put_many([1, 2, 3])
    work.put(4)
    assert [work.get(finished=i > 0) for i in range(4)] == [1, 2, 3, 4]


def _run_pool(concurrency: int, items: list[Any], run_leased: Any) -> Dispatcher:
    dispatcher = Dispatcher(concurrency, WorkQueue(), run_leased)
    dispatcher.start()
    dispatcher.work.put_many(items)
    return dispatcher


def test_pool_runs_executions_with_run_leased_and_calls_other_items() -> None:
    ran: list[object] = []
    done = threading.Event()
    executions = [_execution(i) for i in range(3)]

    def run_leased(execution: Execution) -> bool:
        ran.append(execution.job.id)
        return False

    def callable_item() -> bool:
        ran.append("called")
        done.set()
        return False

    dispatcher = _run_pool(1, [*executions, callable_item], run_leased)
    try:
        assert done.wait(5)
        assert sorted(ran, key=str) == [0, 1, 2, "called"]
    finally:
        dispatcher.stop()


def test_slow_items_spread_over_idle_threads() -> None:
    """A thread stuck in a slow handler makes no progress: the dispatcher wakes one thread per
    waiting item, so every item starts without waiting for the first to end."""
    release = threading.Event()
    started: list[int] = []
    all_started = threading.Event()

    def run_leased(execution: Execution) -> bool:
        started.append(execution.job.id)
        if len(started) == 4:
            all_started.set()
        release.wait(10)
        return False

    dispatcher = _run_pool(4, [_execution(i) for i in range(4)], run_leased)
    try:
        assert all_started.wait(2), started
    finally:
        release.set()
        dispatcher.stop()


def test_a_retiring_thread_leaves_the_others_running() -> None:
    ran = threading.Semaphore(0)

    def run_leased(execution: Execution) -> bool:
        ran.release()
        return execution.job.id == 0  # the first thread's slot went to a replacement

    dispatcher = _run_pool(0, [_execution(0)], run_leased)
    try:
        assert ran.acquire(timeout=5)
        dispatcher.work.put_many([_execution(1), _execution(2)])
        assert ran.acquire(timeout=5) and ran.acquire(timeout=5)
    finally:
        dispatcher.stop()


# --- the pauses between the worker's own tries -----------------------------------------------


def test_pauses_double_up_to_the_longest_and_start_again_after_a_reset() -> None:
    pauses = Pauses(first=0.1, longest=5.0)
    assert [pauses.next() for _ in range(9)] == [0.1, 0.2, 0.4, 0.8, 1.6, 3.2, 5.0, 5.0, 5.0]
    pauses.reset()
    assert [pauses.next() for _ in range(2)] == [0.1, 0.2]


def test_writes_apart_keep_back_the_parts_a_lock_timeout_stopped_and_raise_other_errors() -> None:
    written: list[str] = []

    def write(part: str) -> None:
        if part.startswith("held"):
            raise psycopg.errors.LockNotAvailable(part)
        if part == "refused":
            raise psycopg.errors.CheckViolation(part)
        written.append(part)

    held, error = write_apart(["a", "held 1", "b", "held 2"], write)
    assert (written, held) == (["a", "b"], ["held 1", "held 2"])
    assert str(error) == "held 2"
    assert write_apart(["c"], write) == ([], None)
    with pytest.raises(psycopg.errors.CheckViolation):
        write_apart(["refused"], write)


# --- what follows a failed attempt -----------------------------------------------------------


def test_a_failure_with_attempts_left_is_retried_after_the_schedule() -> None:
    decision = backoff.after_failure(2, 5, schedule=lambda attempt: attempt * 10.0)
    assert decision == backoff.AfterFailure(OutcomeKind.RETRY, 20.0)


def test_the_last_attempt_fails_for_good_whatever_was_asked() -> None:
    for delay in (None, 3.0):
        decision = backoff.after_failure(3, 3, delay=delay, schedule=lambda attempt: 1.0)
        assert decision.kind is OutcomeKind.FAIL
    assert backoff.after_failure(4, 3).kind is OutcomeKind.FAIL  # attempts past the maximum


def test_an_explicit_delay_overrides_the_schedule() -> None:
    decision = backoff.after_failure(1, 3, delay=7.5, schedule=lambda attempt: 100.0)
    assert decision == backoff.AfterFailure(OutcomeKind.RETRY, 7.5)


def test_without_a_schedule_the_retry_is_immediate() -> None:
    assert backoff.after_failure(1, 2) == backoff.AfterFailure(OutcomeKind.RETRY, 0.0)


def test_a_schedule_that_raises_retries_after_the_default_backoff_and_says_why() -> None:
    def broken(attempt: int) -> float:
        raise ZeroDivisionError("policy bug")

    decision = backoff.after_failure(1, 3, schedule=broken)
    assert decision.kind is OutcomeKind.RETRY
    assert 1.0 <= decision.delay <= 2.0  # the default exponential backoff, jittered
    assert "ZeroDivisionError: policy bug" in decision.note


def _executor(*tasks: Task[Any, Any]) -> Executor:
    registry = TaskRegistry()
    for task in tasks:
        registry.add(task)
    return Executor(registry, Settings(), lambda: None, lambda: None)  # type: ignore[arg-type,return-value]


def _task(fn: Any, name: str = "t", **options: Any) -> Task[Any, Any]:
    return Task(fn, sink=None, name=name, **options)  # type: ignore[arg-type]


@pytest.mark.parametrize(("attempt", "kind"), [(1, "retry"), (3, "fail")])
def test_a_timeout_is_a_failed_attempt_decided_like_any_other(attempt: int, kind: str) -> None:
    executor = _executor(_task(lambda: None, retry=backoff.constant(4)))
    execution = Execution(_job(attempt=attempt), 30.0, 0.5, time.monotonic())
    outcome = executor.timed_out(execution)
    assert outcome.kind == kind
    assert outcome.delay == (4.0 if kind == "retry" else 0.0)
    assert outcome.error.startswith("JobTimeout: still running after the task's timeout of 0.5s")


def test_a_raised_retry_uses_its_delay_and_an_exception_the_tasks_backoff() -> None:
    def asks(delay: float | None) -> None:
        raise Retry(delay=delay)

    executor = _executor(_task(asks, retry=backoff.constant(9)))
    job = _job()
    job.args = [2.5]
    assert _run(executor, job).delay == 2.5
    job.args = [None]
    outcome = _run(executor, job)
    assert (outcome.kind, outcome.delay) == ("retry", 9.0)


def _run(executor: Executor, job: ClaimedJob) -> Outcome:
    return executor.run_leased(Execution(job, 30.0, None, time.monotonic()))


@pytest.mark.parametrize(
    ("reason", "stored"),
    [("gateway busy", "retry requested: gateway busy"), (None, "retry requested")],
)
def test_a_raised_retry_stores_its_reason_not_a_traceback(reason: str | None, stored: str) -> None:
    def asks() -> None:
        raise Retry(delay=1, reason=reason)

    outcome = _run(_executor(_task(asks)), _job())
    assert (outcome.kind, outcome.error) == ("retry", stored)
    last = _run(_executor(_task(asks)), _job(attempt=3))
    assert (last.kind, last.error) == ("fail", stored)


# --- outcome kinds and transitions -----------------------------------------------------------


def test_each_outcome_kind_names_a_lease_guarded_transition_from_running() -> None:
    targets = {kind: kind.transition.target for kind in OutcomeKind}
    assert targets == {
        OutcomeKind.COMPLETE: JobState.SUCCEEDED,
        OutcomeKind.RETRY: JobState.RETRYING,
        OutcomeKind.FAIL: JobState.FAILED,
        OutcomeKind.CANCELLED: JobState.CANCELLED,
        OutcomeKind.RELEASE: JobState.QUEUED,
        OutcomeKind.SNOOZE: JobState.QUEUED,
        OutcomeKind.SUSPEND: JobState.QUEUED,
    }
    for kind in OutcomeKind:
        assert kind.transition.name == kind == kind.value
        assert kind.transition.sources == {JobState.RUNNING}
    # The transitions only a lease holder makes are exactly those outcomes name.
    leased = {t for t in TRANSITIONS.values() if t.needs_lease}
    assert leased == {kind.transition for kind in OutcomeKind}


def test_typed_constructors_build_the_outcome_of_their_kind() -> None:
    job = _job(5)
    built = [
        (Outcome.complete(job, '{"a": 1}'), (OutcomeKind.COMPLETE, '{"a": 1}', "", 0.0)),
        (Outcome.retry(job, "boom", 3.0), (OutcomeKind.RETRY, "null", "boom", 3.0)),
        (Outcome.fail(job, "bad"), (OutcomeKind.FAIL, "null", "bad", 0.0)),
        (Outcome.cancelled(job, "stop"), (OutcomeKind.CANCELLED, "null", "stop", 0.0)),
        (Outcome.release(job), (OutcomeKind.RELEASE, "null", "", 0.0)),
    ]
    for outcome, (kind, result_json, error, delay) in built:
        assert (outcome.job_id, outcome.lease_token) == (5, job.lease_token)
        assert (outcome.kind, outcome.result_json, outcome.error, outcome.delay) == (
            kind,
            result_json,
            error,
            delay,
        )
        assert outcome.kind is kind


def test_an_async_rate_limited_handler_reaching_the_loop_late_is_not_started() -> None:
    ran: list[str] = []
    registry = TaskRegistry()

    async def handler() -> None:
        ran.append("ran")

    registry.add(Task(handler, sink=None, name="t"))  # type: ignore[arg-type]
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    try:
        executor = Executor(registry, Settings(), lambda: None, lambda: loop)  # type: ignore[arg-type,return-value]
        now = time.monotonic()
        # The sync check passes; the loop reaches the coroutine after its start-by time.
        late = Execution(_job(1), 30.0, None, now, start_by=now + 0.05)
        loop.call_soon_threadsafe(time.sleep, 0.1)  # the loop is busy past the start-by time
        assert executor.run_leased(late).kind == OutcomeKind.RELEASE
        on_time = Execution(_job(2), 30.0, None, now, start_by=time.monotonic() + 60)
        assert executor.run_leased(on_time).kind == OutcomeKind.COMPLETE
        assert ran == ["ran"]
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join()
        loop.close()
