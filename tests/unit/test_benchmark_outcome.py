"""What ``python -m benchmarks`` makes of a run's results: the failures that set its exit status
(a workload that raised, a drain that lost or repeated a job) and the ceiling sweep's grid and
peak, which every ratio in the report is taken against."""

from __future__ import annotations

from typing import Any

from benchmarks.report import render
from benchmarks.run import ceiling_grid, failures, grid_markdown


def _drain(threads: int, batch: int, rate: float, ok: bool = True) -> dict[str, Any]:
    return {
        "threads": threads,
        "batch": batch,
        "jobs_per_s": rate,
        "ok": ok,
        "jobs": 100,
        "succeeded": 100 if ok else 99,
    }


def test_a_clean_run_has_no_failures() -> None:
    results = {
        "enqueueB": {"ratio": 0.3, "two_rows": {"ratio": 0.5}},
        "drain": {"ceiling_sweep": [_drain(1, 50, 10.0)], "round_runs": [_drain(1, 50, 9.0)]},
    }
    assert failures(results) == []


def test_a_lost_job_and_a_crash_are_both_named() -> None:
    results = {
        "errors": {"latency round 1": "RuntimeError('worker exited with 1')"},
        "drain": {"ceiling_sweep": [_drain(1, 50, 10.0), _drain(2, 50, 0.0, ok=False)]},
    }
    assert failures(results) == [
        "latency round 1: RuntimeError('worker exited with 1')",
        "drain.ceiling_sweep[1]: 99 of 100 jobs succeeded",
    ]


def test_a_lost_job_deep_in_the_peers_results_is_found() -> None:
    results = {"peers": {"pgqueuer": {"drain": {"runs": [None, _drain(0, 0, 0.0, ok=False)]}}}}
    assert failures(results) == ["peers.pgqueuer.drain.runs[1]: 99 of 100 jobs succeeded"]


def test_the_grid_peaks_where_the_sweep_is_fastest_and_skips_failed_points() -> None:
    sweep = [
        _drain(1, 50, 100.0),
        _drain(1, 2000, 300.0),
        _drain(2, 50, 200.0),
        _drain(2, 2000, 900.0, ok=False),
        None,
    ]
    grid = ceiling_grid(sweep)
    assert grid["threads"] == [1, 2]
    assert grid["batches"] == [50, 2000]
    assert grid["jobs_per_s"] == [[100.0, 300.0], [200.0, None]]
    assert grid["peak"] == {"threads": 1, "batch": 2000, "jobs_per_s": 300.0}
    table = grid_markdown(grid)
    assert "| 1 | 100 | **300** |" in table
    assert "| 2 | 200 | - |" in table


def test_a_results_file_renders_its_failures() -> None:
    text = render({"mode": "quick", "elapsed_s": 3.0, "failures": ["drain: lost"]})
    assert text.endswith("Failures: drain: lost")
