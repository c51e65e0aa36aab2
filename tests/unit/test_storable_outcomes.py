"""Outcomes a worker builds are always storable, without a database.

Error texts lose NUL and lone surrogates (which PostgreSQL's ``text`` and ``jsonb`` refuse) and
stay within ``max_error_bytes``; delays are checked where they are made (``delay=``,
``run_at=``, ``Retry(delay=...)``, backoff parameters, a task's lease and timeout, a scheduler's
grace, ages and retention) and whatever a retry policy returns is capped; stored
arguments Python cannot decode are reported, not raised; the executor maps all of these to one
outcome each.
"""

from __future__ import annotations

import datetime as dt
import json
import math
import time
import uuid
from typing import Any

import pytest
from sqlalchemy.orm import sessionmaker

from pgqueue import Retry, backoff, codec, validation
from pgqueue.config import Settings
from pgqueue.data import history as history_data
from pgqueue.errors import (
    ConfigurationError,
    SerializationError,
    ValidationError,
    storable_text,
)
from pgqueue.job_filter import parse_time
from pgqueue.jobs import ClaimedJob
from pgqueue.scheduler import Scheduler
from pgqueue.tasks import Task, TaskRegistry
from pgqueue.validation import MAX_DELAY_SECONDS
from pgqueue.worker.execution import Execution
from pgqueue.worker.executor import Executor


def _storable(text: str) -> bool:
    """What PostgreSQL's ``text`` and ``jsonb`` accept: valid UTF-8 without NUL."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return "\x00" not in text


@pytest.mark.parametrize(
    ("raw", "stored"),
    [
        ("plain text\nwith lines", "plain text\nwith lines"),
        ("nul\x00inside", "nul\\x00inside"),
        ("lone \udc80 and \ud800", "lone \\udc80 and \\ud800"),
        ("pair \U0001f600 stays", "pair \U0001f600 stays"),
        ("", ""),
    ],
)
def test_error_text_is_escaped_only_where_needed(raw: str, stored: str) -> None:
    assert storable_text(raw, 16_384) == stored


@pytest.mark.parametrize("limit", [256, 1000, 16_384])
@pytest.mark.parametrize("unit", ["x", "\x00", "\udc80", "€", "\U0001f600", "a\x00\udfff€"])
def test_error_text_is_storable_and_capped_in_bytes(limit: int, unit: str) -> None:
    raw = "Traceback (most recent call last):\n" + unit * 50_000 + "\nValueError: the end"
    stored = storable_text(raw, limit)
    assert _storable(stored)
    assert len(stored.encode("utf-8")) <= limit
    assert stored.startswith("Traceback")
    assert stored.endswith("ValueError: the end")
    assert "[traceback truncated]" in stored


def test_delay_has_a_documented_maximum() -> None:
    assert MAX_DELAY_SECONDS == 3650 * 86_400
    assert validation.delay(MAX_DELAY_SECONDS) == MAX_DELAY_SECONDS
    assert validation.delay(dt.timedelta(days=3650)) == MAX_DELAY_SECONDS
    for too_long in (MAX_DELAY_SECONDS + 1, 1e300, dt.timedelta.max):
        with pytest.raises(ValidationError, match="at most 315360000 seconds \\(3650 days\\)"):
            validation.delay(too_long)


def _aware(year: int, hours: int) -> dt.datetime:
    """A moment at the very start (``year`` 1) or end (9999) of ``datetime``'s range."""
    zone = dt.timezone(dt.timedelta(hours=hours))
    if year == 1:
        return dt.datetime(1, 1, 1, tzinfo=zone)
    return dt.datetime(9999, 12, 31, 23, 59, 59, tzinfo=zone)


def test_run_at_is_within_the_delay_bound_of_now() -> None:
    now = dt.datetime.now(dt.UTC)
    for near in (now, now + dt.timedelta(days=3649), now - dt.timedelta(days=3649)):
        assert validation.run_at(near) == near
    for far in (
        now + dt.timedelta(days=3651),
        now - dt.timedelta(days=3651),
        _aware(9999, 0),
        _aware(9999, -5),
        _aware(1, 0),
        _aware(1, 5),
    ):
        with pytest.raises(ValidationError, match="run_at must be within 3650 days") as refused:
            validation.run_at(far)
        assert f"got {far.isoformat()}" in str(refused.value)


