"""Checks on user input that run before any SQL: names, priorities, attempts, keys, limits,
whether arguments bind to a task's signature, and progress reports (durations and moments from
``pgqueue.durations``, re-exported here). Encoding job data as JSON is ``pgqueue.codec``'s.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Set as AbstractSet
from typing import Any, Final

from pgqueue.config import NAME_PATTERN, TASK_NAME_PATTERN

# Durations and moments are checked in their own module; callers reach them here too.
from pgqueue.durations import MAX_DELAY_SECONDS as MAX_DELAY_SECONDS
from pgqueue.durations import bounded_seconds as bounded_seconds
from pgqueue.durations import delay as delay
from pgqueue.durations import positive_seconds as positive_seconds
from pgqueue.durations import run_at as run_at
from pgqueue.durations import seconds as seconds
from pgqueue.errors import ValidationError, short_repr, storable_text

PRIORITY_MIN = -32768
PRIORITY_MAX = 32767
MAX_ATTEMPTS_LIMIT = 1_000_000


def queue_name(value: object) -> str:
    """A queue name: letters, digits, ``_ . : -``; 1 to 63 bytes."""
    return _name("queue name", value, NAME_PATTERN)


def task_name(value: object) -> str:
    """A task name: like a queue name, plus ``< >`` (for ``<locals>`` in qualnames)."""
    return _name("task name", value, TASK_NAME_PATTERN)


def _name(what: str, value: object, pattern: Any) -> str:
    if not isinstance(value, str):
        raise ValidationError(f"{what} must be a string, got {type(value).__name__}")
    if len(value.encode("utf-8", "surrogatepass")) > 63:
        raise ValidationError(f"{what} {value[:80]!r} is longer than 63 bytes")
    if not pattern.fullmatch(value):
        raise ValidationError(
            f"{what} {value!r} has characters outside letters, digits and '_.:-'"
            + (" (and '<>')" if what == "task name" else "")
        )
    return value


def priority(value: object) -> int:
    if not isinstance(value, int) or isinstance(value, bool):
        raise ValidationError(f"priority must be an int, got {value!r}")
    if not PRIORITY_MIN <= value <= PRIORITY_MAX:
        raise ValidationError(
            f"priority must be within {PRIORITY_MIN}..{PRIORITY_MAX}, got {value}"
        )
    return value


def max_attempts(value: object) -> int:
    if (
        not isinstance(value, int)
        or isinstance(value, bool)
        or not 1 <= value <= MAX_ATTEMPTS_LIMIT
    ):
        raise ValidationError(
            f"max_attempts must be an int from 1 to {MAX_ATTEMPTS_LIMIT}, got {value!r}"
        )
    return value


def unique_key(value: object) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or not value or len(value) > 512 or "\x00" in value:
        raise ValidationError(
            f"unique_key must be a non-empty string of at most 512 characters without NUL, got {value!r}"
        )
    return value


def concurrency_key(value: object, *, what: str = "concurrency_key") -> str:
    """A concurrency key (or key prefix): a non-empty string of at most 512 characters
    without NUL."""
    if not isinstance(value, str):
        raise ValidationError(f"{what} must be a string, got {type(value).__name__}")
    if not value or len(value) > 512 or "\x00" in value:
        raise ValidationError(
            f"{what} must be a non-empty string of at most 512 characters without NUL, "
            f"got {value!r}"
        )
    return value


def limit_count(value: object, *, what: str) -> int:
    """A limit's count: a whole number of at least 1 (booleans are not numbers here)."""
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValidationError(f"{what} must be a whole number of at least 1, got {value!r}")
    if value > 2**31 - 1:
        raise ValidationError(f"{what} must be at most {2**31 - 1}, got {value!r}")
    return value


def rate_period(value: object) -> float:
    """A rate limit's window: a positive number of seconds (at most a day)."""
    if (
        not isinstance(value, int | float)
        or isinstance(value, bool)
        or not math.isfinite(value)
        or value <= 0
        or value > 86_400
    ):
        raise ValidationError(
            f"per must be a positive number of seconds of at most 86400, got {value!r}"
        )
    return float(value)


_POSITIONAL: Final = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
_EMPTY: Final = inspect.Parameter.empty


