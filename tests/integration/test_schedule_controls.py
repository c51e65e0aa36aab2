"""Operators' controls of periodic schedules (``pgq.admin.pause_schedule``, ``resume_schedule``,
``run_schedule_now``, ``schedules``) and ``pgqueue schedules pause|resume|run``: a paused
schedule enqueues nothing, its ticks that fell while paused are dropped on resume, a schedule
run now is one job and no tick, each action has its audit row, and the listing names the
schedules only the database still knows.

The schedulers' clock is injected, set from the database's clock (a resume counts from the
database's ``now()``), so minutes of schedule take no wall time.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import sys
import types
from collections.abc import Iterator

import pytest
from click.testing import CliRunner
from sqlalchemy import Engine, func, select, text
from sqlalchemy.orm import Session
from support.audit import audit_rows

from pgqueue import PgQueue, ValidationError, cli, uow
from pgqueue.admin import ScheduleInfo, default_actor
from pgqueue.data import control as control_data
from pgqueue.db import executor_for
from pgqueue.errors import ScheduleNotFound
from pgqueue.models import Job, PeriodicTick
from pgqueue.scheduler import Scheduler

UTC = dt.UTC


class Clock:
    """A clock the test sets."""

    def __init__(self, now: dt.datetime) -> None:
        self.now = now

    def __call__(self) -> dt.datetime:
        return self.now


def _db_now(engine: Engine) -> dt.datetime:
    with engine.connect() as connection:
        now: dt.datetime = connection.execute(text("SELECT now()")).scalar_one()
        return now.astimezone(UTC)


def _ticks(engine: Engine, name: str) -> list[tuple[dt.datetime, int | None]]:
    with Session(engine) as session:
        rows = session.execute(
            select(PeriodicTick.scheduled_at, PeriodicTick.job_id)
            .where(PeriodicTick.schedule_name == name)
            .order_by(PeriodicTick.scheduled_at)
        )
        return [(at.astimezone(UTC), job_id) for at, job_id in rows]


def _minute_boundaries(after: dt.datetime, until: dt.datetime) -> list[dt.datetime]:
    first = after.replace(second=0, microsecond=0) + dt.timedelta(minutes=1)
    count = int((until - first).total_seconds() // 60) + 1 if until >= first else 0
    return [first + dt.timedelta(minutes=i) for i in range(count)]


def test_a_paused_schedule_enqueues_nothing_and_drops_its_ticks_on_resume(
    pgq: PgQueue, engine: Engine
) -> None:
    @pgq.periodic("* * * * *", name="minutely", missed="all", args=[3])
    @pgq.task(name="sched.minutely")
    def minutely(n: int) -> None:
        return None

    start = _db_now(engine) - dt.timedelta(minutes=10)
    clock = Clock(start)
    scheduler = Scheduler(pgq.sessions, pgq.schedules, clock=clock)
    assert scheduler.run_pending() == []
    clock.now = start + dt.timedelta(seconds=60)
    assert len(scheduler.run_pending()) == 1
    (first_tick,) = _ticks(engine, "minutely")

    assert pgq.admin.pause_schedule("minutely", actor="ops") is True
    assert pgq.admin.pause_schedule("minutely", actor="ops") is False  # paused already
    # A pass that read the schedule before the pause records no tick of it after the pause.
    late = first_tick[0] + dt.timedelta(minutes=1)
    assert not uow.run_in_transaction(
        pgq.sessions,
        lambda s: control_data.record_tick(executor_for(s), "minutely", late),
    )
    clock.now = start + dt.timedelta(minutes=8)
    assert scheduler.run_pending() == []
    assert _ticks(engine, "minutely") == [first_tick]

    assert pgq.admin.resume_schedule("minutely", actor="ops", source="dashboard") is True
    assert pgq.admin.resume_schedule("minutely") is False  # running already: no record
    resumed = _db_now(engine)
    clock.now = resumed + dt.timedelta(minutes=2)
    created = scheduler.run_pending()
    # With missed="all", only the ticks after the resume run: none of the paused minutes.
    after_resume = _minute_boundaries(resumed, clock.now)
    assert [at for at, _ in _ticks(engine, "minutely")[1:]] == after_resume
    assert len(created) == len(after_resume) == 2
    assert audit_rows(engine, "actor", "source", "action", "filter") == [
        ("ops", "api", "pause_schedule", {"schedule": "minutely"}),
        ("ops", "dashboard", "resume_schedule", {"schedule": "minutely"}),
    ]


def test_run_now_enqueues_one_job_and_no_tick_and_the_listing_names_every_schedule(
    pgq: PgQueue, engine: Engine
) -> None:
    @pgq.periodic("30 9 * * *", tz="Europe/Oslo", name="report", kwargs={"who": "oslo"})
    @pgq.task(name="sched.report")
    def report(who: str) -> None:
        return None

    with engine.begin() as connection:  # a schedule the code no longer defines
        connection.execute(
            text(
                "INSERT INTO pgqueue_periodic_ticks (schedule_name, scheduled_at, job_id) "
                "VALUES ('retired', '2026-01-01 00:00+00', NULL)"
            )
        )
    assert pgq.admin.pause_schedule("report") is True
    job_id = pgq.admin.run_schedule_now("report", actor="alice", source="dashboard")
    job = pgq.get_job(job_id)
    assert (job.task_name, job.args, job.kwargs) == ("sched.report", [], {"who": "oslo"})
    assert _ticks(engine, "report") == []
    assert asyncio.run(pgq.admin.arun_schedule_now("report")) == job_id + 1
    assert pgq.admin.pause_schedule("retired", actor="ops") is True
    with pytest.raises(ScheduleNotFound, match="no schedule named 'nope'"):
        pgq.admin.pause_schedule("nope")
    with pytest.raises(
        ScheduleNotFound,
        match=r"no schedule named 'retired' in the code \(its schedules: report\)$",
    ):
        pgq.admin.run_schedule_now("retired")
    with pytest.raises(ValidationError, match="schedule name must be"):
        pgq.admin.run_schedule_now("")

    now = _db_now(engine)
    listing = pgq.admin.schedules()
    assert listing == [
        ScheduleInfo(
            name="report",
            defined=True,
            cron="30 9 * * *",
            zone="Europe/Oslo",
            task="sched.report",
            missed="latest",
            next_tick=pgq.schedules["report"].next_after(now),
            last_tick=None,
            last_job_id=None,
            paused=True,
        ),
        ScheduleInfo(
            name="retired",
            defined=False,
            cron=None,
            zone=None,
            task=None,
            missed=None,
            next_tick=None,
            last_tick=dt.datetime(2026, 1, 1, tzinfo=UTC),
            last_job_id=None,
            paused=True,
        ),
    ]
    assert asyncio.run(pgq.admin.aschedules()) == listing
    assert [row[2:] for row in audit_rows(engine, "actor", "source", "action", "filter")] == [
        ("pause_schedule", {"schedule": "report"}),
        ("run_schedule", {"schedule": "report", "job_id": job_id}),
        ("run_schedule", {"schedule": "report", "job_id": job_id + 1}),
        ("pause_schedule", {"schedule": "retired"}),
    ]
    assert audit_rows(engine, "actor", "source", "action", "filter")[0][:2] == (
        default_actor(),
        "api",
    )


@pytest.fixture
def app_module(pgq: PgQueue) -> Iterator[str]:
    module = types.ModuleType("schedule_controls_app")
    module.pgq = pgq  # type: ignore[attr-defined]
    sys.modules[module.__name__] = module
    yield f"{module.__name__}:pgq"
    del sys.modules[module.__name__]


def test_the_cli_lists_as_before_and_pauses_resumes_and_runs_a_schedule(
    pgq: PgQueue, engine: Engine, app_module: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    @pgq.periodic("*/5 * * * *", name="beat")
    @pgq.task(name="sched.beat")
    def beat() -> None:
        return None

    monkeypatch.setenv("PGQUEUE_DATABASE_URL", pgq.url.render_as_string(hide_password=False))
    runner = CliRunner()

    def invoke(*args: str) -> tuple[int, str]:
        result = runner.invoke(cli.main, list(args))
        return result.exit_code, result.output.strip()

    code, listed = invoke("schedules", app_module)
    assert code == 0 and "beat" in listed and "*/5 * * * *" in listed
    assert invoke("schedules", "pause", "beat", "--app", app_module, "--actor", "cli-user") == (
        0,
        "schedule beat paused",
    )
    assert invoke("schedules", "pause", "beat") == (0, "schedule beat was paused already")
    assert invoke("schedules", "resume", "beat") == (0, "schedule beat resumed")
    code, out = invoke("schedules", "run", app_module, "beat")
    assert code == 0 and out.startswith("schedule beat: job ")
    code, out = invoke("schedules", "pause", "bet", "--app", app_module)
    assert code == 2
    assert "no schedule named 'bet'" in out and "did you mean 'beat'?" in out
    code, out = invoke("schedules", "resume", "bet")
    assert code == 2 and out.endswith(
        "nothing changed (pass --app APP for a schedule that has not ticked yet)"
    )
    with Session(engine) as session:
        jobs = session.scalar(select(func.count()).select_from(Job))
    assert jobs == 1
    assert [
        (a, s, act) for a, s, act, _ in audit_rows(engine, "actor", "source", "action", "filter")
    ] == [
        ("cli-user", "cli", "pause_schedule"),
        (default_actor(), "cli", "resume_schedule"),
        (default_actor(), "cli", "run_schedule"),
    ]
