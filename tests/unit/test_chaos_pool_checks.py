"""The fault harness's checks of timeouts and of the process pool (invariants 22 to 25), on
made-up snapshots: a retry that waited for its timed-out run holds and one beside it does not
(unless a lease expired); a hung child stopped at its deadline holds, one beating on does not
(unless its worker was frozen, and only until it resumed; a lease that expired excuses nothing,
and a child ends with its killed worker); a session row of a hung attempt is found (excused
for a thread whose lease expired); a crash recorded with its exit holds, one recorded otherwise does not; a run begun in a
child over the memory cap, a child running too many jobs and an idle child seen over the cap
are found."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from tests.chaos.app import HANG_TIMEOUT, MEMORY_CAP_MB, TASKS_PER_CHILD
from tests.chaos.invariants import Facts
from tests.chaos.pool_checks import (
    PoolSample,
    crashes_contained,
    memory_under_cap,
    runs_never_overlap,
    timeout_excuses,
    timeouts_stop_handlers,
)
from tests.chaos.snapshot import Run, Snapshot
from tests.chaos.workload import Event

T0 = 1_000_000.0
WORKER = 100  # the process-pool worker (holder of the leases)
TIMEOUT_ERROR = (
    f"JobTimeout: still running after the task's timeout of {HANG_TIMEOUT}s; its process was "
    "stopped (killed by signal SIGTERM (15))"
)


def _job(kind: str, state: str, errors: dict[int, str], **kw: Any) -> Any:
    return SimpleNamespace(
        id=1,
        task_name={"hog": "chaos.hog", "crash": "chaos.crash"}.get(kind, "chaos.hang"),
        kind=kind,
        state=state,
        attempts=kw.pop("attempts", len(errors) + (state == "succeeded")),
        max_attempts=3,
        errors=[{"attempt": a, "error": e} for a, e in errors.items()],
        hang_until=kw.pop("hang_until", None),
        crash_until=kw.pop("crash_until", None),
        **kw,
    )


def _run(attempt: int, pid: int, started: float, **kw: Any) -> Run:
    return Run(
        id=attempt * 10 + pid % 10,
        job_id=1,
        attempt=attempt,
        kind=kw.pop("kind", "hang"),
        tag="run",
        pid=pid,
        started=T0 + started,
        ended=None if kw.get("ended") is None else T0 + kw.pop("ended"),
        outcome=kw.pop("outcome", None),
        holder=kw.pop("holder", WORKER),
        proc=kw.pop("proc", f"p{pid}"),
        rss_start=kw.pop("rss_start", 60.0),
        rss_end=kw.pop("rss_end", None),
        alive_at=None if kw.get("alive_at") is None else T0 + kw.pop("alive_at"),
    )


def _snapshot(job: Any, runs: list[Run], sessions: list[Run] | None = None) -> Snapshot:
    snapshot = Snapshot(T0 + 120, {job.id: job})
    snapshot.runs[job.id].extend(runs)
    snapshot.sessions[job.id].extend(sessions or [])
    return snapshot


def _messages(found: list[Any]) -> list[str]:
    return [v.message for v in found]


# -- 22: runs never overlap ------------------------------------------------------------------


def test_a_retry_after_its_hung_thread_returned_holds() -> None:
    job = _job("hang_shared", "succeeded", {1: "JobTimeout: ..."}, hang_until=1)
    thread = _run(1, 7, 0, holder=7, ended=4.5, alive_at=4.3, outcome="hung")
    retry = _run(2, 7, 4.8, holder=7, ended=4.9, outcome="ok")
    assert runs_never_overlap(_snapshot(job, [thread, retry]), Facts()) == []


def test_a_retry_beside_its_hung_thread_is_found() -> None:
    job = _job("hang_shared", "succeeded", {1: "JobTimeout: ..."}, hang_until=1)
    thread = _run(1, 7, 0, holder=7, ended=4.5, alive_at=4.3, outcome="hung")
    retry = _run(2, 8, 2.3, holder=8, ended=2.4, outcome="ok")
    found = runs_never_overlap(_snapshot(job, [thread, retry]), Facts())
    assert len(found) == 1
    assert "no lease of attempt 1 expired" in found[0].message


def test_runs_beside_an_expired_lease_hold_even_out_of_order() -> None:
    # Frozen between its claim and its first write, the first attempt's run is recorded after
    # the second's began; its lease expired meanwhile, as the rescue recorded.
    job = _job("hang", "succeeded", {1: "lease expired (worker stopped heartbeating)"})
    late_first = _run(1, 5, 10.1, alive_at=30.0, outcome=None)
    second = _run(2, 6, 10.0, ended=10.2, outcome="ok")
    assert runs_never_overlap(_snapshot(job, [late_first, second]), Facts()) == []


# -- 23: timeouts stop handlers ----------------------------------------------------------------


def test_a_child_stopped_at_its_deadline_holds() -> None:
    job = _job("hang", "succeeded", {1: TIMEOUT_ERROR}, hang_until=1)
    hung = _run(1, 5, 0, alive_at=HANG_TIMEOUT - 0.1)
    done = _run(2, 6, 2.5, ended=2.6, outcome="ok")
    assert timeouts_stop_handlers(_snapshot(job, [hung, done]), Facts(final=True)) == []


def test_a_child_beating_past_its_deadline_is_found() -> None:
    job = _job("hang", "failed", {1: TIMEOUT_ERROR}, hang_until=3, attempts=1)
    hung = _run(1, 5, 0, alive_at=HANG_TIMEOUT + 5)
    found = timeouts_stop_handlers(_snapshot(job, [hung]), Facts())
    assert len(found) == 1
    assert "ran on in process-pool child 5" in found[0].message


def test_a_frozen_worker_delays_the_stop_until_it_resumes() -> None:
    job = _job("hang", "failed", {1: TIMEOUT_ERROR}, hang_until=3, attempts=1)
    frozen = Event(T0 + 1, "sigstop", f"pid {WORKER} for 5 s", WORKER, T0 + 6)
    facts = Facts(events=[frozen])
    stopped_on_resume = _run(1, 5, 0, alive_at=6.5)
    assert timeouts_stop_handlers(_snapshot(job, [stopped_on_resume]), facts) == []
    beating_on = _run(1, 5, 0, alive_at=12.0)
    found = timeouts_stop_handlers(_snapshot(job, [beating_on]), facts)
    assert len(found) == 1 and "held back by sigstop" in found[0].message


def test_a_freeze_ended_before_the_run_began_excuses_nothing() -> None:
    # The worker resumed, then started the attempt its lease had lost, and never stopped it.
    job = _job("hang", "failed", {1: TIMEOUT_ERROR}, hang_until=3, attempts=1)
    frozen = Event(T0 - 6, "sigstop", f"pid {WORKER} for 5 s", WORKER, T0 - 1)
    hung = _run(1, 5, 0, alive_at=20.0)
    assert len(timeouts_stop_handlers(_snapshot(job, [hung]), Facts(events=[frozen]))) == 1


def test_a_child_beating_on_after_its_lease_expired_is_found() -> None:
    # Its worker was cut off past its lease and the rescuer took the job back: the worker still
    # stops the child at the deadline (its deadlines thread sends no statement).
    job = _job("hang", "failed", {1: "lease expired (worker lost)"}, hang_until=3, attempts=1)
    hung = _run(1, 5, 0, alive_at=20.0)
    snapshot = _snapshot(job, [hung])
    found = timeouts_stop_handlers(snapshot, Facts())
    assert len(found) == 1 and "ran on in process-pool child 5" in found[0].message
    assert timeout_excuses(snapshot, Facts()) == []


def test_a_child_ends_with_its_killed_worker() -> None:
    job = _job("hang", "failed", {1: "lease expired (worker lost)"}, hang_until=3, attempts=1)
    facts = Facts(killed={WORKER: T0 + 1.0})
    gone_with_it = _run(1, 5, 0, alive_at=1.2)
    assert timeouts_stop_handlers(_snapshot(job, [gone_with_it]), facts) == []
    beating_on = _run(1, 5, 0, alive_at=20.0)
    found = timeouts_stop_handlers(_snapshot(job, [beating_on]), facts)
    assert len(found) == 1 and "19.0 s after its worker 100 should have stopped it" in (
        found[0].message
    )


def test_a_threads_commit_after_its_lease_expired_is_excused_and_reported() -> None:
    # Its worker was cut off past its lease: the rescuer took the job back, and the thread,
    # which nothing can stop, returned and committed its session.
    job = _job("hang_shared", "succeeded", {1: "lease expired (worker lost)"}, hang_until=1)
    thread = _run(1, 7, 0, holder=7, ended=4.5, outcome="hung")
    retry = _run(2, 8, 5.0, holder=8, ended=5.1, outcome="ok")
    row = Run(90, 1, 1, "hang_shared", "session", 7, T0 + 0.1, None, None)
    snapshot = _snapshot(job, [thread, retry], [row])
    assert timeouts_stop_handlers(snapshot, Facts()) == []
    (headline, line) = timeout_excuses(snapshot, Facts())
    assert headline.startswith("timeouts not held, excused (1)")
    assert line.endswith("its lease expired")


def test_an_outage_excuses_no_late_stop() -> None:
    # The worker decides timeouts on a thread that sends no statement: a server restart during
    # the attempt holds nothing back.
    job = _job("hang", "failed", {1: TIMEOUT_ERROR}, hang_until=3, attempts=1)
    outage = Event(T0 + 1, "server_restart", "down 1.0 s", None, T0 + 2)
    beating_on = _run(1, 5, 0, alive_at=9.0)
    found = timeouts_stop_handlers(_snapshot(job, [beating_on]), Facts(events=[outage]))
    assert len(found) == 1


def test_a_hung_attempts_committed_session_row_is_found() -> None:
    job = _job("hang_shared", "succeeded", {1: "JobTimeout: ..."}, hang_until=1)
    thread = _run(1, 7, 0, holder=7, ended=4.5, outcome="hung")
    done = _run(2, 7, 5.0, holder=7, ended=5.1, outcome="ok")
    rows = [
        Run(90, 1, 1, "hang_shared", "session", 7, T0 + 0.1, None, None),
        Run(91, 1, 2, "hang_shared", "session", 7, T0 + 5.05, None, None),
    ]
    found = timeouts_stop_handlers(_snapshot(job, [thread, done], rows), Facts())
    assert _messages(found) == [
        "attempt 1's write through ctx.session committed, though its run hung past its "
        "timeout (outcome 'hung')"
    ]


def test_a_hung_attempt_recorded_as_another_error_is_found() -> None:
    job = _job("hang", "retrying", {1: "RuntimeError: boom"}, hang_until=2, attempts=2)
    hung = _run(1, 5, 0, alive_at=1.9)
    found = timeouts_stop_handlers(_snapshot(job, [hung]), Facts())
    assert len(found) == 1 and "attempt 1 hung past its timeout (in a child)" in found[0].message


def test_a_success_at_an_attempt_that_hangs_is_found() -> None:
    job = _job("hang", "succeeded", {}, hang_until=1, attempts=1)
    found = timeouts_stop_handlers(_snapshot(job, [_run(1, 5, 0, alive_at=1.9)]), Facts())
    assert "succeeded at attempt 1, one that hangs (hang_until 1)" in _messages(found)


# -- 24: crashes contained -------------------------------------------------------------------


def test_a_crash_recorded_with_its_exit_holds() -> None:
    error = "ChildProcessDied: the process running the handler exited with code 3"
    job = _job("crash", "succeeded", {1: error}, crash_until=1)
    crashed = _run(1, 5, 0, ended=0.1, outcome="crash exit 3", kind="crash")
    done = _run(2, 6, 0.5, ended=0.6, outcome="ok", kind="crash")
    assert crashes_contained(_snapshot(job, [crashed, done]), Facts(final=True)) == []


def test_a_crash_recorded_with_another_end_is_found() -> None:
    error = "ChildProcessDied: the process running the handler killed by signal SIGKILL (9)"
    job = _job("crash", "running", {1: error}, crash_until=2, attempts=2)
    crashed = _run(1, 5, 0, ended=0.1, outcome="crash segv 11", kind="crash")
    found = crashes_contained(_snapshot(job, [crashed]), Facts())
    assert len(found) == 1 and "killed by signal SIGSEGV (11)" in found[0].message
    # Unless the faults' SIGKILL reached the child first.
    assert crashes_contained(_snapshot(job, [crashed]), Facts(killed={5: T0 + 0.12})) == []


def test_a_crash_whose_own_write_lost_its_connection_first_holds() -> None:
    # The faults ended the handler's connection before it reached its crash: the attempt
    # failed with that traceback, and the ledger's mark was written by its ``finally``.
    lost = (
        'Traceback (most recent call last):\n  File "sqlalchemy/engine/base.py", line 1, in '
        "_exec\nsqlalchemy.exc.OperationalError: (psycopg.errors.AdminShutdown) terminating "
        "connection due to administrator command"
    )
    job = _job("crash", "failed", {1: lost}, crash_until=1, attempts=1)
    crashed = _run(1, 5, 0, ended=1.1, outcome="crash exit 1", kind="crash")
    assert crashes_contained(_snapshot(job, [crashed]), Facts()) == []
    # Any other traceback in its place is still found.
    other = "Traceback (most recent call last):\nValueError: not a lost connection"
    job = _job("crash", "failed", {1: other}, crash_until=1, attempts=1)
    assert len(crashes_contained(_snapshot(job, [crashed]), Facts())) == 1


def test_a_process_only_kind_in_its_workers_own_process_is_found() -> None:
    job = _job("hog", "failed", {1: "RuntimeError: chaos: a leak outside ..."}, attempts=1)
    found = crashes_contained(_snapshot(job, [_run(1, 7, 0, holder=7, kind="hog")]), Facts())
    assert len(found) == 1 and "not in a process-pool child" in found[0].message


def test_the_pool_workers_own_exit_is_found() -> None:
    job = _job("crash", "succeeded", {}, crash_until=0)
    exit_ = Event(T0 + 3, "unexpected_exit", "w1-process")
    facts = Facts(events=[exit_], pool_workers={"w1-process"})
    found = crashes_contained(_snapshot(job, []), facts)
    assert len(found) == 1 and "exited by itself" in found[0].message


# -- 25: memory under the cap ------------------------------------------------------------------


def test_a_child_replaced_after_its_leak_holds() -> None:
    job = _job("hog", "succeeded", {})
    leak = _run(1, 5, 0, ended=0.5, rss_end=MEMORY_CAP_MB + 60, kind="hog")
    next_one = _run(2, 6, 1.0, ended=1.1, rss_start=60.0, kind="hog")
    assert memory_under_cap(_snapshot(job, [leak, next_one]), Facts()) == []


def test_a_run_begun_in_a_child_over_the_cap_is_found() -> None:
    job = _job("hog", "succeeded", {})
    leak = _run(1, 5, 0, ended=0.5, rss_end=MEMORY_CAP_MB + 60, kind="hog")
    next_one = _run(2, 5, 1.0, ended=1.1, rss_start=MEMORY_CAP_MB + 60, kind="hog")
    found = memory_under_cap(_snapshot(job, [leak, next_one]), Facts())
    assert len(found) == 1 and "it was not replaced after job 1 (hog)" in found[0].message


def test_a_child_running_too_many_jobs_is_found() -> None:
    job = _job("hang", "succeeded", {})
    runs = [_run(n, 5, n, ended=n + 0.1, outcome="ok") for n in range(1, TASKS_PER_CHILD + 2)]
    found = memory_under_cap(_snapshot(job, runs), Facts())
    assert len(found) == 1 and f"ran {TASKS_PER_CHILD + 1} jobs" in found[0].message


def test_an_idle_child_seen_over_the_cap_is_found_unless_running_or_frozen() -> None:
    job = _job("hog", "succeeded", {})
    leak = _run(1, 5, 0, ended=1.0, rss_end=MEMORY_CAP_MB + 60, kind="hog")
    during = PoolSample(T0 + 0.8, 5, WORKER, MEMORY_CAP_MB + 60)
    assert memory_under_cap(_snapshot(job, [leak]), Facts(pool_samples=[during])) == []
    idle = PoolSample(T0 + 30, 5, WORKER, MEMORY_CAP_MB + 60)
    found = memory_under_cap(_snapshot(job, [leak]), Facts(pool_samples=[idle]))
    assert len(found) == 1 and "while it ran no job" in found[0].message
    frozen = Event(T0 + 26, "sigstop", f"pid {WORKER} for 5 s", WORKER, T0 + 31)
    facts = Facts(pool_samples=[idle], events=[frozen])
    assert memory_under_cap(_snapshot(job, [leak]), facts) == []
