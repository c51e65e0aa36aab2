"""How a worker reports failing claims: one line when they begin, a count a minute while the same
error repeats, a line when they work again; the registry's error follows at each change."""

from __future__ import annotations

import logging

import psycopg
import pytest
from sqlalchemy.exc import OperationalError, ProgrammingError

from pgqueue.worker.claim_health import REPEAT_LOG_SECONDS, ClaimHealth


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def refused(text: str = "permission denied for table pgqueue_message_queue") -> ProgrammingError:
    return ProgrammingError("CLAIM", {}, Exception(text))


def test_repeated_failures_log_once_then_a_count_a_minute(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock = Clock()
    changes: list[str | None] = []
    health = ClaimHealth(clock=clock, on_change=lambda: changes.append(health.error))
    with caplog.at_level(logging.INFO, logger="pgqueue.worker"):
        for _ in range(70):
            health.failed(refused(), 1.0)
            clock.now += 1.0
        assert health.failures == 70
        clock.now += REPEAT_LOG_SECONDS
        health.failed(refused(), 1.0)
        health.succeeded()
        health.succeeded()

    messages = [(r.levelno, r.getMessage()) for r in caplog.records]
    assert len(messages) == 4, messages
    first, repeated, later, recovered = caplog.records
    assert first.levelno == logging.ERROR and first.exc_info is not None
    assert "claim failed" in first.getMessage() and "permission denied" in first.getMessage()
    # One a second: the 61st attempt, a minute after the first, is the first due again.
    assert repeated.getMessage().startswith("claims still fail: 60 more attempts")
    assert repeated.exc_info is None
    assert "71 in a row" in later.getMessage()
    assert recovered.levelno == logging.WARNING
    assert "claims work again after 71 failed attempts" in recovered.getMessage()
    assert health.error is None and health.failures == 0
    # The registry is told when the failures begin and when they end, not at every attempt.
    assert len(changes) == 2 and changes[1] is None
    assert changes[0] is not None and "permission denied" in changes[0]


def test_another_error_is_logged_at_once_and_a_lost_connection_without_traceback(
    caplog: pytest.LogCaptureFixture,
) -> None:
    health = ClaimHealth(clock=Clock())
    lost = OperationalError(
        "CLAIM", {}, psycopg.OperationalError("server closed the connection unexpectedly")
    )
    with caplog.at_level(logging.INFO, logger="pgqueue.worker"):
        health.failed(refused())
        health.failed(lost, 0.05)
        health.failed(lost, 0.1)
    first, second = caplog.records
    assert first.levelno == logging.ERROR
    assert second.levelno == logging.WARNING and second.exc_info is None
    assert "server closed the connection" in second.getMessage()
    assert health.error is not None and "server closed" in health.error
    assert health.failures == 3


def test_a_claim_that_works_when_nothing_failed_says_nothing(
    caplog: pytest.LogCaptureFixture,
) -> None:
    changes: list[object] = []
    health = ClaimHealth(on_change=lambda: changes.append(None))
    with caplog.at_level(logging.DEBUG, logger="pgqueue.worker"):
        health.succeeded()
    assert caplog.records == [] and changes == []
