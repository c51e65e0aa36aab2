"""Which jobs a bulk action (retry, cancel or delete by filter) applies to, checked before any
SQL runs.

A ``JobFilter`` names jobs by queue, task, states, a time range on ``created_at`` or
``finished_at`` and a piece of text in ``last_error``; every given field must match. Each action
applies to the states its single-job counterpart accepts (``ACTION_STATES``), and a filter without
states means all of them. An empty filter would choose every job the action can touch, so it is
refused unless it says ``all_jobs=True``.

``parse_time`` reads the times the CLI and the dashboard are given: ISO 8601 (UTC when no offset
is written) or an age such as ``90m``, ``12h`` or ``2d`` (that long before now, at most
``durations.MAX_DELAY_SECONDS``: 3650 days).
"""

from __future__ import annotations

import datetime as dt
import enum
import re
from dataclasses import dataclass, field
from typing import Any, Final

from pgqueue.durations import MAX_DELAY_SECONDS
from pgqueue.errors import ValidationError
from pgqueue.states import CANCEL, RERUN, JobState


class BulkAction(enum.StrEnum):
    """What a bulk action does to each job it matches."""

    RETRY = "retry"
    CANCEL = "cancel"
    DELETE = "delete"


# The states each action changes, as its single-job counterpart: a retry re-runs FAILED and
# CANCELLED jobs; a cancel ends waiting jobs and asks RUNNING ones to stop; a delete removes any
# job but a RUNNING one (its worker still holds it).
ACTION_STATES: Final[dict[BulkAction, frozenset[JobState]]] = {
    BulkAction.RETRY: RERUN.sources,
    BulkAction.CANCEL: CANCEL.sources | {JobState.RUNNING},
    BulkAction.DELETE: frozenset(JobState) - {JobState.RUNNING},
}
# The columns a time range may bound; ``created_at`` is the default.
TIME_COLUMNS: Final = ("created_at", "finished_at")
MAX_ERROR_TEXT: Final = 1000


@dataclass(frozen=True, slots=True)
class JobFilter:
    """The jobs a bulk action chooses: every given field must match.

    - ``queue``, ``task_name``: exact names.
    - ``states``: any of these states (empty: every state the action applies to).
    - ``since`` (inclusive) and ``until`` (exclusive): timezone-aware bounds on ``time_column``,
      ``"created_at"`` (default) or ``"finished_at"`` (a job that has not finished never
      matches a range on it).
    - ``error_contains``: text found in ``last_error``, ignoring case; ``%`` and ``_`` are
      plain characters.
    - ``all_jobs``: must be True for a filter that gives none of the above.
    """

    queue: str | None = None
    task_name: str | None = None
    states: frozenset[JobState] = field(default_factory=frozenset)
    since: dt.datetime | None = None
    until: dt.datetime | None = None
    time_column: str = "created_at"
    error_contains: str | None = None
    all_jobs: bool = False

    def __post_init__(self) -> None:
        from pgqueue import validation  # SQLAlchemy, through config: not for --help

        if self.queue is not None:
            validation.queue_name(self.queue)
        if self.task_name is not None:
            validation.task_name(self.task_name)
        object.__setattr__(self, "states", parse_states(self.states))
        for label, moment in (("since", self.since), ("until", self.until)):
            if moment is not None and (
                not isinstance(moment, dt.datetime) or moment.utcoffset() is None
            ):
                raise ValidationError(f"{label} must be a timezone-aware datetime, got {moment!r}")
        if self.since is not None and self.until is not None and self.since >= self.until:
            raise ValidationError(
                f"since ({self.since.isoformat()}) must be before until ({self.until.isoformat()})"
            )
        if self.time_column not in TIME_COLUMNS:
            raise ValidationError(
                f"time_column must be one of {', '.join(TIME_COLUMNS)}, got {self.time_column!r}"
            )
        text = self.error_contains
        if text is not None and (
            not isinstance(text, str) or not text or "\x00" in text or len(text) > MAX_ERROR_TEXT
        ):
            raise ValidationError(
                f"error_contains must be 1 to {MAX_ERROR_TEXT} characters without NUL, got "
                f"{text!r:.80}"
            )
        if not isinstance(self.all_jobs, bool):
            raise ValidationError(f"all_jobs must be a bool, got {self.all_jobs!r}")

    @property
    def is_empty(self) -> bool:
        """True when no field narrows the choice (``all_jobs`` aside)."""
        return not (
            self.queue
            or self.task_name
            or self.states
            or self.since
            or self.until
            or self.error_contains
        )

    def states_for(self, action: BulkAction) -> frozenset[JobState]:
        """The states ``action`` changes under this filter; ValidationError when the filter is
        empty without ``all_jobs``, or names a state the action does not apply to."""
        if self.is_empty and not self.all_jobs:
            raise ValidationError(
                f"refusing to {action.value} every job: give a filter (queue, task, state, time "
                "range or error text), or all_jobs=True to mean every job"
            )
        allowed = ACTION_STATES[action]
        wrong = self.states - allowed
        if wrong:
            raise ValidationError(
                f"cannot {action.value} jobs in state {', '.join(sorted(wrong))} "
                f"({action.value} applies to: {', '.join(sorted(allowed))})"
            )
        return self.states or allowed

    def as_record(self) -> dict[str, Any]:
        """The filter as JSON-ready values (the audit record's ``filter``): given fields only,
        times in ISO 8601."""
        record: dict[str, Any] = {}
        if self.queue is not None:
            record["queue"] = self.queue
        if self.task_name is not None:
            record["task_name"] = self.task_name
        if self.states:
            record["states"] = sorted(s.value for s in self.states)
        if self.since is not None or self.until is not None:
            record["time_column"] = self.time_column
        if self.since is not None:
            record["since"] = self.since.isoformat()
        if self.until is not None:
            record["until"] = self.until.isoformat()
        if self.error_contains is not None:
            record["error_contains"] = self.error_contains
        if self.all_jobs:
            record["all_jobs"] = True
        return record


