"""Periodic tasks: exactly one job per tick however many schedulers run, missed-tick policies,
and daylight-saving transitions that follow the schedule's time zone.

The clock is injected, so an hour of a per-second schedule takes no wall time to simulate.
"""

from __future__ import annotations

import datetime as dt
import threading
from contextlib import ExitStack
from zoneinfo import ZoneInfo

import pytest
from click.testing import CliRunner
from sqlalchemy import func, select
from support.polling import wait_until
from support.workers import in_thread

from pgqueue import JobState, PgQueue, ValidationError
from pgqueue.db import executor_for
from pgqueue.models import Job, PeriodicTick
from pgqueue.scheduler import Schedule, Scheduler
from pgqueue.worker import Worker

UTC = dt.UTC


class FakeClock:
    """A clock shared by several schedulers, advanced by the test."""

    def __init__(self, start: dt.datetime) -> None:
        self.now = start
        self._lock = threading.Lock()

    def __call__(self) -> dt.datetime:
        with self._lock:
            return self.now

    def advance(self, seconds: float) -> None:
        with self._lock:
            self.now += dt.timedelta(seconds=seconds)


def _count(pgq: PgQueue, model: type, **where: object) -> int:
    with pgq.sessions() as session:
        stmt = select(func.count()).select_from(model)
        for key, value in where.items():
            stmt = stmt.where(getattr(model, key) == value)
        return int(session.scalar(stmt) or 0)


@pytest.mark.slow
def test_four_schedulers_for_a_simulated_hour_enqueue_one_job_per_tick(pgq: PgQueue) -> None:
    @pgq.periodic("* * * * * */10", name="every_10s")  # croniter's 6th field: seconds
    @pgq.task(name="beat")
    def beat() -> None:
        return None

    @pgq.periodic("* * * * *", name="every_minute", args=[7])
    @pgq.task(name="minutely")
    def minutely(n: int) -> None:
        return None

    start = dt.datetime(2025, 6, 1, 12, 0, 0, 500_000, tzinfo=UTC)
    clock = FakeClock(start)
    schedulers = [Scheduler(pgq.sessions, pgq.schedules, clock=clock) for _ in range(4)]
    created: list[int] = []
    lock = threading.Lock()

    def run_all() -> None:
        barrier = threading.Barrier(len(schedulers))

        def one(scheduler: Scheduler) -> None:
            barrier.wait(timeout=30)
            ids = scheduler.run_pending()
            with lock:
                created.extend(ids)

        threads = [threading.Thread(target=one, args=(s,)) for s in schedulers]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=60)

    run_all()  # first sight of the schedules: nothing is replayed from before
    assert created == []
    # One simulated hour in 10-second steps, all four schedulers racing at every step.
    for _ in range(360):
        clock.advance(10)
        run_all()
    assert len(created) == len(set(created))
    assert _count(pgq, Job, task_name="beat") == 360
    assert _count(pgq, Job, task_name="minutely") == 60
    assert _count(pgq, PeriodicTick, schedule_name="every_10s") == 360
    assert len(created) == 420
    with pgq.sessions() as session:
        ticks = session.scalars(
            select(PeriodicTick.scheduled_at)
            .where(PeriodicTick.schedule_name == "every_minute")
            .order_by(PeriodicTick.scheduled_at)
        ).all()
        args = session.scalars(select(Job.args).where(Job.task_name == "minutely")).all()
    assert ticks[0] == dt.datetime(2025, 6, 1, 12, 1, tzinfo=UTC)
    assert ticks[-1] == dt.datetime(2025, 6, 1, 13, 0, tzinfo=UTC)
    assert args == [[7]] * 60


