"""The search filters of the job listing (``pgq.admin.list_jobs``) beyond queue, state and task:
one job by id, a time window, text in the last error and JSON content of the arguments or the
result. Their values, and their checks, which run before any SQL.

No index serves a search of arguments, results or errors: a GIN index on the arguments would be
written by every enqueue, claim and completion (BENCHMARKS.md, "Job search"), for a page an
operator opens now and then. So those searches need a time window, and read at most ``scan``
jobs of it, newest first, through an index the window orders: the ``finished_at`` index for a
window on ``finished_at``, the primary key for one on ``created_at`` (ids are handed out in
creation order, so the window is an id range, found by bisection). A search that stopped at
``scan`` jobs says so (``SearchExtent``), and its page's ``older`` cursor continues it where it
stopped.
"""

from __future__ import annotations

import datetime as dt
import json
import math
from dataclasses import dataclass, field
from typing import Any, Final

from pgqueue.errors import ValidationError
from pgqueue.job_filter import MAX_ERROR_TEXT, TIME_COLUMNS

# The columns whose JSON a ``JsonMatch`` path may start from.
JSON_COLUMNS: Final = ("args", "kwargs", "result")
MAX_PATH_LENGTH: Final = 1000
MAX_PATH_DEPTH: Final = 32
MAX_VALUE_CHARS: Final = 10_000
# How many jobs of its window a content or error search reads by default, and at most: the
# default answers in well under a second on a loaded server (BENCHMARKS.md, "Job search").
DEFAULT_SEARCH_SCAN: Final = 100_000
MAX_SEARCH_SCAN: Final = 1_000_000


@dataclass(frozen=True, slots=True)
class JsonMatch:
    """A condition on a job's JSON: the value at ``path`` equals ``value`` (JSON equality: key
    order and ``1`` against ``1.0`` do not matter), or, with ``contains``, contains it as
    PostgreSQL's ``@>`` says (an object contains the given keys with contained values, an array
    every given element or the given scalar, a scalar only itself; never a substring).

    ``path`` starts with ``args``, ``kwargs`` or ``result``, followed by keys or array indices
    separated by dots: ``kwargs.user.id``, ``args.0``, ``result.items.2.sku``, ``result``. A
    job without that path never matches. Keys holding a dot cannot be named. ``value`` is any
    JSON value (``dict`` with ``str`` keys, ``list``, ``str``, ``int``, finite ``float``,
    ``bool``, ``None``) without NUL characters, which PostgreSQL's ``jsonb`` cannot hold.
    """

    path: str
    value: Any
    contains: bool = False
    column: str = field(init=False)
    """The column ``path`` starts from."""
    keys: tuple[str, ...] = field(init=False)
    """The rest of ``path``: keys or indices, as ``#>`` takes them."""
    encoded: str = field(init=False)
    """``value`` as JSON text."""

    def __post_init__(self) -> None:
        column, keys = _checked_path(self.path)
        if not isinstance(self.contains, bool):
            raise ValidationError(f"contains must be a bool, got {self.contains!r}")
        object.__setattr__(self, "column", column)
        object.__setattr__(self, "keys", keys)
        object.__setattr__(self, "encoded", _encoded_value(self.value, self.path))

    @classmethod
    def parse(cls, text: str, *, contains: bool = False) -> JsonMatch:
        """A match written ``PATH=JSON`` (``kwargs.user_id=42``, ``args.0="a@b.c"``), as the
        CLI and the dashboard take it; ValidationError naming what is wrong."""
        if not isinstance(text, str) or "=" not in text:
            raise ValidationError(
                f'a JSON match is PATH=JSON (kwargs.user_id=42, args.0="a@b.c"), got {text!r:.80}'
            )
        path, _, value_text = text.partition("=")
        try:
            value = json.loads(value_text)
        except (json.JSONDecodeError, RecursionError) as exc:
            raise ValidationError(
                f"the value of {path.strip()!r:.80} is not JSON ({exc}): quote a string, as in "
                f'{path.strip()}="text"'
            ) from None
        return cls(path.strip(), value, contains=contains)

    def describe(self) -> str:
        """``kwargs.user_id = 42`` or ``kwargs.tags contains ["vip"]``."""
        return f"{self.path} {'contains' if self.contains else '='} {self.encoded}"