def test_durations_a_task_or_a_schedule_takes_are_bounded() -> None:
    def job() -> None:
        """Never run."""

    for name in ("lease_seconds", "timeout"):
        assert getattr(_task(job, "t", **{name: MAX_DELAY_SECONDS}), name) == MAX_DELAY_SECONDS
        for too_long in (MAX_DELAY_SECONDS + 1, math.inf):
            with pytest.raises(ValidationError, match=f"{name} must be at most 315360000"):
                _task(job, "t", **{name: too_long})
        for bad in (0, -1, math.nan, True, "5"):
            with pytest.raises(ValidationError, match=f"{name} must be a positive number"):
                _task(job, "t", **{name: bad})
    sessions = sessionmaker()
    assert Scheduler(sessions, {}, grace=0).grace == dt.timedelta(0)
    assert Scheduler(sessions, {}, grace=dt.timedelta(days=3650)).grace.days == 3650
    for bad_grace in (MAX_DELAY_SECONDS + 1, 1e12, math.inf, math.nan, -1):
        with pytest.raises(ValidationError, match="grace must be"):
            Scheduler(sessions, {}, grace=bad_grace)


def test_ages_and_retention_days_are_bounded() -> None:
    now = dt.datetime.now(dt.UTC)
    assert parse_time("--since", "3650d", now) == now - dt.timedelta(days=3650)
    for too_old in ("3651d", "9999999d", "9999999h"):
        with pytest.raises(ValidationError, match="is an age over 3650 days"):
            parse_time("--since", too_old, now)
    assert Settings(history_retention_days=3650).history_retention_days == 3650
    with pytest.raises(ConfigurationError, match="history_retention_days must be at most 3650"):
        Settings(history_retention_days=3651)
    with pytest.raises(ValidationError, match="retention_days must be at most 3650"):
        history_data.maintain(None, days_ahead=1, retention_days=10**6)  # type: ignore[arg-type]


def test_retry_delay_is_checked_where_it_is_raised() -> None:
    assert Retry(delay=MAX_DELAY_SECONDS).delay == MAX_DELAY_SECONDS
    with pytest.raises(ValidationError, match="got 1e\\+300"):
        Retry(delay=1e300)


@pytest.mark.parametrize(
    "make",
    [
        lambda: backoff.constant(MAX_DELAY_SECONDS + 1),
        lambda: backoff.linear(1e300),
        lambda: backoff.linear(1, cap=1e300),
        lambda: backoff.exponential(cap=1e300),
    ],
)
def test_backoff_parameters_beyond_the_maximum_are_refused(make: Any) -> None:
    with pytest.raises(ValidationError, match="at most"):
        make()


def test_what_a_policy_returns_is_capped_or_refused() -> None:
    assert backoff.delay_after(backoff.linear(60), 10**9) == MAX_DELAY_SECONDS
    assert backoff.delay_after(
        backoff.exponential(base=10, jitter=False, cap=MAX_DELAY_SECONDS), 50
    ) == (MAX_DELAY_SECONDS)
    assert backoff.delay_after(lambda attempt: math.inf, 1) == MAX_DELAY_SECONDS
    assert backoff.delay_after(lambda attempt: 7, 1) == 7.0
    for bad in (math.nan, -1, "5", None, True):
        with pytest.raises(ValidationError, match="a delay is a non-negative number"):
            backoff.delay_after(lambda attempt, bad=bad: bad, 3)  # type: ignore[misc]


def test_arguments_python_cannot_decode_are_reported() -> None:
    assert codec.load_arguments("[]", "{}") == ([], {})
    assert codec.load_arguments('[1, "a"]', '{"k": [null]}') == ([1, "a"], {"k": [None]})
    deep = "[" * 100_000 + "]" * 100_000
    with pytest.raises(SerializationError, match=r"^RecursionError: maximum recursion depth"):
        codec.load_arguments(deep, "{}")
    with pytest.raises(SerializationError, match=r"^ValueError: Exceeds the limit"):
        codec.load_arguments("[" + "9" * 5000 + "]", "{}")
    with pytest.raises(SerializationError, match=r"^JSONDecodeError"):
        codec.load_arguments("[", "{}")


# --- the executor's outcomes -------------------------------------------------------------------


def _executor(*tasks: Task[Any, Any], max_error_bytes: int = 16_384) -> Executor:
    registry = TaskRegistry()
    for task in tasks:
        registry.add(task)
    settings = Settings(max_error_bytes=max_error_bytes)
    return Executor(registry, settings, lambda: None, lambda: None)  # type: ignore[arg-type,return-value]