def test_new_york_daylight_saving_days(pgq: PgQueue) -> None:
    @pgq.task(name="ny_report")
    def ny_report() -> None:
        return None

    daily = Schedule.create("30 1 * * *", ny_report, tz="America/New_York", name="d1")
    hourly = Schedule.create("0 * * * *", ny_report, tz="America/New_York", name="h")
    early = Schedule.create("30 2 * * *", ny_report, tz="America/New_York", name="d2")

    def utc(*parts: int) -> dt.datetime:
        return dt.datetime(*parts, tzinfo=UTC)

    # Spring forward, 2025-03-09: 02:00 EST jumps to 03:00 EDT.
    spring = (utc(2025, 3, 8, 12), utc(2025, 3, 10, 12))
    assert daily.ticks_between(*spring) == [
        utc(2025, 3, 9, 6, 30),  # 01:30 EST (UTC-5)
        utc(2025, 3, 10, 5, 30),  # 01:30 EDT (UTC-4)
    ]
    assert early.ticks_between(*spring) == [
        utc(2025, 3, 9, 7, 0),  # 02:30 does not exist that day: first valid instant, 03:00 EDT
        utc(2025, 3, 10, 6, 30),
    ]
    assert hourly.ticks_between(utc(2025, 3, 9, 5, 30), utc(2025, 3, 9, 8, 30)) == [
        utc(2025, 3, 9, 6),  # 01:00 EST
        utc(2025, 3, 9, 7),  # 03:00 EDT (02:00 never happened)
        utc(2025, 3, 9, 8),  # 04:00 EDT
    ]
    # Fall back, 2025-11-02: 02:00 EDT goes back to 01:00 EST; 01:30 happens twice.
    fall = (utc(2025, 11, 1, 12), utc(2025, 11, 3, 12))
    assert daily.ticks_between(*fall) == [
        utc(2025, 11, 2, 5, 30),  # 01:30 EDT, the first one only
        utc(2025, 11, 3, 6, 30),  # 01:30 EST
    ]
    assert hourly.ticks_between(utc(2025, 11, 2, 4, 30), utc(2025, 11, 2, 7, 30)) == [
        utc(2025, 11, 2, 5),  # 01:00 EDT
        utc(2025, 11, 2, 6),  # 01:00 EST: an hourly schedule ticks in both repeated hours
        utc(2025, 11, 2, 7),  # 02:00 EST
    ]
    # The same rule holds across scheduler passes that stop right after the first 01:30.
    assert daily.ticks_between(utc(2025, 11, 2, 5, 30), utc(2025, 11, 2, 7)) == []

    # And through the database: a scheduler driven across the fall-back night.
    pgq.periodic("30 1 * * *", tz="America/New_York", name="nightly")(ny_report)
    clock = FakeClock(utc(2025, 11, 1, 12))
    scheduler = Scheduler(pgq.sessions, pgq.schedules, clock=clock)
    scheduler.run_pending()
    for _ in range(48):
        clock.advance(1800)
        scheduler.run_pending()
    with pgq.sessions() as session:
        ticks = session.scalars(
            select(PeriodicTick.scheduled_at).where(PeriodicTick.schedule_name == "nightly")
        ).all()
    assert sorted(ticks) == [utc(2025, 11, 2, 5, 30)]


def _policy_run(pgq: PgQueue, missed: str) -> list[dt.datetime]:
    @pgq.task(name=f"policy_{missed}")
    def task() -> None:
        return None

    pgq.periodic("*/5 * * * *", name=f"p_{missed}", missed=missed)(task)
    clock = FakeClock(dt.datetime(2025, 1, 1, 0, 0, 30, tzinfo=UTC))
    scheduler = Scheduler(pgq.sessions, pgq.schedules, clock=clock, grace=60)
    scheduler.run_pending()
    clock.advance(300)  # 00:05:30: the 00:05 tick is on time
    scheduler.run_pending()
    # Downtime: nothing runs from 00:05:30 to 00:31:30 (ticks 00:10 ... 00:30 are missed).
    clock.advance(1560)
    later = Scheduler(
        pgq.sessions, pgq.schedules, clock=clock, grace=60
    )  # a fresh process after the outage
    later.run_pending()
    clock.advance(240)  # 00:35:30: on time again
    later.run_pending()
    with pgq.sessions() as session:
        return list(
            session.scalars(
                select(PeriodicTick.scheduled_at)
                .where(
                    PeriodicTick.schedule_name == f"p_{missed}", PeriodicTick.job_id.is_not(None)
                )
                .order_by(PeriodicTick.scheduled_at)
            )
        )


def _at(minute: int) -> dt.datetime:
    return dt.datetime(2025, 1, 1, 0, minute, tzinfo=UTC)


