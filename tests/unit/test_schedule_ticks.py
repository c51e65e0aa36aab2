"""``Schedule.latest_between`` finds the same tick as walking every tick up to the end of the
window, across daylight-saving nights, for second, minute, hourly and daily schedules."""

from __future__ import annotations

import datetime as dt

import pytest

from pgqueue import PgQueue
from pgqueue.scheduler import Schedule

UTC = dt.UTC
pgq = PgQueue("postgresql+psycopg://nobody@localhost/none")


@pgq.task(name="noop")
def noop() -> None:
    return None


def _walked(schedule: Schedule, after: dt.datetime, until: dt.datetime) -> dt.datetime | None:
    """The latest tick by walking every one of them, ``MAX_TICKS_PER_PASS`` at a time."""
    latest = None
    while ticks := schedule.ticks_between(after, until):
        latest = after = ticks[-1]
    return latest


@pytest.mark.parametrize(
    "cron", ["30 1 * * *", "30 2 * * *", "0 * * * *", "*/7 * * * *", "* * * * * */20"]
)
@pytest.mark.parametrize("zone", ["America/New_York", "Europe/Oslo", "UTC"])
@pytest.mark.slow
def test_latest_between_matches_the_walk(cron: str, zone: str) -> None:
    schedule = Schedule.create(cron, noop, tz=zone, name="s")
    base = dt.datetime(2025, 11, 2, 0, 0, 17, tzinfo=UTC)  # the New York fall-back night
    for start_hours in (-30, -2, 0, 1, 3):
        for length_minutes in (0, 1, 29, 61, 90, 185, 1500):
            after = base + dt.timedelta(hours=start_hours)
            until = after + dt.timedelta(minutes=length_minutes, seconds=13)
            assert schedule.latest_between(after, until) == _walked(schedule, after, until), (
                after,
                until,
            )
    spring = dt.datetime(2025, 3, 9, 5, 0, 3, tzinfo=UTC)  # the New York spring-forward night
    for length_minutes in (30, 90, 150, 240):
        until = spring + dt.timedelta(minutes=length_minutes)
        assert schedule.latest_between(spring, until) == _walked(schedule, spring, until)


def test_latest_of_a_month_of_minutes_is_found_without_walking_it() -> None:
    schedule = Schedule.create("* * * * *", noop, name="m")
    after = dt.datetime(2025, 1, 1, 0, 1, tzinfo=UTC)
    until = dt.datetime(2025, 1, 31, 0, 1, 35, tzinfo=UTC)
    assert schedule.latest_between(after, until) == dt.datetime(2025, 1, 31, 0, 1, tzinfo=UTC)
    assert schedule.latest_between(after, after + dt.timedelta(seconds=59)) is None


def test_next_tick_steps_the_cron_iterator_once(monkeypatch: pytest.MonkeyPatch) -> None:
    from croniter import croniter

    steps: list[object] = []
    step = croniter.get_next

    def counted(self: croniter, *args: object, **kwargs: object) -> object:
        steps.append(args)
        return step(self, *args, **kwargs)

    monkeypatch.setattr(croniter, "get_next", counted)
    schedule = Schedule.create("*/5 * * * *", noop, tz="Europe/Oslo", name="five")
    moment = dt.datetime(2025, 1, 1, 0, 1, tzinfo=UTC)
    assert schedule.next_after(moment) == dt.datetime(2025, 1, 1, 0, 5, tzinfo=UTC)
    assert len(steps) == 1
