"""Periodic tasks: cron schedules in a time zone, each tick enqueued exactly once.

``@pgq.periodic("*/5 * * * *", tz="Europe/Oslo")`` on top of a task registers a
:class:`Schedule`. A :class:`Scheduler` (run by every worker's maintenance loop, or on its own)
looks at the clock, works out which cron instants are due since the schedule's latest recorded
tick, and for each one inserts a row into ``pgqueue_periodic_ticks`` with ``ON CONFLICT DO
NOTHING`` and, only when that insert won, the job, in the same transaction. However many
schedulers race for a tick, the primary key (schedule name, instant) lets exactly one enqueue it;
nothing depends on timing.

Cron instants are computed with ``croniter`` on time-zone-aware datetimes (``zoneinfo``), so
daylight-saving transitions follow the zone: a daily 09:00 in New York is 14:00 UTC in winter and
13:00 UTC in summer; a time that does not exist on the spring-forward day fires at the first
valid instant after it; a time that occurs twice on the fall-back day fires once (the first),
unless the hour field is ``*`` (an hourly schedule does tick in both repeated hours).

After downtime, the schedule's ``missed`` policy applies to ticks older than ``grace`` seconds:
``"latest"`` (default) runs only the latest missed tick, ``"all"`` runs every one, ``"skip"``
runs none. "latest" and "skip" look the latest missed tick up directly (walking back from now),
so one pass settles any outage, however many ticks it spans; only "all" walks the missed ticks,
``MAX_TICKS_PER_PASS`` at a time. A tick is recorded only when it is newer than every recorded
tick of its schedule (under a per-schedule lock), so a scheduler that computed its ticks before
another one caught up can never add an older missed tick beside the newer one. The clock is injectable (``clock=``) so tests can drive hours of schedule in
milliseconds; by default it is the database's ``now()``.

An operator may pause a schedule by name (``pgq.admin.pause_schedule``, persisted in
``pgqueue_schedules``): every scheduler sees it at its next pass, and no tick of it is recorded
once the pause has committed (the tick's insert checks it under the schedule's lock). Ticks that
fall while it is paused are dropped, not caught up on resume, whatever its ``missed`` policy: a
resumed schedule's ticks start after the moment it was resumed (database clock, which an
injected ``clock`` should follow).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final, Literal
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from sqlalchemy.orm import Session, sessionmaker

from pgqueue import uow, validation
from pgqueue.data import control as control_data
from pgqueue.data import schedules as schedules_data
from pgqueue.db import executor_for
from pgqueue.errors import QueueFull, ValidationError, pgqueue_logger

if TYPE_CHECKING:
    from pgqueue.tasks import Task

log = pgqueue_logger("pgqueue.scheduler")

MissedPolicy = Literal["latest", "all", "skip"]
MISSED_POLICIES: Final = ("latest", "all", "skip")
UTC: Final = dt.UTC
# Ticks enqueued per schedule and pass at most, so a per-second schedule after a week offline
# with missed="all" catches up in bounded steps instead of one enormous transaction.
MAX_TICKS_PER_PASS: Final = 1000


@dataclass(frozen=True, slots=True)
class Schedule:
    """One periodic task: a cron expression in a time zone, with the job's arguments."""

    name: str
    cron: str
    task: Task[Any, Any]
    tz: ZoneInfo
    args: tuple[Any, ...] = ()
    kwargs: Mapping[str, Any] = field(default_factory=dict)
    missed: MissedPolicy = "latest"

    @classmethod
    def create(
        cls,
        cron: str,
        task: Task[Any, Any],
        *,
        tz: str | ZoneInfo = "UTC",
        name: str | None = None,
        args: Sequence[Any] = (),
        kwargs: Mapping[str, Any] | None = None,
        missed: str = "latest",
    ) -> Schedule:
        """Validate everything before anything is registered."""
        # croniter is imported where a cron expression is read (here and below), not with
        # this module: ``PgQueue`` imports it, and an application without schedules, or a
        # command such as ``pgqueue stats``, never needs croniter.
        from croniter import croniter

        if not isinstance(cron, str) or not croniter.is_valid(cron):
            raise ValidationError(f"invalid cron expression {cron!r}")
        if missed not in MISSED_POLICIES:
            raise ValidationError(f"missed must be one of {MISSED_POLICIES}, got {missed!r}")
        if isinstance(tz, str):
            try:
                zone = ZoneInfo(tz)
            except (ZoneInfoNotFoundError, ValueError):
                raise ValidationError(f"unknown time zone {tz!r}") from None
        elif isinstance(tz, ZoneInfo):
            zone = tz
        else:
            raise ValidationError(f"tz must be a zone name or ZoneInfo, got {tz!r}")
        schedule_name = name or task.name
        if not isinstance(schedule_name, str) or not schedule_name or len(schedule_name) > 200:
            raise ValidationError(f"schedule name must be 1-200 characters, got {name!r}")
        kw = dict(kwargs or {})
        task.check_arguments(list(args), kw)
        return cls(schedule_name, cron, task, zone, tuple(args), kw, missed)  # type: ignore[arg-type]

    def ticks_between(
        self, after: dt.datetime, until: dt.datetime, limit: int = MAX_TICKS_PER_PASS
    ) -> list[dt.datetime]:
        """Cron instants in ``(after, until]``, in UTC, oldest first; the first ``limit``."""
        from croniter import croniter

        local_after = after.astimezone(self.tz)
        iterator = croniter(self.cron, local_after)
        hourly = self.cron.split()[1] == "*"
        ticks: list[dt.datetime] = []
        previous_wall = local_after.replace(tzinfo=None, fold=0)
        while True:
            local: dt.datetime = iterator.get_next(dt.datetime)
            instant = local.astimezone(UTC)
            if instant > until:
                return ticks
            wall = local.replace(tzinfo=None, fold=0)
            # The fall-back hour repeats wall times; a fixed-hour schedule runs once in it.
            if not hourly and wall == previous_wall:
                continue
            previous_wall = wall
            if instant > after:
                ticks.append(instant)
            if len(ticks) >= limit:
                return ticks

    def latest_between(self, after: dt.datetime, until: dt.datetime) -> dt.datetime | None:
        """The latest cron instant in ``(after, until]`` (UTC), or None, without walking the
        instants before it: a month of per-second ticks costs a few steps."""
        from croniter import croniter

        iterator = croniter(self.cron, (until + dt.timedelta(seconds=1)).astimezone(self.tz))
        start = after
        behind = 0
        while True:
            instant = iterator.get_prev(dt.datetime).astimezone(UTC)
            if instant <= after:
                break
            if instant <= until:
                behind += 1
                # A few instants back, the forward walk from there applies the same
                # fall-back rule as ``ticks_between`` from ``after`` would.
                if behind == 3:
                    start = instant
                    break
        ticks = self.ticks_between(start, until)
        return ticks[-1] if ticks else None

    def next_after(self, moment: dt.datetime) -> dt.datetime:
        """The first cron instant after ``moment`` (UTC)."""
        return self.ticks_between(moment, moment + dt.timedelta(days=400), limit=1)[0]


