"""Job records and worker counts read right without a database: ``Job``'s repr names the job
and never its arguments, and ``WorkerStats`` prints wall-clock times and durations, never
monotonic clock readings."""

from __future__ import annotations

import datetime as dt
import re

import pytest

from pgqueue.models import Job
from pgqueue.states import JobState
from pgqueue.worker.stats import WorkerStats, readable_duration


def _job(**values: object) -> Job:
    defaults: dict[str, object] = {
        "id": 42,
        "task_name": "send_receipt",
        "queue": "default",
        "state": JobState.FAILED,
        "attempts": 3,
        "max_attempts": 5,
        "args": ["card 4111 1111 1111 1111"],
        "kwargs": {"password": "hunter2"},
        "result": {"big": "x" * 10_000},
    }
    return Job(**{**defaults, **values})


def test_a_jobs_repr_names_it_its_task_queue_state_and_attempts() -> None:
    assert repr(_job()) == "<Job 42 send_receipt queue=default state=failed attempt 3/5>"


def test_a_jobs_repr_never_shows_its_arguments_or_result() -> None:
    shown = repr(_job())
    assert "4111" not in shown and "hunter2" not in shown and "xxx" not in shown


def test_a_jobs_repr_never_shows_more_attempts_than_the_maximum() -> None:
    assert repr(_job(attempts=6)).endswith("attempt 6 (max 5)>")


def test_an_unsaved_jobs_repr_says_so_without_failing() -> None:
    assert repr(Job()) == "<Job (unsaved) ? queue=? state=?>"


def test_worker_stats_read_as_counts_a_wall_clock_start_and_a_duration() -> None:
    started_at = dt.datetime(2026, 1, 31, 9, 0, 0, tzinfo=dt.UTC)
    stats = WorkerStats(claimed=12, succeeded=10, retried=1, failed=1, started=1000.0)
    stats.started_at = started_at
    stats.finished = 1012.34
    line = str(stats)
    assert line == (
        "claimed 12, succeeded 10, retried 1, failed 1, cancelled 0, released 0, "
        "lost leases 0, rescued 0; started 2026-01-31 09:00:00 UTC, ran 12.3 s"
    )
    assert repr(stats) == f"<WorkerStats {line}>"
    assert "1000" not in line and "1012" not in line


def test_worker_stats_of_a_running_worker_say_how_long_it_has_run() -> None:
    stats = WorkerStats()
    assert re.search(
        r"started \d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC, running for \d+\.\d s$", str(stats)
    )


@pytest.mark.parametrize(
    ("seconds", "shown"),
    [
        (0.04, "0.0 s"),
        (12.34, "12.3 s"),
        (59.94, "59.9 s"),
        (59.96, "1 min 00 s"),
        (65, "1 min 05 s"),
        (7380, "2 h 03 min"),
    ],
)
def test_durations_read_in_the_unit_a_person_expects(seconds: float, shown: str) -> None:
    assert readable_duration(seconds) == shown
