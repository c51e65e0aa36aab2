"""The overview's per-queue wait-time and failure-rate charts: geometry for small inline SVG
bar charts, drawn by the server like the throughput chart (``throughput_chart``), over the
same buckets, newest on the right. A bucket in which no job of the queue finished has no value
and is drawn as a thin mark on the baseline."""

from __future__ import annotations

from typing import Any, Final

from pgqueue.admin import WaitTime
from pgqueue.dashboard.throughput_chart import SMALL_SIZE, nice_ceiling, short_number

_PLOT_H: Final = SMALL_SIZE["height"] - SMALL_SIZE["top"]


def seconds_label(value: float) -> str:
    """``0.3 s``, ``12 s``, ``4.5 min``, ``2.1 h``."""
    for suffix, size in ((" h", 3600), (" min", 60)):
        if value >= size:
            return short_number(value / size) + suffix
    return (f"{value:.2f}".rstrip("0").rstrip(".") if value < 1 else short_number(value)) + " s"


def _bars(values: list[float | None], titles: list[str], top: float) -> list[dict[str, Any]]:
    buckets = len(values)
    slot = SMALL_SIZE["width"] / buckets
    gap = 1 if slot >= 3 else 0.3
    bars = []
    for index in range(buckets):
        ago = buckets - 1 - index
        value = values[ago]
        height = 0.0 if not value else round(_PLOT_H * min(value, top) / top, 1)
        bars.append(
            {
                "x": round(index * slot, 1),
                "w": round(slot - gap, 1),
                "y": round(SMALL_SIZE["height"] - height, 1),
                "h": height,
                "empty": value is None,
                "title": titles[ago],
            }
        )
    return bars


def _when(ago: int, width: int) -> str:
    start, end = (ago + 1) * width, ago * width
    return f"{start} s to {f'{end} s ago' if end else 'now'}"


def wait_chart(waits: list[WaitTime | None], width: int) -> dict[str, Any]:
    """Bars of each bucket's 95th percentile wait (the median in its tooltip)."""
    p95s: list[float | None] = [None if w is None else w.p95 for w in waits]
    peak = max([v for v in p95s if v is not None] + [0.0])
    top, _ = nice_ceiling(peak) if peak >= 1 else (max(peak, 0.001), 0.0)
    titles = [
        f"{_when(ago, width)}: no job finished"
        if w is None
        else f"{_when(ago, width)}: {w.jobs:,} jobs, waited p50 {seconds_label(w.p50)}, "
        f"p95 {seconds_label(w.p95)}"
        for ago, w in enumerate(waits)
    ]
    known = [w for w in waits if w is not None]
    return {
        **SMALL_SIZE,
        "bars": _bars(p95s, titles, top),
        "peak": seconds_label(peak) if known else "none",
        "latest": None if not known else seconds_label(known[0].p95),
    }


def failure_chart(succeeded: list[int], failed: list[int], width: int) -> dict[str, Any]:
    """Bars of each bucket's failure rate: failed out of finished (succeeded + failed)."""
    rates: list[float | None] = [
        None if not ok + bad else bad / (ok + bad)
        for ok, bad in zip(succeeded, failed, strict=True)
    ]
    titles = [
        f"{_when(ago, width)}: no job finished"
        if rate is None
        else f"{_when(ago, width)}: {failed[ago]:,} of {succeeded[ago] + failed[ago]:,} "
        f"failed ({rate:.0%})"
        for ago, rate in enumerate(rates)
    ]
    total = sum(succeeded) + sum(failed)
    return {
        **SMALL_SIZE,
        "bars": _bars(rates, titles, 1.0),
        "rate": None if not total else f"{sum(failed) / total:.1%}",
    }