def test_missed_latest_runs_the_latest_missed_tick_once(pgq: PgQueue) -> None:
    assert _policy_run(pgq, "latest") == [_at(5), _at(30), _at(35)]


def test_missed_all_runs_every_missed_tick(pgq: PgQueue) -> None:
    assert _policy_run(pgq, "all") == [_at(m) for m in (5, 10, 15, 20, 25, 30, 35)]


def test_missed_skip_runs_none_of_them(pgq: PgQueue) -> None:
    assert _policy_run(pgq, "skip") == [_at(5), _at(35)]


def test_scheduled_jobs_run_and_cli_lists_schedules(pgq: PgQueue, tmp_path: object) -> None:
    ran: list[str] = []

    @pgq.periodic("0 9 * * 1-5", tz="Europe/Oslo", name="morning", kwargs={"who": "oslo"})
    @pgq.task(name="greet")
    def greet(who: str) -> None:
        ran.append(who)

    clock = FakeClock(dt.datetime(2025, 1, 6, 7, 59, tzinfo=UTC))  # Monday 08:59 in Oslo
    scheduler = Scheduler(pgq.sessions, pgq.schedules, clock=clock)
    assert scheduler.run_pending() == []
    clock.advance(120)
    (job_id,) = scheduler.run_pending()
    stats = pgq.run_worker(drain=True, concurrency=1)
    assert stats.succeeded == 1
    assert ran == ["oslo"]
    assert pgq.get_job(job_id).state is JobState.SUCCEEDED
    assert pgq.schedules["morning"].next_after(clock()) == dt.datetime(2025, 1, 7, 8, 0, tzinfo=UTC)

    import sys
    import types

    from pgqueue import cli

    module = types.ModuleType("schedules_app_for_cli")
    module.pgq = pgq  # type: ignore[attr-defined]
    sys.modules[module.__name__] = module
    try:
        result = CliRunner().invoke(cli.main, ["schedules", f"{module.__name__}:pgq"])
    finally:
        del sys.modules[module.__name__]
    assert result.exit_code == 0, result.output
    assert "morning" in result.output
    assert "0 9 * * 1-5" in result.output
    assert "Europe/Oslo" in result.output


def test_bad_schedules_are_refused_before_anything_runs(pgq: PgQueue) -> None:
    @pgq.task(name="target")
    def target(n: int) -> None:
        return None

    with pytest.raises(ValidationError):
        pgq.periodic("not cron", args=[1])(target)
    with pytest.raises(ValidationError):
        pgq.periodic("* * * * *", tz="Mars/Olympus", args=[1])(target)
    with pytest.raises(ValidationError):
        pgq.periodic("* * * * *", missed="sometimes", args=[1])(target)
    with pytest.raises(ValidationError):
        pgq.periodic("* * * * *")(target)  # missing argument n
    with pytest.raises(ValidationError):
        pgq.periodic("* * * * *", args=[1])(lambda: None)  # type: ignore[arg-type]
    pgq.periodic("* * * * *", args=[1])(target)
    with pytest.raises(ValidationError):
        pgq.periodic("*/2 * * * *", args=[1])(target)  # same default name
    assert list(pgq.schedules) == ["target"]
    assert isinstance(pgq.schedules["target"].tz, ZoneInfo)


def test_workers_run_the_scheduler_in_their_maintenance_loop(pgq: PgQueue) -> None:
    @pgq.periodic("* * * * * *", name="every_second")  # seconds field: every second
    @pgq.task(name="pulse")
    def pulse() -> None:
        return None

    with ExitStack() as workers:
        for _ in range(3):
            workers.enter_context(in_thread(Worker(pgq, concurrency=1)))
        wait_until(
            lambda: _count(pgq, PeriodicTick, schedule_name="every_second") >= 3,
            30,
            "three ticks from the workers' maintenance loops",
            interval=0.1,
        )
    with pgq.sessions() as session:
        ticks = session.scalars(select(PeriodicTick.scheduled_at)).all()
        jobs = session.scalar(select(func.count()).select_from(Job).where(Job.task_name == "pulse"))
    assert len(ticks) == len(set(ticks))
    assert jobs == len(ticks)


