"""The fault harness's check that an async handler's ``KeyboardInterrupt`` or ``SystemExit``
fails only its own attempt (invariant 19), on made-up snapshots: an interrupted attempt
recorded with the interrupt's error, or with a fault's, holds; one recorded as something else,
or a job failed with every attempt an interrupt, does not."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from tests.chaos.invariants import Facts, interrupts_fail_their_attempt
from tests.chaos.snapshot import Run, Snapshot

T0 = 1_000_000.0
PID = 4242
# An interrupt as the worker records it: the traceback, its last line the exception.
TRACEBACK = (
    "Traceback (most recent call last):\n"
    '  File "/app/pgqueue/worker/dispatch.py", line 148, in _run_until_stopped\n'
    "    loop.run_forever()\n"
)
CTRL_C = TRACEBACK + "KeyboardInterrupt: chaos: interrupts on purpose\n"
EXIT = TRACEBACK + "SystemExit: chaos: interrupts on purpose\n"


def _job(state: str, errors: list[str]) -> Any:
    return SimpleNamespace(
        id=1,
        kind="async_interrupt",
        state=state,
        attempts=len(errors) + (state == "succeeded"),
        max_attempts=3,
        moved=False,
        errors=[{"attempt": n, "error": e} for n, e in enumerate(errors, start=1)],
    )


def _snapshot(job: Any, outcomes: list[str]) -> Snapshot:
    snapshot = Snapshot(T0 + 60, {job.id: job})
    for attempt, outcome in enumerate(outcomes, start=1):
        started = T0 + attempt
        run = Run(
            attempt, job.id, attempt, "async_interrupt", "run", PID, started, started, outcome
        )
        snapshot.runs[job.id].append(run)
    return snapshot


def test_interrupted_attempts_then_a_success_hold() -> None:
    job = _job("succeeded", [CTRL_C, EXIT])
    snapshot = _snapshot(job, ["interrupt", "interrupt", "ok"])
    assert interrupts_fail_their_attempt(snapshot, Facts(final=True)) == []


def test_an_attempt_a_fault_cut_short_holds() -> None:
    job = _job("succeeded", ["lease expired (worker w1 stopped heartbeating)"])
    snapshot = _snapshot(job, ["interrupt", "ok"])
    assert interrupts_fail_their_attempt(snapshot, Facts(final=True)) == []


def test_an_interrupt_recorded_as_another_error_is_found() -> None:
    job = _job("succeeded", [TRACEBACK + "RuntimeError: pgqueue-asyncio loop stopped"])
    snapshot = _snapshot(job, ["interrupt", "ok"])
    found = interrupts_fail_their_attempt(snapshot, Facts(final=True))
    assert [v.invariant for v in found] == ["19 interrupts fail their attempt"]
    assert "attempt 1 raised an interrupt" in found[0].message


def test_a_job_failed_by_interrupts_alone_is_found() -> None:
    errors = [CTRL_C] * 3
    job = _job("failed", errors)
    snapshot = _snapshot(job, ["interrupt"] * 3)
    found = interrupts_fail_their_attempt(snapshot, Facts(final=True))
    assert [v.message for v in found] == ["failed after 3 attempts, every one an interrupt"]


def test_a_job_failed_with_a_faults_attempt_holds() -> None:
    errors = [CTRL_C, "lease expired", "lease expired"]
    job = _job("failed", errors)
    snapshot = _snapshot(job, ["interrupt", "ok", "ok"])
    assert interrupts_fail_their_attempt(snapshot, Facts(final=True)) == []