def _job(
    name: str, *, attempt: int = 1, max_attempts: int = 3, problem: str | None = None
) -> ClaimedJob:
    return ClaimedJob(
        id=7,
        task_name=name,
        queue="default",
        args=[],
        kwargs={},
        attempt=attempt,
        max_attempts=max_attempts,
        priority=0,
        lease_token=str(uuid.uuid4()),
        atomic=False,
        cancel_requested=False,
        problem=problem,
    )


def _run(executor: Executor, job: ClaimedJob) -> Any:
    return executor.run_leased(Execution(job, 30.0, None, time.monotonic()))


def _task(fn: Any, name: str, **options: Any) -> Task[Any, Any]:
    return Task(fn, sink=None, name=name, **options)  # type: ignore[arg-type]


def test_an_unstorable_handler_error_becomes_a_storable_retry() -> None:
    def handler() -> None:
        raise ValueError("x" * 100_000 + " bad\x00byte \udc80")

    executor = _executor(_task(handler, "t.bad_text"), max_error_bytes=512)
    outcome = _run(executor, _job("t.bad_text"))
    assert outcome.kind == "retry"
    assert _storable(outcome.error) and len(outcome.error.encode()) <= 512
    assert outcome.error.endswith(" bad\\x00byte \\udc80\n")


def test_a_huge_retry_delay_is_a_failed_attempt_with_the_reason() -> None:
    def handler() -> None:
        raise Retry(delay=1e300)

    executor = _executor(_task(handler, "t.huge_delay", retry=backoff.constant(5)))
    outcome = _run(executor, _job("t.huge_delay"))
    assert (outcome.kind, outcome.delay) == ("retry", 5.0)
    assert "ValidationError: delay must be at most 315360000 seconds" in outcome.error
    last = _run(executor, _job("t.huge_delay", attempt=3))
    assert last.kind == "fail"


def test_a_broken_retry_policy_still_retries_with_the_default_backoff() -> None:
    def handler() -> None:
        raise RuntimeError("handler failed")

    def policy(attempt: int) -> float:
        raise ZeroDivisionError("policy bug")

    executor = _executor(_task(handler, "t.policy", retry=policy))
    outcome = _run(executor, _job("t.policy", attempt=2))
    assert outcome.kind == "retry"
    assert 2.0 <= outcome.delay <= 4.0  # the default exponential schedule after attempt 2
    assert "RuntimeError: handler failed" in outcome.error
    assert "retry policy failed with ZeroDivisionError: policy bug" in outcome.error


def test_a_row_that_did_not_decode_fails_at_once() -> None:
    executor = _executor(_task(lambda: None, "t.ok"))
    outcome = _run(executor, _job("t.ok", problem="job 7's arguments could not be decoded (X)"))
    assert (outcome.kind, outcome.error) == (
        "fail",
        "ValidationError: job 7's arguments could not be decoded (X)",
    )


def test_an_outcome_the_database_refused_becomes_an_ascii_failed_attempt() -> None:
    executor = _executor(_task(lambda: None, "t.ok", retry=backoff.constant(1)))
    job = _job("t.ok")
    complete = executor.run_leased(Execution(job, 30.0, None, time.monotonic()))
    refused = executor.unrecorded(job, complete, RuntimeError("refusé\x00"))
    assert (refused.kind, refused.delay) == ("retry", 1.0)
    assert refused.error.isascii() and _storable(refused.error)
    assert refused.error == (
        "OutcomeNotRecorded: this attempt's 'complete' outcome could not be written "
        "(RuntimeError: refus\\xe9\\x00); the attempt counts as failed"
    )
    last = executor.unrecorded(_job("t.ok", attempt=3), complete, RuntimeError("no"))
    assert last.kind == "fail"


def test_result_with_a_lone_surrogate_fails_with_a_storable_reason() -> None:
    executor = _executor(
        _task(lambda: {"k\udc80": 1}, "t.key"), _task(lambda: "v\ud800", "t.value")
    )
    for name in ("t.key", "t.value"):
        outcome = _run(executor, _job(name))
        assert outcome.kind == "fail"
        assert "lone surrogate" in outcome.error and _storable(outcome.error)
    nul = _executor(_task(lambda: "a\x00b", "t.nul"))
    outcome = _run(nul, _job("t.nul"))
    assert (outcome.kind, json.loads(outcome.result_json)) == ("complete", "a\x00b")
