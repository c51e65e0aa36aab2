"""The periodic summary line of a worker that does not log each success."""

from __future__ import annotations

import logging
import uuid

import pytest

from pgqueue.jobs import ClaimedJob, Outcome
from pgqueue.worker.stats import OutcomeReport, WorkerStats, summary_line


def test_summary_line_counts_the_outcomes_between_two_readings() -> None:
    line = summary_line((1_500, 7, 3, 1), (500, 2, 1, 1), 10.0)
    assert line == (
        "1007 jobs in the last 10.0 s (100.7 jobs/s): succeeded 1000, retried 5, failed 2,"
        " cancelled 0"
    )
    assert summary_line((1, 0, 0, 0), (0, 0, 0, 0), 0.0).startswith("1 job in the last 0.0 s")


def _job(job_id: int) -> ClaimedJob:
    return ClaimedJob(
        id=job_id,
        task_name="t",
        queue="default",
        args=[],
        kwargs={},
        attempt=1,
        max_attempts=3,
        priority=0,
        lease_token=str(uuid.uuid4()),
        atomic=False,
        cancel_requested=False,
    )


def test_successes_log_at_debug_and_a_summary_per_interval(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    caplog.set_level(logging.DEBUG, logger="pgqueue")
    clock = [100.0]
    monkeypatch.setattr("pgqueue.worker.stats.time.monotonic", lambda: clock[0])
    report = OutcomeReport(
        WorkerStats(), log_successes=False, log_args=False, on_outcome=None, summary_interval=5.0
    )
    for job_id in range(1, 4):
        report.written(Outcome.complete(_job(job_id)), 0.001, _job(job_id))
    clock[0] = 105.0
    report.written(Outcome.complete(_job(4)), 0.001, _job(4))
    levels = [(r.levelno, r.getMessage()) for r in caplog.records]
    successes = [level for level, message in levels if " outcome=complete " in message]
    assert successes == [logging.DEBUG] * 4
    summaries = [message for level, message in levels if level == logging.INFO]
    assert summaries == [
        "4 jobs in the last 5.0 s (0.8 jobs/s): succeeded 4, retried 0, failed 0, cancelled 0"
    ]