class ArgumentCheck:
    """Whether arguments bind to a task function's signature, decided from their shape (how
    many positional ones, which keywords) by rules compiled once from the signature: an
    enqueue checks every job, and ``Signature.bind`` per job costs more than the job's JSON.

    ``binds`` says True only when ``Signature.bind`` would succeed; False means "ask it": the
    caller then binds for real, which raises with Python's own message (or accepts a shape these
    rules leave to it). ``context_first``: the function's first parameter takes a context the
    worker passes, not the caller.
    """

    __slots__ = (
        "keyword_call_ok",
        "keyword_call_required",
        "keyword_names",
        "positional",
        "required_keyword_only",
        "reserved",
        "undecided",
        "var_keyword",
        "var_positional",
    )

    def __init__(self, signature: inspect.Signature, *, context_first: bool = False) -> None:
        params = list(signature.parameters.values())
        kinds = [p.kind for p in params]
        self.var_positional = inspect.Parameter.VAR_POSITIONAL in kinds
        self.var_keyword = inspect.Parameter.VAR_KEYWORD in kinds
        self.undecided = False
        # Keywords named like the context's parameter or a positional-only one: left to bind
        # (which refuses the latter even where a ``**kwargs`` would take them in a call).
        reserved = {p.name for p in params if p.kind is inspect.Parameter.POSITIONAL_ONLY}
        if context_first:
            if params and params[0].kind in _POSITIONAL:
                reserved.add(params[0].name)
                params = params[1:]
            elif not self.var_positional or params[0].kind is not inspect.Parameter.VAR_POSITIONAL:
                self.undecided = True  # no slot for the context: bind says why
        self.reserved = frozenset(reserved)
        self.positional = tuple(p for p in params if p.kind in _POSITIONAL)
        keyword_kinds = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
        self.keyword_names = frozenset(p.name for p in params if p.kind in keyword_kinds)
        self.required_keyword_only = frozenset(
            p.name
            for p in params
            if p.kind is inspect.Parameter.KEYWORD_ONLY and p.default is _EMPTY
        )
        # Keywords only (the usual enqueue_many item, a dict): possible unless a positional-only
        # parameter needs a value; then every required parameter must be named.
        self.keyword_call_ok = not any(
            p.kind is inspect.Parameter.POSITIONAL_ONLY and p.default is _EMPTY
            for p in self.positional
        )
        self.keyword_call_required = frozenset(
            p.name for p in params if p.kind in keyword_kinds and p.default is _EMPTY
        )

    def binds(self, positional: int, keywords: AbstractSet[str]) -> bool:
        """Whether ``positional`` positional arguments and the ``keywords`` bind for sure."""
        if self.undecided or (self.reserved and not self.reserved.isdisjoint(keywords)):
            return False
        if positional == 0:
            return (
                self.keyword_call_ok
                and (self.var_keyword or keywords <= self.keyword_names)
                and self.keyword_call_required <= keywords
            )
        slots = self.positional
        if positional > len(slots) and not self.var_positional:
            return False
        for param in slots[positional:]:
            if param.default is _EMPTY and (
                param.kind is inspect.Parameter.POSITIONAL_ONLY or param.name not in keywords
            ):
                return False
        filled = {
            p.name for p in slots[:positional] if p.kind is not inspect.Parameter.POSITIONAL_ONLY
        }
        for name in keywords:
            if name in self.keyword_names:
                if name in filled:
                    return False  # given twice
            elif not self.var_keyword:
                return False
        return self.required_keyword_only <= keywords


# Longest progress message kept, in UTF-8 bytes: it is written at every heartbeat that reports
# progress, so it stays a status line, not a log.
PROGRESS_MESSAGE_BYTES = 1000


def progress(fraction: object, message: object) -> tuple[float, str | None]:
    """``(fraction, message)`` as ``JobContext.progress`` records it, or ValidationError."""
    if (
        not isinstance(fraction, int | float)
        or isinstance(fraction, bool)
        or not 0.0 <= fraction <= 1.0  # also refuses NaN
    ):
        raise ValidationError(f"progress must be a number from 0 to 1, got {short_repr(fraction)}")
    if message is not None and not isinstance(message, str):
        raise ValidationError(
            f"progress message must be a string or None, got {type(message).__name__}"
        )
    text = None if message is None else storable_text(message, PROGRESS_MESSAGE_BYTES)
    return float(fraction), text