def parse_states(values: Any) -> frozenset[JobState]:
    """State names or ``JobState`` members (one, or an iterable) as a set; ValidationError
    naming an unknown one."""
    if values is None:
        return frozenset()
    if isinstance(values, str):
        values = [values]
    found: set[JobState] = set()
    try:
        items = list(values)
    except TypeError:
        raise ValidationError(f"states must be state names, got {values!r}") from None
    for value in items:
        try:
            found.add(JobState(value))
        except ValueError:
            names = ", ".join(s.value for s in JobState)
            raise ValidationError(f"unknown state {value!r} (states: {names})") from None
    return frozenset(found)


_AGE: Final = re.compile(r"(\d{1,7})\s*([smhd])")
_AGE_UNITS: Final = {"s": 1, "m": 60, "h": 3600, "d": 86_400}


def parse_time(label: str, text: str, now: dt.datetime) -> dt.datetime:
    """``text`` as a moment: ISO 8601 (UTC when it has no offset) or an age before ``now``
    (``30s``, ``90m``, ``12h``, ``2d``) of at most ``MAX_DELAY_SECONDS``; ValidationError naming
    ``label`` otherwise."""
    stripped = text.strip()
    age = _AGE.fullmatch(stripped)
    if age is not None:
        seconds = int(age.group(1)) * _AGE_UNITS[age.group(2)]
        if seconds > MAX_DELAY_SECONDS:
            # Far longer ones would leave the range of datetime.
            raise ValidationError(
                f"{label} {text!r:.80} is an age over {MAX_DELAY_SECONDS // 86_400} days; give "
                "an earlier time as ISO 8601"
            )
        return now - dt.timedelta(seconds=seconds)
    try:
        moment = dt.datetime.fromisoformat(stripped)
    except ValueError:
        raise ValidationError(
            f"{label} {text!r:.80} is not a time: give ISO 8601 (2026-11-21T22:00, UTC unless an "
            "offset is given) or an age (30m, 12h, 2d)"
        ) from None
    return moment if moment.utcoffset() is not None else moment.replace(tzinfo=dt.UTC)
