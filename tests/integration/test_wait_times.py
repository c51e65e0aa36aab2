"""``pgq.admin.recent_wait_times``: per queue, the median and 95th percentile of how long the
recently finished jobs waited from ``run_at`` to their claim, bucketed by finish time, from rows
written with known times; bounded by the cap (the newest jobs only), and refusing bad
arguments before any SQL runs; and ``pgq.admin.recent_activity``, which reads the same waits
beside the throughput counts in one pass."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.engine import URL

from pgqueue import PgQueue
from pgqueue.admin import WaitTime
from pgqueue.errors import ValidationError
from pgqueue.states import JobState

# (queue, seconds ago it finished, seconds it waited); started_at is null for the last: a job
# cancelled before it ran has no wait.
ROWS = [
    ("w", 10, 1.0),
    ("w", 11, 2.0),
    ("w", 12, 3.0),
    ("w", 13, 4.0),
    ("w", 90, 10.0),
    ("w", 95, 20.0),
    ("v", 200, 0.0),
    ("v", 30, None),
    ("old", 4000, 5.0),
]

INSERT = text(
    """INSERT INTO pgqueue_jobs (task_name, queue, state, attempts, run_at, started_at,
                                 finished_at, updated_at, args)
       VALUES ('wait.job', :queue, 'succeeded', 1,
               now() - make_interval(secs => :ago + 1 + coalesce(CAST(:waited AS float), 0)),
               CASE WHEN CAST(:waited AS float) IS NOT NULL
                    THEN now() - make_interval(secs => :ago + 1) END,
               now() - make_interval(secs => :ago), now(), '[]')"""
)


@pytest.fixture
def pgq(database_url: URL) -> Iterator[PgQueue]:
    engine = create_engine(database_url)
    with engine.begin() as connection:
        for queue, ago, waited in ROWS:
            connection.execute(INSERT, {"queue": queue, "ago": ago, "waited": waited})
    engine.dispose()
    queue = PgQueue(database_url)
    yield queue
    queue.dispose()


def test_waits_per_queue_and_bucket(pgq: PgQueue) -> None:
    waits = pgq.admin.recent_wait_times(3600, 60)
    assert sorted(waits) == ["v", "w"]
    w = waits["w"]
    assert len(w) == 60
    assert w[0] == WaitTime(4, pytest.approx(2.5), pytest.approx(3.85))  # type: ignore[arg-type]
    assert w[1] == WaitTime(2, pytest.approx(15.0), pytest.approx(19.5))  # type: ignore[arg-type]
    assert w[2:] == [None] * 58
    v = waits["v"]
    assert v[3] == WaitTime(1, 0.0, 0.0)
    assert [i for i, value in enumerate(v) if value is not None] == [3]


def test_the_cap_reads_the_newest_jobs_only(pgq: PgQueue) -> None:
    waits = pgq.admin.recent_wait_times(600, 10, cap=3)
    assert sorted(waits) == ["w"]
    assert waits["w"][1] == WaitTime(3, pytest.approx(2.0), pytest.approx(2.9))  # type: ignore[arg-type]
    assert [i for i, value in enumerate(waits["w"]) if value is not None] == [1]


def test_activity_counts_and_waits_in_the_same_buckets(pgq: PgQueue) -> None:
    activity = pgq.admin.recent_activity()
    throughput = activity.throughput
    assert (throughput.window, throughput.width, throughput.shortened) == (3600, 60, False)
    assert throughput.series == pgq.admin.recent_throughput().series
    w = throughput.series["w"][JobState.SUCCEEDED]
    assert (w[0], w[1], sum(w)) == (4, 2, 6)
    v = throughput.series["v"][JobState.SUCCEEDED]
    assert (v[0], v[3], sum(v)) == (1, 1, 2)
    assert activity.waits == pgq.admin.recent_wait_times(3600, 60)


def test_activity_of_a_quiet_hour_in_wider_buckets(pgq: PgQueue) -> None:
    activity = pgq.admin.recent_activity(quiet_jobs=8, quiet_width=300)
    assert (activity.throughput.window, activity.throughput.width) == (3600, 300)
    series = activity.throughput.series
    assert series["w"][JobState.SUCCEEDED] == [6] + [0] * 11
    assert series["v"][JobState.SUCCEEDED] == [2] + [0] * 11
    assert activity.waits["w"][0] == WaitTime(6, pytest.approx(3.5), pytest.approx(17.5))  # type: ignore[arg-type]
    assert activity.waits["v"] == [WaitTime(1, 0.0, 0.0)] + [None] * 11
    # One job more than ``quiet_jobs``: one-minute buckets.
    assert pgq.admin.recent_activity(quiet_jobs=7, quiet_width=300).throughput.width == 60


def test_activity_past_the_cap_shrinks_its_window(pgq: PgQueue) -> None:
    activity = pgq.admin.recent_activity(cap=3)
    throughput = activity.throughput
    # The third newest job finished 12 s (and the moments the test took) ago: 1 s buckets.
    assert (throughput.width, throughput.shortened) == (1, True)
    assert 13 <= throughput.window <= 15
    assert sorted(throughput.series) == ["w"]
    counts = throughput.series["w"][JobState.SUCCEEDED]
    assert [i for i, n in enumerate(counts) if n] == [10, 11, 12]
    assert [w and w.jobs for w in activity.waits["w"][10:13]] == [1, 1, 1]
    assert [w and w.p50 for w in activity.waits["w"][10:13]] == [1.0, 2.0, 3.0]


@pytest.mark.parametrize(
    ("window", "width", "cap", "message"),
    [
        (0, 60, 10, "window must be a positive int, got 0"),
        (3600, 7, 10, "window (3600) must be a whole number of buckets of width (7)"),
        (3600, 60, True, "cap must be a positive int, got True"),
    ],
)
def test_bad_arguments_are_refused(
    pgq: PgQueue, window: int, width: int, cap: int, message: str
) -> None:
    with pytest.raises(ValidationError) as raised:
        pgq.admin.recent_wait_times(window, width, cap)
    assert message in str(raised.value)