class Scheduler:
    """Enqueues due ticks of ``schedules``; safe to run in any number of processes.

    ``sessions`` opens sessions on the jobs database; ``schedules`` (by name) is read on every
    pass, so schedules registered later are picked up. ``clock`` returns an aware datetime
    (default: the database's ``now()``). ``grace`` is how late a tick may be and still count as
    on time rather than missed: seconds (or a ``timedelta``) from 0 to
    ``validation.MAX_DELAY_SECONDS``; ``ValidationError`` otherwise.
    """

    def __init__(
        self,
        sessions: sessionmaker[Session],
        schedules: Mapping[str, Schedule],
        *,
        clock: Callable[[], dt.datetime] | None = None,
        grace: float | dt.timedelta = 60.0,
    ) -> None:
        self.sessions = sessions
        self.schedules = schedules
        self.clock = clock
        self.grace = dt.timedelta(seconds=validation.bounded_seconds(grace, "grace"))
        # Where a schedule never ticked before starts: the first time this scheduler saw it, so a
        # new schedule does not replay its whole past.
        self._first_seen: dict[str, dt.datetime] = {}

    def now(self) -> dt.datetime:
        if self.clock is not None:
            value = self.clock()
            if value.tzinfo is None:
                raise ValidationError("the scheduler clock must return aware datetimes")
            return value.astimezone(UTC)
        return uow.read(self.sessions, control_data.database_now).astimezone(UTC)

    def run_pending(self) -> list[int]:
        """Enqueue every due tick of every schedule; return the ids of jobs this call created."""
        schedules = list(self.schedules.values())
        if not schedules:
            return []
        now = self.now()
        names = [s.name for s in schedules]
        last, switches = uow.read(
            self.sessions,
            lambda ex: (control_data.last_ticks(ex, names), schedules_data.switches(ex)),
        )
        created: list[int] = []
        for schedule in schedules:
            since = last.get(schedule.name) or self._first_seen.setdefault(schedule.name, now)
            switch = switches.get(schedule.name)
            if switch is not None:
                if switch.paused:
                    continue
                # Resumed: the ticks that fell while it was paused are dropped, not caught up.
                since = max(since, switch.changed_at.astimezone(UTC))
            run, dropped = self._due(schedule, since, now)
            for instant in run:
                job_id = self._enqueue_tick(schedule, instant)
                if job_id is not None:
                    created.append(job_id)
            if dropped is not None:
                # Record the newest dropped tick (without a job) so the next pass starts there.
                self._record_dropped(schedule.name, dropped)
        return created

    def _due(
        self, schedule: Schedule, since: dt.datetime, now: dt.datetime
    ) -> tuple[list[dt.datetime], dt.datetime | None]:
        """The ticks to enqueue now, and the newest tick dropped without a job (or None)."""
        # Ticks before ``missed_before`` are missed; ``now - tick == grace`` is still on time.
        missed_before = now - self.grace - dt.timedelta(microseconds=1)
        if schedule.missed == "all" or since >= missed_before:
            return schedule.ticks_between(since, now), None
        latest_missed = schedule.latest_between(since, missed_before)
        # Walked on from a real tick, not from ``missed_before``, so the fall-back rule sees the
        # tick before: the repeated 01:30 of a daily 01:30 stays skipped.
        on_time = schedule.ticks_between(latest_missed or since, now)
        if on_time or latest_missed is None:
            # An on-time tick stands for the missed ones under both "latest" and "skip".
            return on_time, None
        if schedule.missed == "latest":
            return [latest_missed], None
        return [], latest_missed

    def _record_dropped(self, name: str, instant: dt.datetime) -> None:
        uow.run_in_transaction(
            self.sessions,
            lambda session: control_data.record_tick(executor_for(session), name, instant),
        )

    def _enqueue_tick(self, schedule: Schedule, instant: dt.datetime) -> int | None:
        def work(session: Session) -> int | None:
            if not control_data.record_tick(executor_for(session), schedule.name, instant):
                return None  # another scheduler enqueued this tick
            job_id = schedule.task.configure(session=session).enqueue(
                *schedule.args, **schedule.kwargs
            )
            control_data.set_tick_job(executor_for(session), schedule.name, instant, job_id)
            return job_id

        try:
            job_id = uow.run_in_transaction(self.sessions, work)
        except QueueFull as exc:
            # Its bounded queue is full: nothing of the tick was recorded, so a later pass tries
            # it again (late by then, it follows the schedule's ``missed`` policy).
            log.warning("schedule %s: tick %s not enqueued: %s", schedule.name, instant, exc)
            return None
        if job_id is not None:
            log.info("schedule %s: tick %s enqueued as job %s", schedule.name, instant, job_id)
        return job_id


def describe(schedules: Sequence[Schedule], now: dt.datetime) -> list[dict[str, Any]]:
    """Rows for ``pgqueue schedules``: name, cron, zone, task, policy and next run (UTC and
    local)."""
    rows = []
    for schedule in sorted(schedules, key=lambda s: s.name):
        upcoming = schedule.next_after(now)
        rows.append(
            {
                "name": schedule.name,
                "cron": schedule.cron,
                "tz": schedule.tz.key,
                "task": schedule.task.name,
                "missed": schedule.missed,
                "next_run_utc": upcoming,
                "next_run_local": upcoming.astimezone(schedule.tz),
            }
        )
    return rows