def _month_offline(
    pgq: PgQueue, missed: str
) -> tuple[list[dt.datetime], dt.datetime, Scheduler, FakeClock]:
    """A per-minute schedule ticks once on time, then every scheduler is down for 30 days; three
    fresh schedulers come back together, pass after pass. Returns the ticks that got a job
    after the first one, the latest tick missed during the outage, a scheduler and the clock."""

    @pgq.task(name=f"month_{missed}")
    def task() -> None:
        return None

    pgq.periodic("* * * * *", name=f"m_{missed}", missed=missed)(task)
    clock = FakeClock(dt.datetime(2025, 1, 1, 0, 0, 30, tzinfo=UTC))
    before = Scheduler(pgq.sessions, pgq.schedules, clock=clock, grace=10)
    before.run_pending()
    clock.advance(35)  # 00:01:05: the 00:01 tick is on time
    assert len(before.run_pending()) == 1
    clock.advance(30 * 86400 + 30)  # 2025-01-31 00:01:35: every tick up to 00:01 is missed
    schedulers = [Scheduler(pgq.sessions, pgq.schedules, clock=clock, grace=10) for _ in range(3)]
    created: list[int] = []
    lock = threading.Lock()
    barrier = threading.Barrier(len(schedulers))

    def one(scheduler: Scheduler) -> None:
        barrier.wait(timeout=30)
        for _ in range(3):
            ids = scheduler.run_pending()
            with lock:
                created.extend(ids)

    threads = [threading.Thread(target=one, args=(s,)) for s in schedulers]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert len(created) == len(set(created))
    with pgq.sessions() as session:
        ticks = list(
            session.scalars(
                select(PeriodicTick.scheduled_at)
                .where(
                    PeriodicTick.schedule_name == f"m_{missed}",
                    PeriodicTick.job_id.is_not(None),
                    PeriodicTick.scheduled_at > dt.datetime(2025, 1, 1, 0, 1, tzinfo=UTC),
                )
                .order_by(PeriodicTick.scheduled_at)
            )
        )
    return ticks, dt.datetime(2025, 1, 31, 0, 1, tzinfo=UTC), schedulers[0], clock


def _next_minute_tick(pgq: PgQueue, scheduler: Scheduler, clock: FakeClock) -> list[dt.datetime]:
    """The ticks one more pass enqueues at 00:02:05, when the 00:02 tick is on time."""
    clock.advance(30)
    ids = scheduler.run_pending()
    with pgq.sessions() as session:
        return list(
            session.scalars(select(PeriodicTick.scheduled_at).where(PeriodicTick.job_id.in_(ids)))
        )


def test_missed_latest_after_a_month_offline_runs_one_job(pgq: PgQueue) -> None:
    ticks, latest_missed, scheduler, clock = _month_offline(pgq, "latest")
    assert ticks == [latest_missed]
    # Back on schedule: the next minute's tick is on time and runs.
    assert _next_minute_tick(pgq, scheduler, clock) == [latest_missed + dt.timedelta(minutes=1)]
    assert _count(pgq, Job, task_name="month_latest") == 3  # before, the latest missed, on time


def test_missed_skip_after_a_month_offline_runs_none(pgq: PgQueue) -> None:
    ticks, latest_missed, scheduler, clock = _month_offline(pgq, "skip")
    assert ticks == []
    assert _next_minute_tick(pgq, scheduler, clock) == [latest_missed + dt.timedelta(minutes=1)]
    assert _count(pgq, Job, task_name="month_skip") == 2  # before, on time


def test_a_tick_older_than_the_schedules_latest_is_never_recorded(pgq: PgQueue) -> None:
    from pgqueue import uow
    from pgqueue.data import control as control_data

    def record(at: dt.datetime) -> bool:
        return uow.run_in_transaction(
            pgq.sessions,
            lambda session: control_data.record_tick(executor_for(session), "stale", at),
        )

    # A scheduler that read the latest tick before another one caught up must not add an older
    # missed tick beside the newer one.
    assert record(_at(30)) is True
    assert record(_at(30)) is False
    assert record(_at(25)) is False
    assert record(_at(35)) is True
    assert _count(pgq, PeriodicTick, schedule_name="stale") == 2
