"""The dashboard's throughput chart: geometry for an inline SVG, drawn by the server.

Counts per bucket become rates in the unit that keeps the peak at 1 or more (per second, per
minute or per hour), the y axis gets round tick values labelled like ``12k/s`` or ``3/h``, and
every bucket is drawn, an empty one as a thin mark on the baseline, so a quiet hour reads as
quiet rather than blank. Succeeded and failed jobs are stacked in two colours. No script runs
in the browser: the template only places the rectangles and labels computed here.
"""

from __future__ import annotations

import math
from typing import Any, Final

from pgqueue.admin import Throughput
from pgqueue.states import JobState

# A full hour with at most this many finished jobs is drawn in 5-minute buckets: one-minute
# buckets would be single jobs among empty minutes.
SPARSE_HOUR: Final = 60
SPARSE_FACTOR: Final = 5
UNITS: Final = (("/s", 1), ("/min", 60), ("/h", 3600))
LARGE_SIZE: Final = {"width": 1120, "height": 170, "left": 56, "bottom": 22, "top": 8}
SMALL_SIZE: Final = {"width": 180, "height": 36, "left": 0, "bottom": 0, "top": 2}


def total_series(throughput: Throughput) -> dict[JobState, list[int]]:
    """All queues' counts added up, per state."""
    totals = {s: [0] * throughput.buckets for s in (JobState.SUCCEEDED, JobState.FAILED)}
    for by_state in throughput.series.values():
        for state, counts in totals.items():
            for index, value in enumerate(by_state.get(state, ())):
                counts[index] += value
    return totals


def coarsened(throughput: Throughput) -> Throughput:
    """``throughput`` in 5-minute buckets when it is a full hour with few jobs, else itself."""
    total = sum(sum(c) for by_state in throughput.series.values() for c in by_state.values())
    if throughput.shortened or throughput.width != 60 or total > SPARSE_HOUR:
        return throughput
    series = {
        queue: {
            state: [
                sum(counts[i : i + SPARSE_FACTOR]) for i in range(0, len(counts), SPARSE_FACTOR)
            ]
            for state, counts in by_state.items()
        }
        for queue, by_state in throughput.series.items()
    }
    return Throughput(throughput.window, throughput.width * SPARSE_FACTOR, series, False)


def rate_unit(peak_per_second: float) -> tuple[str, int]:
    """The unit (suffix, seconds) in which ``peak_per_second`` is at least 1, the smallest such
    one; per hour for anything slower than one a minute."""
    for suffix, size in UNITS:
        if peak_per_second * size >= 1:
            return suffix, size
    return UNITS[-1]


def nice_ceiling(peak: float) -> tuple[float, float]:
    """``(top, step)``: a round axis top at or above ``peak`` and its tick step (1, 2 or 5
    times a power of ten), giving two to five ticks above zero."""
    if peak <= 0:
        return 1.0, 1.0
    magnitude = 10 ** math.floor(math.log10(peak))
    for factor in (0.2, 0.5, 1, 2, 5, 10):
        step = factor * magnitude
        if peak / step <= 5:
            break
    if step < 1 and peak >= 1:
        step = 1.0
    return math.ceil(peak / step - 1e-9) * step, step


def short_number(value: float) -> str:
    """``950``, ``1.5k``, ``12k``, ``2.4M``; fractions below 10 keep one decimal (``0.5``)."""
    for suffix, size in (("M", 1e6), ("k", 1e3)):
        if abs(value) >= size:
            return _trimmed(value / size) + suffix
    return _trimmed(value)


def _trimmed(value: float) -> str:
    if abs(value) >= 10 or value == int(value):
        return f"{value:.0f}"
    return f"{value:.1f}".rstrip("0").rstrip(".")


def _span(seconds: int) -> str:
    if seconds >= 120:
        return f"{seconds // 60} min"
    return f"{seconds} s"


def chart(
    succeeded: list[int], failed: list[int], width: int, window: int, large: bool = True
) -> dict[str, Any]:
    """SVG geometry of stacked bars, newest bucket on the right. ``succeeded[0]`` and
    ``failed[0]`` are the newest bucket's counts, each bucket ``width`` seconds wide."""
    size = LARGE_SIZE if large else SMALL_SIZE
    buckets = len(succeeded)
    peak_count = max([s + f for s, f in zip(succeeded, failed, strict=True)] + [0])
    suffix, unit = rate_unit(peak_count / width)
    to_rate = unit / width  # a bucket's count in jobs per unit
    top, step = nice_ceiling(peak_count * to_rate)
    plot_w = size["width"] - size["left"] - 4 * large
    plot_h = size["height"] - size["bottom"] - size["top"]
    slot = plot_w / buckets
    gap = 1 if slot >= 3 else 0.3

    def y(rate: float) -> float:
        return round(size["top"] + plot_h - plot_h * rate / top, 1)

    bars = []
    for index in range(buckets):
        ago = buckets - 1 - index
        ok, bad = succeeded[ago], failed[ago]
        x = round(size["left"] + index * slot, 1)
        ok_top, bad_top = y(ok * to_rate), y((ok + bad) * to_rate)
        start, end = (ago + 1) * width, ago * width
        bars.append(
            {
                "x": x,
                "w": round(slot - gap, 1),
                "ok_y": ok_top,
                "ok_h": round(y(0) - ok_top, 1) if ok else 0,
                "bad_y": bad_top,
                "bad_h": round(ok_top - bad_top, 1) if bad else 0,
                "zero": not (ok or bad),
                "title": f"{_span(start)} to {_span(end) + ' ago' if end else 'now'}: "
                f"{ok:,} succeeded, {bad:,} failed",
            }
        )
    ticks = []
    value = 0.0
    while value <= top + 1e-9:
        label = "0" if value == 0 else short_number(value) + suffix
        ticks.append({"y": y(value), "label": label})
        value += step
    base_y = y(0)
    x_labels = [
        {"x": size["left"], "anchor": "start", "label": f"{_span(window)} ago"},
        {
            "x": round(size["left"] + plot_w / 2, 1),
            "anchor": "middle",
            "label": f"{_span(window // 2)} ago",
        },
        {"x": size["left"] + plot_w, "anchor": "end", "label": "now"},
    ]
    return {
        "width": size["width"],
        "height": size["height"],
        "left": size["left"],
        "right": size["left"] + plot_w,
        "base_y": base_y,
        "label_y": size["height"] - 6,
        "bars": bars,
        "ticks": ticks if large else [],
        "x_labels": x_labels if large else [],
        "peak": "0" if not peak_count else short_number(peak_count * to_rate) + suffix,
        "unit": suffix,
        "bucket": _span(width) if width < 60 else f"{width // 60} min",
        "total": sum(succeeded) + sum(failed),
        "window": _span(window) if window != 3600 else "hour",
    }
