"""The values of the operations the dashboard acts and reads through (``admin_edits``,
``admin_schedules``): the audit log's entries, the schedules' listing, and the checks of those
operations' arguments that run before any SQL. Pure; ``pgqueue.admin`` re-exports the names of
``__all__``.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import Any, Final

from pgqueue import validation
from pgqueue.admin_values import (
    AUDIT_SOURCES,
    MAX_JOB_ID,
    MAX_PAGE_SIZE,
    check_actor,
    default_actor,
)
from pgqueue.errors import ValidationError

__all__ = ["DEFAULT_AUDIT_PAGE", "AuditEntry", "AuditPage", "ScheduleInfo"]

DEFAULT_AUDIT_PAGE: Final = 50
# The audited switches of a queue or of the concurrency keys (``admin_queues``): their record
# names the queue (``{"queue": ...}``) or the keys' prefix (``{"key_prefix": ...}``).
SWITCH_ACTIONS: Final = frozenset(
    {
        "pause_queue",
        "resume_queue",
        "set_queue_limit",
        "set_queue_max_depth",
        "set_key_limit",
        "set_rate_limit",
    }
)
# A schedule's name as ``Schedule.create`` accepts it.
MAX_SCHEDULE_NAME: Final = 200


@dataclass(frozen=True, slots=True)
class AuditEntry:
    """One audited action: ``action`` (``retry``, ``cancel``, ``delete`` (of a bulk filter or
    one job), ``signal``, ``reschedule``, ``run_now``, ``set_priority``, ``pause_schedule``,
    ``resume_schedule``, ``run_schedule``, or a switch of ``SWITCH_ACTIONS``) taken at ``at``
    (database clock) by ``actor`` from ``source`` (``api``, ``cli``, ``dashboard``) on
    ``target``: a bulk action's filter, or ``{"job_id": ...}`` / ``{"schedule": ...}`` /
    ``{"queue": ...}`` / ``{"key_prefix": ...}`` with the values the action wrote; it changed
    ``count`` jobs (1 for an action on one job, schedule, queue or key prefix)."""

    id: int
    at: dt.datetime
    actor: str
    source: str
    action: str
    target: dict[str, Any]
    count: int

    @property
    def job_id(self) -> int | None:
        """The job acted on, for an action on one job."""
        value = self.target.get("job_id")
        return value if isinstance(value, int) else None

    @property
    def queue(self) -> str | None:
        """The queue a switch was thrown on (a bulk action's filter may name a queue too:
        that is not this)."""
        value = self.target.get("queue") if self.action in SWITCH_ACTIONS else None
        return value if isinstance(value, str) else None

    @property
    def key_prefix(self) -> str | None:
        """The concurrency keys' prefix a switch was thrown on."""
        value = self.target.get("key_prefix") if self.action in SWITCH_ACTIONS else None
        return value if isinstance(value, str) else None


@dataclass(frozen=True, slots=True)
class AuditPage:
    """A page of the audit log, newest first; ``older`` is the ``before=`` of the next (older)
    page, None when there is none."""

    entries: tuple[AuditEntry, ...]
    older: int | None


@dataclass(frozen=True, slots=True)
class ScheduleInfo:
    """A periodic schedule as the code defines it and the database records it.

    ``defined`` is false for a name the database knows (ticks, a pause) that no schedule of
    this code has any more: ``cron``, ``zone``, ``task``, ``missed`` and ``next_tick`` are None
    then. ``next_tick`` is the next cron instant (UTC) after the database's clock, whether or
    not the schedule is paused; ``last_tick`` the latest tick recorded (UTC; enqueued, or
    dropped as missed), None when it never ticked.
    """

    name: str
    defined: bool
    cron: str | None
    zone: str | None
    task: str | None
    missed: str | None
    next_tick: dt.datetime | None
    last_tick: dt.datetime | None
    last_job_id: int | None
    paused: bool


def checked_actor(actor: object, source: object) -> tuple[str, str]:
    """``check_actor`` with ``default_actor()`` for a None actor."""
    return check_actor(default_actor() if actor is None else actor, source)


def audit_source(source: object) -> str:
    """Where an action is taken, as its audit record says: one of ``AUDIT_SOURCES``."""
    if source not in AUDIT_SOURCES:
        raise ValidationError(f"source must be one of {', '.join(AUDIT_SOURCES)}, got {source!r}")
    return str(source)


def reschedule_time(value: object) -> dt.datetime:
    """A job's new ``run_at``: an aware datetime within ``validation.MAX_DELAY_SECONDS`` of
    now, either way (a past one means now)."""
    if value is None:
        raise ValidationError("run_at must be a datetime (use run_now for now)")
    checked = validation.run_at(value)
    assert checked is not None
    return checked


def schedule_name(value: object) -> str:
    """A schedule's name: 1 to 200 characters without NUL."""
    if not isinstance(value, str) or not value or "\x00" in value:
        raise ValidationError(f"schedule name must be a non-empty str without NUL, got {value!r}")
    if len(value) > MAX_SCHEDULE_NAME:
        raise ValidationError(f"schedule name must be at most {MAX_SCHEDULE_NAME} characters")
    return value


def audit_page_arguments(limit: object, before: object) -> tuple[int, int | None]:
    """``audit_log``'s ``limit`` (1 to ``MAX_PAGE_SIZE``) and ``before`` (a record id, or
    None)."""
    if not isinstance(limit, int) or isinstance(limit, bool) or not 1 <= limit <= MAX_PAGE_SIZE:
        raise ValidationError(f"limit must be an int from 1 to {MAX_PAGE_SIZE}, got {limit!r}")
    if before is not None and (
        not isinstance(before, int) or isinstance(before, bool) or not 0 <= before <= MAX_JOB_ID
    ):
        raise ValidationError(f"before must be an audit record id, got {before!r}")
    return limit, before
