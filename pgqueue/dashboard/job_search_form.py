"""The job list's search form: its fields read from the query string (so a search is a link),
checked, and turned into ``pgq.admin.list_jobs``'s arguments.

Times are UTC, as the form's ``datetime-local`` inputs say (an offset typed into the text is
honoured). An error or JSON search needs a time window (``pgqueue.job_search``): without a
``since``, the form searches the last ``DEFAULT_WINDOW`` and shows that ``since`` in its input,
so the link of the answer names the window it searched.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from pgqueue.admin import MAX_JOB_ID, JsonMatch
from pgqueue.errors import ValidationError
from pgqueue.job_filter import TIME_COLUMNS
from pgqueue.states import JobState

DEFAULT_WINDOW: Final = dt.timedelta(hours=24)
# The query-string names of the form's fields, in the order links carry them.
# ``scan`` has no input: a link may set how many jobs of the window a search reads.
FIELDS: Final = (
    "id",
    "task",
    "queue",
    "state",
    "since",
    "until",
    "time",
    "error",
    "json",
    "match",
    "scan",
)
MATCH_KINDS: Final = ("equals", "contains")
MAX_FIELD: Final = 10_000


@dataclass
class SearchForm:
    """The form's values as typed (``values``, for the inputs and the links) and, once
    ``checked``, ``list_jobs``'s arguments (``arguments``); ``defaulted`` when the window was
    chosen for the user."""

    values: dict[str, str]
    arguments: dict[str, Any] = field(default_factory=dict)
    defaulted: bool = False

    @classmethod
    def read(cls, args: Mapping[str, str]) -> SearchForm:
        """The form's fields from the query string; empty ones left out."""
        return cls({name: args[name].strip() for name in FIELDS if (args.get(name) or "").strip()})

    def check(self, now: dt.datetime) -> None:
        """Fill ``arguments`` from ``values``; ValidationError naming the first bad field,
        before any SQL runs."""
        values = self.values
        for name, text in values.items():
            if "\x00" in text:
                raise ValidationError(f"{name} must not contain a NUL character")
            if len(text) > MAX_FIELD:
                raise ValidationError(f"{name} must be at most {MAX_FIELD} characters")
        arguments: dict[str, Any] = {
            "queue": values.get("queue"),
            "task_name": values.get("task"),
        }
        if "state" in values:
            try:
                arguments["state"] = JobState(values["state"])
            except ValueError:
                raise ValidationError(f"unknown state {values['state']!r:.80}") from None
        if "id" in values:
            arguments["job_id"] = _job_id(values["id"])
        time_column = values.get("time", "created_at")
        if time_column not in TIME_COLUMNS:
            raise ValidationError(
                f"time must be one of {', '.join(TIME_COLUMNS)}, got {time_column!r:.80}"
            )
        arguments["time_column"] = time_column
        since = parse_moment(values["since"], "since") if "since" in values else None
        until = parse_moment(values["until"], "until") if "until" in values else None
        if "error" in values:
            arguments["error_contains"] = values["error"]
        if "json" in values:
            kind = values.get("match", "equals")
            if kind not in MATCH_KINDS:
                raise ValidationError(f"match must be equals or contains, got {kind!r:.80}")
            arguments["json_match"] = JsonMatch.parse(values["json"], contains=kind == "contains")
        elif "match" in values:
            del values["match"]  # no JSON to match: nothing for the link to carry
        if since is None and ("error" in values or "json" in values):
            since = (until or now).astimezone(dt.UTC).replace(microsecond=0) - DEFAULT_WINDOW
            values["since"] = local_input(since)
            self.defaulted = True
        arguments["since"], arguments["until"] = since, until
        if "scan" in values:
            arguments["scan"] = _whole(values["scan"], "scan")
        self.arguments = arguments


def local_input(moment: dt.datetime) -> str:
    """``moment`` as a ``datetime-local`` input's value, in UTC."""
    return moment.astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%S")


def parse_moment(text: str, label: str) -> dt.datetime:
    """A time typed into a form: ISO 8601, UTC unless it names an offset; ValidationError
    naming ``label`` otherwise."""
    try:
        moment = dt.datetime.fromisoformat(text)
    except ValueError:
        raise ValidationError(
            f"{label} must be a date and time in UTC like 2026-11-21T22:00, got {text!r:.80}"
        ) from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=dt.UTC)
    return moment


def _whole(text: str, label: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise ValidationError(f"{label} must be a whole number, got {text!r:.80}") from None


def _job_id(text: str) -> int:
    try:
        value = int(text.lstrip("#"))
    except ValueError:
        raise ValidationError(f"id must be a job id (a whole number), got {text!r:.80}") from None
    if not 1 <= value <= MAX_JOB_ID:
        raise ValidationError(f"id must be a job id from 1 to {MAX_JOB_ID}, got {value}")
    return value
