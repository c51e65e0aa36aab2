"""The dashboard's overview page, with the formatting helpers every template uses (the job
pages are ``job_pages``', queues and workers ``queue_pages``').

Each view takes the request's :class:`~pgqueue.dashboard.page.Page` and returns a response;
``RULES`` and ``VIEWS`` are what the core routes to them.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Final

from werkzeug.routing import Rule
from werkzeug.wrappers import Response

from pgqueue.admin import DEFAULT_COUNT_CAP
from pgqueue.dashboard.chart_svg import bar_chart, level_chart
from pgqueue.dashboard.job_display import duration, error_summary, error_tooltip
from pgqueue.dashboard.page import Page
from pgqueue.dashboard.queue_charts import failure_chart, wait_chart
from pgqueue.dashboard.throughput_chart import SPARSE_FACTOR, SPARSE_HOUR, chart, total_series
from pgqueue.states import JobState

# Counts on the overview stop here ("1,000+"): each reads at most this many index entries, so
# the page costs the same however much history the jobs table holds.
COUNT_CAP: Final = DEFAULT_COUNT_CAP
STATES: Final = list(JobState)
# Threads for a page's reads that may run beside its longest one; idle ones cost nothing.
SIDE_READS: Final = ThreadPoolExecutor(max_workers=4, thread_name_prefix="pgqueue-dashboard")


def overview(page: Page) -> Response:
    admin = page.admin
    cap = page.throughput_cap()
    # The queues' counts, oldest tickets and settings (index probes) are read on a second
    # connection while this thread reads the recent jobs, the page's longest read: the page
    # waits for the longer of the two, not their sum.
    queue_figures = SIDE_READS.submit(
        lambda: (admin.capped_counts(COUNT_CAP), admin.oldest_waiting(), admin.queue_settings())
    )
    # One read of the newest finished jobs gives both the counts and the waits; a quiet full
    # hour comes in 5-minute buckets, where 60 one-minute bars would be mostly empty.
    activity = admin.recent_activity(cap, quiet_jobs=SPARSE_HOUR, quiet_width=60 * SPARSE_FACTOR)
    throughput, waits = activity.throughput, activity.waits
    counts, oldest, settings = queue_figures.result()
    names = sorted(set(counts) | set(oldest) | set(throughput.series))
    empty = [0] * throughput.buckets
    no_waits: list[Any] = [None] * throughput.buckets
    rows: list[dict[str, Any]] = []
    for name in names:
        by_state = counts.get(name, {})
        series = throughput.series.get(name, {})
        succeeded = series.get(JobState.SUCCEEDED, empty)
        failed = series.get(JobState.FAILED, empty)
        row_chart = chart(succeeded, failed, throughput.width, throughput.window, large=False)
        rows.append(
            {
                "name": name,
                "counts": {s: by_state.get(s, 0) for s in STATES},
                "oldest": oldest.get(name),
                "settings": settings.get(name),
                "chart": row_chart,
                "wait_chart": wait_chart(waits.get(name, no_waits), throughput.width),
                "failure_chart": failure_chart(succeeded, failed, throughput.width),
            }
        )
    totals = {s: sum(r["counts"][s] for r in rows) for s in STATES}
    capped = {s: any(r["counts"][s] >= COUNT_CAP for r in rows) for s in STATES}
    all_queues = total_series(throughput)
    return page.render(
        "pgqueue/overview.html",
        rows=rows,
        totals=totals,
        capped=capped,
        cap=COUNT_CAP,
        chart=chart(
            all_queues[JobState.SUCCEEDED],
            all_queues[JobState.FAILED],
            throughput.width,
            throughput.window,
        ),
        shortened=throughput.shortened,
    )


RULES: Final = [
    Rule("/", endpoint="overview", methods=["GET"]),
]
VIEWS: Final[dict[str, Callable[..., Response]]] = {
    "overview": overview,
}


# -- formatting -------------------------------------------------------------------------------


def age(seconds: float) -> str:
    """``3d 4h``, ``5m 12s``, ``in 40s`` for negative values (scheduled in the future)."""
    prefix = "in " if seconds < 0 else ""
    left = int(abs(seconds))
    parts: list[str] = []
    for unit, size in (("d", 86_400), ("h", 3_600), ("m", 60), ("s", 1)):
        if left >= size or (unit == "s" and not parts):
            parts.append(f"{left // size}{unit}")
            left %= size
        if len(parts) == 2:
            break
    return prefix + " ".join(parts)


def count(value: int, at_least: bool = False) -> str:
    """``123``; ``1,000+`` for a count that stopped at ``COUNT_CAP``."""
    return f"{value:,}+" if at_least or value >= COUNT_CAP else f"{value:,}"


def timestamp(value: dt.datetime | None) -> str:
    if value is None:
        return ""
    return value.astimezone(dt.UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def pretty_json(value: Any) -> str:
    return json.dumps(value, indent=2, sort_keys=True, default=str, ensure_ascii=False)


HELPERS: Final = {
    "age": age,
    "timestamp": timestamp,
    "pretty_json": pretty_json,
    "states": STATES,
    "count": count,
    "duration": duration,
    "error_summary": error_summary,
    "error_tooltip": error_tooltip,
    "svg_bar_chart": bar_chart,
    "svg_level_chart": level_chart,
}
