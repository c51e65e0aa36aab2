"""Checks on the durations and moments users give, before any SQL: seconds (a number or a
``timedelta``), delays, a job's ``run_at``, and their one bound, ``MAX_DELAY_SECONDS``.

Every duration that becomes a stored time (enqueue ``delay`` and ``run_at``, ``Retry``,
``Snooze``, ``ctx.sleep``, ``ctx.wait_for_signal`` and ``ctx.await_signal`` timeouts, a task's
``lease_seconds`` and ``timeout``, a scheduler's ``grace``) is held to it where it enters, with
a ``ValidationError`` naming the parameter and the bound; backoff schedules are capped to it.
``pgqueue.validation`` re-exports these checks beside the others on user input.
"""

from __future__ import annotations

import datetime as dt
import math
from typing import Final

from pgqueue.errors import ValidationError

# The longest duration, and how far from now a ``run_at`` may be: ten years of 365 days. Far
# beyond it the database's ``now() + delay`` leaves the range of timestamps, and before that it
# stores times Python cannot read back (after year 9999), which would break every read of the
# job; no queue needs to wait this long.
MAX_DELAY_SECONDS = 3650 * 86_400
_MAX_DELAY: Final = dt.timedelta(seconds=MAX_DELAY_SECONDS)


def seconds(value: object, what: str, *, none_allowed: bool = False) -> float:
    """``value`` (a number or a ``timedelta``) as finite, non-negative seconds; ValidationError
    naming ``what`` otherwise (``none_allowed``: the message says None is accepted too)."""
    if isinstance(value, dt.timedelta):
        value = value.total_seconds()
    if not isinstance(value, int | float) or isinstance(value, bool):
        also = " or None" if none_allowed else ""
        raise ValidationError(
            f"{what} must be seconds (a number or timedelta){also}, got {value!r}"
        )
    if not math.isfinite(value) or value < 0:
        raise ValidationError(
            f"{what} must be a finite, non-negative number of seconds, got {value!r}"
        )
    return float(value)


def bounded_seconds(value: object, what: str) -> float:
    """``seconds(value, what)`` of at most ``MAX_DELAY_SECONDS``; ValidationError naming
    ``what`` and the bound otherwise."""
    checked = seconds(value, what)
    if checked > MAX_DELAY_SECONDS:
        raise ValidationError(
            f"{what} must be at most {MAX_DELAY_SECONDS} seconds "
            f"({MAX_DELAY_SECONDS // 86_400} days), got {checked!r}"
        )
    return checked


def positive_seconds(value: object, what: str) -> None:
    """Raise ValidationError naming ``what`` and the bound unless ``value`` is a number of
    seconds above 0 and at most ``MAX_DELAY_SECONDS``."""
    if not isinstance(value, int | float) or isinstance(value, bool) or not value > 0:
        raise ValidationError(f"{what} must be a positive number of seconds, got {value!r}")
    if not value <= MAX_DELAY_SECONDS:
        raise ValidationError(
            f"{what} must be at most {MAX_DELAY_SECONDS} seconds "
            f"({MAX_DELAY_SECONDS // 86_400} days), got {value!r}"
        )


def delay(value: object) -> float | None:
    """Seconds from now (database clock); ``None`` means now."""
    if value is None:
        return None
    return bounded_seconds(value, "delay")


def run_at(value: object) -> dt.datetime | None:
    """An aware datetime within ``MAX_DELAY_SECONDS`` of now, either way (a past one means
    now). Checked against this process's clock, since the check runs before any SQL: the
    database's may differ by the hosts' clock skew, nothing next to ten years."""
    if value is None:
        return None
    if not isinstance(value, dt.datetime):
        raise ValidationError(f"run_at must be a datetime, got {type(value).__name__}")
    if value.tzinfo is None or value.utcoffset() is None:
        raise ValidationError("run_at must be timezone-aware (e.g. datetime.now(timezone.utc))")
    if abs(value - dt.datetime.now(dt.UTC)) > _MAX_DELAY:
        raise ValidationError(
            f"run_at must be within {MAX_DELAY_SECONDS // 86_400} days "
            f"({MAX_DELAY_SECONDS} seconds) of now, got {value.isoformat()}"
        )
    return value
