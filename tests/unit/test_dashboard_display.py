"""The dashboard's chart geometry and job formatting, computed without a server: round axis
ticks and rate units at 10 jobs an hour and at 10,000 jobs a second, every bucket drawn, error
summaries, durations, and folding of repeated failures."""

from __future__ import annotations

import datetime as dt

from pgqueue.admin import Throughput
from pgqueue.dashboard.job_display import duration, error_summary, folded_errors
from pgqueue.dashboard.throughput_chart import (
    chart,
    coarsened,
    nice_ceiling,
    short_number,
    total_series,
)
from pgqueue.states import JobState


def _labels(c: dict[str, object]) -> list[str]:
    return [t["label"] for t in c["ticks"]]  # type: ignore[attr-defined]


def test_ten_jobs_an_hour_read_per_hour_in_five_minute_bars() -> None:
    minutes = [0] * 60
    for minute in range(3, 60, 6):  # one job every six minutes
        minutes[minute] = 1
    hour = Throughput(3600, 60, {"default": {JobState.SUCCEEDED: minutes}}, shortened=False)
    wide = coarsened(hour)
    assert (wide.width, wide.buckets) == (300, 12)
    totals = total_series(wide)
    c = chart(totals[JobState.SUCCEEDED], totals[JobState.FAILED], wide.width, wide.window)
    assert _labels(c) == ["0", "5/h", "10/h", "15/h"]
    assert c["peak"] == "12/h"
    assert c["total"] == 10
    assert c["bucket"] == "5 min"
    assert sum(1 for b in c["bars"] if b["zero"]) == 2  # type: ignore[attr-defined]
    assert [x["label"] for x in c["x_labels"]] == ["60 min ago", "30 min ago", "now"]  # type: ignore[attr-defined]


def test_ten_thousand_jobs_a_second_read_in_thousands_per_second() -> None:
    succeeded = [9_800] * 6
    failed = [200] * 6
    c = chart(succeeded, failed, width=1, window=6)
    assert _labels(c) == ["0", "2k/s", "4k/s", "6k/s", "8k/s", "10k/s"]
    assert c["peak"] == "10k/s"
    bar = c["bars"][0]  # type: ignore[index]
    assert bar["ok_h"] > bar["bad_h"] > 0  # both states drawn, stacked
    assert [x["label"] for x in c["x_labels"]] == ["6 s ago", "3 s ago", "now"]  # type: ignore[attr-defined]


def test_busy_hour_stays_in_minute_bars_and_an_empty_one_shows_a_zero_axis() -> None:
    busy = Throughput(3600, 60, {"q": {JobState.SUCCEEDED: [120] * 60}}, shortened=False)
    assert coarsened(busy) is busy
    c = chart([0] * 60, [0] * 60, 60, 3600)
    assert _labels(c) == ["0", "1/h"]
    assert all(b["zero"] for b in c["bars"])  # type: ignore[attr-defined]


def test_nice_ceiling_and_short_numbers() -> None:
    assert nice_ceiling(19) == (20, 5)
    assert nice_ceiling(333) == (400, 100)
    assert nice_ceiling(1.5) == (2, 1)
    assert [short_number(v) for v in (0, 7, 950, 1500, 12_000, 2_400_000)] == [
        "0",
        "7",
        "950",
        "1.5k",
        "12k",
        "2.4M",
    ]


def test_error_summary_names_the_exception_not_the_traceback_header() -> None:
    traceback = (
        "Traceback (most recent call last):\n"
        '  File "x.py", line 3, in f\n'
        "ConnectionError: SMTP refused\n"
    )
    assert error_summary(traceback) == "ConnectionError: SMTP refused"
    assert error_summary("Retry: rate limited\nmore") == "Retry: rate limited"
    long = error_summary("ValueError: " + "x" * 300)
    assert len(long) == 200 and long.endswith("…")
    assert error_summary(None) == ""


def test_durations_in_readable_units() -> None:
    start = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)

    def after(seconds: float) -> str:
        return duration(start, start + dt.timedelta(seconds=seconds), running=False)

    assert [after(s) for s in (0.35, 4.25, 42, 192, 7_500)] == [
        "350 ms",
        "4.2 s",
        "42 s",
        "3m 12s",
        "2h 5m",
    ]
    assert duration(None, None, running=False) == ""
    started = dt.datetime.now(dt.UTC) - dt.timedelta(seconds=12.4)
    assert duration(started, None, running=True) == "running for 12 s"


def test_repeated_failures_fold_across_memory_addresses() -> None:
    def entry(attempt: int, error: str) -> dict[str, object]:
        return {"attempt": attempt, "at": f"2026-01-01T00:00:0{attempt}+00:00", "error": error}

    errors = [
        entry(1, "ValueError: bad <Obj at 0x7f01aa>"),
        entry(2, "ValueError: bad <Obj at 0x7f02bb>"),
        entry(3, "ValueError: bad <Obj at 0x7f03cc>"),
        entry(4, "KeyError: 'id'"),
        entry(5, "ValueError: bad <Obj at 0x7f05dd>"),
    ]
    runs = folded_errors(errors)
    assert [(r.count, r.attempts) for r in runs] == [
        (3, "attempts 1-3"),
        (1, "attempt 4"),
        (1, "attempt 5"),
    ]
    assert runs[0].error == "ValueError: bad <Obj at 0x7f01aa>"
    assert runs[0].when == "2026-01-01 00:00:03 UTC"
