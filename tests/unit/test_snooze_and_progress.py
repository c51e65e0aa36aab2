"""Snooze and progress without a database: the executor turns ``raise Snooze`` into a snooze
outcome carrying the ``max_snoozes`` setting (not a retry, whatever the attempt), and hands on
the progress a handler reported that no heartbeat wrote; the progress checks."""

from __future__ import annotations

import asyncio
import datetime as dt
import math
import threading
import time
import uuid
from typing import Any

import pytest
from sqlalchemy.dialects import postgresql

from pgqueue import ConfigurationError, JobContext, Snooze, ValidationError, validation
from pgqueue.config import Settings
from pgqueue.data.outcomes import _add_progress
from pgqueue.jobs import ClaimedJob, Outcome
from pgqueue.sql import outcomes, workers
from pgqueue.states import OutcomeKind
from pgqueue.tasks import Task, TaskRegistry
from pgqueue.worker.execution import Execution
from pgqueue.worker.executor import Executor


def _job(*, attempt: int = 1, max_attempts: int = 3) -> ClaimedJob:
    token = str(uuid.uuid4())
    return ClaimedJob(7, "t", "default", [], {}, attempt, max_attempts, 0, token, False, False)


def _executor(fn: Any, settings: Settings | None = None, **options: Any) -> Executor:
    registry = TaskRegistry()
    registry.add(Task(fn, sink=None, name="t", **options))  # type: ignore[arg-type]
    return Executor(registry, settings or Settings(), lambda: None, lambda: None)  # type: ignore[arg-type,return-value]


def _run(executor: Executor, execution: Execution) -> Outcome:
    return executor.run_leased(execution)


@pytest.mark.parametrize("attempt", [1, 3])
def test_a_raised_snooze_is_a_snooze_outcome_on_any_attempt(attempt: int) -> None:
    def later() -> None:
        raise Snooze(dt.timedelta(seconds=90), reason="partner busy")

    executor = _executor(later, Settings(max_snoozes=7))
    outcome = _run(executor, Execution(_job(attempt=attempt), 30.0, None, time.monotonic()))
    assert outcome.kind is OutcomeKind.SNOOZE
    assert (outcome.delay, outcome.max_snoozes, outcome.error) == (90.0, 7, "")
    assert outcome.progress is None


def test_snooze_keeps_its_reason_and_refuses_bad_delays() -> None:
    assert str(Snooze(1, reason="rate limited")) == "snoozed: rate limited"
    assert Snooze(0).delay == 0.0
    for bad in (-1, math.inf, "1", True, dt.timedelta(seconds=-1)):
        with pytest.raises(ValidationError, match=r"^Snooze delay must be"):
            Snooze(bad)  # type: ignore[arg-type]


def test_progress_no_heartbeat_wrote_goes_with_the_outcome() -> None:
    def reports(ctx: JobContext) -> None:
        ctx.progress(0.3, "a third")
        ctx.progress(0.9, "nearly")

    executor = _executor(reports, pass_context=True)
    execution = Execution(_job(), 30.0, None, time.monotonic())
    outcome = _run(executor, execution)
    assert outcome.kind is OutcomeKind.COMPLETE
    assert outcome.progress == (0.9, "nearly")


def test_progress_a_heartbeat_wrote_is_not_written_again() -> None:
    def reports(ctx: JobContext) -> None:
        ctx.progress(0.5)
        assert execution.progress is not None
        execution.progress_written = execution.progress  # as the heartbeat does once written

    executor = _executor(reports, pass_context=True)
    execution = Execution(_job(), 30.0, None, time.monotonic())
    assert _run(executor, execution).progress is None


def test_a_snoozing_handler_hands_on_its_progress_too() -> None:
    def reports(ctx: JobContext) -> None:
        ctx.progress(0.25)
        raise Snooze(5)

    outcome = _run(
        _executor(reports, pass_context=True), Execution(_job(), 30.0, None, time.monotonic())
    )
    assert (outcome.kind, outcome.progress) == (OutcomeKind.SNOOZE, (0.25, None))


def test_async_handlers_snooze_too() -> None:
    async def later() -> None:
        raise Snooze(2)

    registry = TaskRegistry()
    registry.add(Task(later, sink=None, name="t"))  # type: ignore[arg-type]
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    try:
        executor = Executor(registry, Settings(), lambda: None, lambda: loop)  # type: ignore[arg-type,return-value]
        outcome = _run(executor, Execution(_job(), 30.0, None, time.monotonic()))
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join(5)
    assert (outcome.kind, outcome.delay) == (OutcomeKind.SNOOZE, 2.0)


@pytest.mark.parametrize(
    ("fraction", "message", "expected"),
    [
        (0, None, (0.0, None)),
        (1, "done", (1.0, "done")),
        (0.5, "x" * 2000, (0.5, None)),
    ],
)
def test_progress_values_are_kept_as_floats_with_capped_messages(
    fraction: float, message: str | None, expected: tuple[float, str | None]
) -> None:
    kept = validation.progress(fraction, message)
    assert kept[0] == expected[0]
    if message is not None and len(message) > validation.PROGRESS_MESSAGE_BYTES:
        assert kept[1] is not None and len(kept[1].encode()) <= validation.PROGRESS_MESSAGE_BYTES
    else:
        assert kept[1] == expected[1]


def test_max_snoozes_must_be_a_positive_integer() -> None:
    for bad in (0, -1, 1.5, True):
        with pytest.raises(ConfigurationError, match="max_snoozes must be a positive integer"):
            Settings(max_snoozes=bad)  # type: ignore[arg-type]


def _given(statement: Any) -> set[str]:
    """The bind parameters a caller must give ``statement``."""
    compiled = statement.compile(dialect=postgresql.dialect())  # type: ignore[no-untyped-call]
    return {name for bind, name in compiled.bind_names.items() if bind.required}


PROGRESS_BINDS = {"progress_values", "progress_messages"}


def test_statements_of_jobs_without_progress_do_not_touch_it() -> None:
    dialect = postgresql.dialect()  # type: ignore[no-untyped-call]
    plain = {"ids", "tokens", "lease_seconds"}
    assert _given(outcomes.heartbeat(False)) == plain
    assert _given(outcomes.heartbeat(True)) == plain | PROGRESS_BINDS
    assert _given(workers.heartbeat_and_seen(True)) >= PROGRESS_BINDS
    assert not PROGRESS_BINDS & _given(workers.heartbeat_and_seen(False))
    for builder in (
        outcomes.complete,
        outcomes.retry,
        outcomes.fail,
        outcomes.mark_cancelled,
        outcomes.release,
        outcomes.snooze,
    ):
        assert "progress" not in str(builder(False).compile(dialect=dialect)), builder
        assert _given(builder(True)) == _given(builder(False)) | PROGRESS_BINDS, builder


def test_a_batch_binds_progress_arrays_only_when_some_outcome_carries_progress() -> None:
    quiet = [Outcome.complete(_job()), Outcome.complete(_job())]
    params: dict[str, Any] = {}
    assert not _add_progress(params, quiet)
    assert params == {}
    reported = [Outcome.complete(_job()), Outcome.complete(_job())]
    reported[1].progress = (0.5, "half")
    assert _add_progress(params, reported)
    assert params == {"progress_values": [None, 0.5], "progress_messages": [None, "half"]}