def _checked_path(path: object) -> tuple[str, tuple[str, ...]]:
    if not isinstance(path, str) or not path or "\x00" in path or len(path) > MAX_PATH_LENGTH:
        raise ValidationError(
            f"path must be 1 to {MAX_PATH_LENGTH} characters without NUL, got {path!r:.80}"
        )
    column, *keys = path.split(".")
    if column not in JSON_COLUMNS:
        raise ValidationError(
            f"path {path!r:.80} must start with {', '.join(JSON_COLUMNS)} (then keys or indices "
            "separated by dots, as in kwargs.user.id)"
        )
    if any(not key for key in keys):
        raise ValidationError(f"path {path!r:.80} has an empty key (two dots, or a dot at an end)")
    if len(keys) > MAX_PATH_DEPTH:
        raise ValidationError(f"path {path!r:.80} is deeper than {MAX_PATH_DEPTH} keys")
    return column, tuple(keys)


def _encoded_value(value: Any, path: str) -> str:
    _check_json(value, path, 0)
    encoded = json.dumps(value, allow_nan=False, ensure_ascii=False, separators=(",", ":"))
    if len(encoded) > MAX_VALUE_CHARS:
        raise ValidationError(
            f"the value for {path!r:.80} is {len(encoded)} characters as JSON; at most "
            f"{MAX_VALUE_CHARS}"
        )
    return encoded


def _check_json(value: Any, path: str, depth: int) -> None:
    """ValidationError unless ``value`` is plain JSON without NUL characters."""
    if depth > MAX_PATH_DEPTH:
        raise ValidationError(f"the value for {path!r:.80} nests deeper than {MAX_PATH_DEPTH}")
    kind = type(value)
    if value is None or kind is bool or kind is int:
        return
    if kind is float:
        if not math.isfinite(value):
            raise ValidationError(f"the value for {path!r:.80} must be finite, got {value!r}")
        return
    if kind is str:
        if "\x00" in value:
            raise ValidationError(f"the value for {path!r:.80} holds a NUL character")
        return
    if kind is list:
        for item in value:
            _check_json(item, path, depth + 1)
        return
    if kind is dict:
        for key, item in value.items():
            if type(key) is not str or "\x00" in key:
                raise ValidationError(
                    f"the value for {path!r:.80} has a key that is not a str without NUL: "
                    f"{key!r:.80}"
                )
            _check_json(item, path, depth + 1)
        return
    raise ValidationError(
        f"the value for {path!r:.80} must be JSON (dict, list, str, int, float, bool, None), "
        f"got {kind.__name__}"
    )


@dataclass(frozen=True, slots=True)
class SearchExtent:
    """How much of its window a bounded search read: ``scanned`` jobs, newest first. When
    ``cut_short``, the window holds more jobs than the search may read: it searched back to
    ``reached`` (the ``created_at`` or ``finished_at`` of the last job read) and no further;
    the page's ``older`` cursor continues from there, or a narrower window searches it all."""

    scanned: int
    cut_short: bool
    reached: dt.datetime | None

    def summary(self) -> str:
        """One line for a page or a terminal."""
        if not self.cut_short:
            return f"searched the whole window ({self.scanned} jobs)"
        back = "" if self.reached is None else f", back to {self.reached.isoformat()}"
        return (
            f"searched the newest {self.scanned} jobs of the window{back}: narrow the window, "
            "or continue with the older page"
        )


def check_window(
    since: object, until: object, time_column: object
) -> tuple[dt.datetime | None, dt.datetime | None, str]:
    """A time window's bounds (aware datetimes, ``since`` before ``until``) and the column they
    bound; ValidationError naming the problem."""
    for label, moment in (("since", since), ("until", until)):
        if moment is not None and (
            not isinstance(moment, dt.datetime) or moment.utcoffset() is None
        ):
            raise ValidationError(f"{label} must be a timezone-aware datetime, got {moment!r:.80}")
    if time_column not in TIME_COLUMNS:
        raise ValidationError(
            f"time_column must be one of {', '.join(TIME_COLUMNS)}, got {time_column!r:.80}"
        )
    assert since is None or isinstance(since, dt.datetime)
    assert until is None or isinstance(until, dt.datetime)
    if since is not None and until is not None and since >= until:
        raise ValidationError(
            f"since ({since.isoformat()}) must be before until ({until.isoformat()})"
        )
    return since, until, str(time_column)


def check_error_text(text: object) -> str | None:
    """Text to find in ``last_error``; ValidationError unless 1 to ``MAX_ERROR_TEXT``
    characters without NUL."""
    if text is not None and (
        not isinstance(text, str) or not text or "\x00" in text or len(text) > MAX_ERROR_TEXT
    ):
        raise ValidationError(
            f"error_contains must be 1 to {MAX_ERROR_TEXT} characters without NUL, got {text!r:.80}"
        )
    return text


def check_scan(scan: object) -> int:
    if not isinstance(scan, int) or isinstance(scan, bool) or not 1 <= scan <= MAX_SEARCH_SCAN:
        raise ValidationError(f"scan must be an int from 1 to {MAX_SEARCH_SCAN}, got {scan!r}")
    return scan
