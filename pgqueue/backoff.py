"""Retry schedules: pure functions from the attempt number to a delay in seconds.

A policy is any callable ``(attempt: int) -> float`` where ``attempt`` is the number of the
attempt that just failed (1 for the first). Tasks take one as ``retry=``; the default is
:func:`exponential`. Whatever a policy returns is checked by :func:`delay_after`, and capped at
``validation.MAX_DELAY_SECONDS`` (ten years).
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from dataclasses import dataclass

from pgqueue.errors import ValidationError
from pgqueue.validation import MAX_DELAY_SECONDS

BackoffPolicy = Callable[[int], float]

__all__ = ["BackoffPolicy", "constant", "default", "delay_after", "exponential", "linear"]


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
