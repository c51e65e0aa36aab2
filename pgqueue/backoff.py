"""Retry schedules, and the one decision of what follows a failed attempt.

A policy is any callable ``(attempt: int) -> float`` where ``attempt`` is the number of the
attempt that just failed (1 for the first). Tasks take one as ``retry=``; the default is
:func:`exponential`. Whatever a policy returns is checked by :func:`delay_after`, and capped at
``validation.MAX_DELAY_SECONDS`` (ten years).

:func:`after_failure` decides whether a failed attempt is retried (and after how long) or fails
for good, for every way an attempt can fail in a worker: an exception, ``Retry``, a timeout, an
outcome the database refused.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from dataclasses import dataclass

from pgqueue.errors import ValidationError
from pgqueue.states import OutcomeKind
from pgqueue.validation import MAX_DELAY_SECONDS

BackoffPolicy = Callable[[int], float]


def _non_negative(name: str, value: float) -> float:
    if not isinstance(value, int | float) or isinstance(value, bool) or not value >= 0:
        raise ValidationError(f"backoff {name} must be a non-negative number, got {value!r}")
    if not math.isfinite(value):
        raise ValidationError(f"backoff {name} must be finite, got {value!r}")
    if value > MAX_DELAY_SECONDS:
        raise ValidationError(
            f"backoff {name} must be at most {MAX_DELAY_SECONDS} seconds, got {value!r}"
        )
    return float(value)


def delay_after(policy: BackoffPolicy, attempt: int) -> float:
    """The delay ``policy`` gives after failed attempt ``attempt``, capped at
    ``MAX_DELAY_SECONDS``; ``ValidationError`` when it is not a non-negative number (a
    policy's own exception propagates)."""
    value = policy(attempt)
    if not isinstance(value, int | float) or isinstance(value, bool) or not value >= 0:
        raise ValidationError(
            f"retry policy {policy!r} returned {value!r} after attempt {attempt}; "
            "a delay is a non-negative number of seconds"
        )
    return min(float(value), MAX_DELAY_SECONDS)


@dataclass(frozen=True, slots=True)
class _Constant:
    seconds: float

    def __call__(self, attempt: int) -> float:
        return self.seconds


@dataclass(frozen=True, slots=True)
class _Linear:
    step: float
    cap: float | None

    def __call__(self, attempt: int) -> float:
        delay = self.step * max(attempt, 1)
        return delay if self.cap is None else min(delay, self.cap)


@dataclass(frozen=True, slots=True)
class _Exponential:
    base: float
    cap: float
    jitter: bool

    def __call__(self, attempt: int) -> float:
        # base ** attempt grows without bound; clamp the exponent so huge attempt counts stay finite
        delay = min(self.base ** min(max(attempt, 1), 64), self.cap)
        if self.jitter:
            # "full jitter" on the upper half: spreads a thundering herd of retries, never shorter
            # than half the nominal delay, so a schedule stays recognisable.
            delay = delay / 2 + random.uniform(0, delay / 2)
        return delay


def constant(seconds: float) -> BackoffPolicy:
    """The same delay before every retry."""
    return _Constant(_non_negative("seconds", seconds))


def linear(step: float, cap: float | None = None) -> BackoffPolicy:
    """``step * attempt`` seconds, at most ``cap``."""
    return _Linear(_non_negative("step", step), None if cap is None else _non_negative("cap", cap))


def exponential(base: float = 2.0, cap: float = 3600, jitter: bool = True) -> BackoffPolicy:
    """``base ** attempt`` seconds (2, 4, 8 ... by default), at most ``cap``, optionally jittered."""
    if _non_negative("base", base) < 1:
        raise ValidationError(f"backoff base must be >= 1, got {base!r}")
    return _Exponential(float(base), _non_negative("cap", cap), bool(jitter))


def default() -> BackoffPolicy:
    """The policy used when a task says ``retry=None``."""
    return exponential()


@dataclass(frozen=True, slots=True)
class AfterFailure:
    """What follows a failed attempt: ``RETRY`` after ``delay`` seconds, or ``FAIL`` for good."""

    kind: OutcomeKind
    delay: float = 0.0
    note: str = ""  # to append to the attempt's error: why the default backoff was used


def after_failure(
    attempt: int,
    max_attempts: int,
    *,
    delay: float | None = None,
    schedule: BackoffPolicy | None = None,
) -> AfterFailure:
    """Decide what follows failed attempt ``attempt`` of ``max_attempts``.

    FAIL once the attempts are used up; else RETRY after ``delay`` when one was asked for
    (``Retry(delay=...)``), else after what ``schedule`` (the task's ``backoff_delay``) gives,
    else at once (no task known to ask). A schedule that raises still gets the attempt
    retried, after the default backoff, with a note saying why.

    The Python counterpart of the SQL ``rescue_expired`` statement, which decides the same for
    attempts whose lease expired (their worker is gone): retried at once while attempts are
    left, else FAILED (CANCELLED when a cancel was requested).
    """
    if attempt >= max_attempts:
        return AfterFailure(OutcomeKind.FAIL)
    if delay is not None:
        return AfterFailure(OutcomeKind.RETRY, delay)
    if schedule is None:
        return AfterFailure(OutcomeKind.RETRY, 0.0)
    try:
        return AfterFailure(OutcomeKind.RETRY, schedule(attempt))
    except Exception as exc:
        fallback = delay_after(default(), attempt)
        note = (
            f"\n(the task's retry policy failed with {type(exc).__name__}: {exc}; "
            f"retrying after the default backoff, {fallback:.0f}s)"
        )
        return AfterFailure(OutcomeKind.RETRY, fallback, note)
