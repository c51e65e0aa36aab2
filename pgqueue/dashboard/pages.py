"""The dashboard's pages: overview, queues and their controls, workers; with the formatting
helpers every template uses (the job pages are ``job_pages``').

Each view takes the request's :class:`~pgqueue.dashboard.page.Page` and returns a response;
``RULES`` and ``VIEWS`` are what the core routes to them.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Callable
from typing import Any, Final

from werkzeug.exceptions import NotFound
from werkzeug.routing import Rule
from werkzeug.wrappers import Response

from pgqueue.admin import DEFAULT_COUNT_CAP, QueueSettings
from pgqueue.dashboard.job_display import duration, error_summary, error_tooltip
from pgqueue.dashboard.page import Page
from pgqueue.dashboard.throughput_chart import chart, coarsened, total_series
from pgqueue.errors import ValidationError
from pgqueue.states import JobState

# Counts on the overview stop here ("1,000+"): each reads at most this many index entries, so
# the page costs the same however much history the jobs table holds.
COUNT_CAP: Final = DEFAULT_COUNT_CAP
STATES: Final = list(JobState)
# A queue limit is a Postgres integer; anything above it cannot be stored.
MAX_QUEUE_LIMIT: Final = 2**31 - 1


def overview(page: Page) -> Response:
    admin = page.admin
    counts = admin.capped_counts(COUNT_CAP)
    oldest = admin.oldest_waiting()
    throughput = coarsened(admin.recent_throughput(page.throughput_cap()))
    settings = admin.queue_settings()
    names = sorted(set(counts) | set(oldest) | set(throughput.series))
    empty = [0] * throughput.buckets
    rows: list[dict[str, Any]] = []
    for name in names:
        by_state = counts.get(name, {})
        series = throughput.series.get(name, {})
        row_chart = chart(
            series.get(JobState.SUCCEEDED, empty),
            series.get(JobState.FAILED, empty),
            throughput.width,
            throughput.window,
            large=False,
        )
        rows.append(
            {
                "name": name,
                "counts": {s: by_state.get(s, 0) for s in STATES},
                "oldest": oldest.get(name),
                "settings": settings.get(name),
                "chart": row_chart,
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


def queue_list(page: Page, error: str | None = None, status: int = 200) -> Response:
    admin = page.admin
    settings = admin.queue_settings()
    names = set(admin.queue_names()) | set(settings)
    names |= {task.queue for task in page.queue.registry}
    queues = [settings.get(name) or QueueSettings(name, False, None, 0) for name in sorted(names)]
    return page.render(
        "pgqueue/queues.html",
        status=status,
        queues=queues,
        key_overrides=admin.key_overrides(),
        error=error,
        max_limit=MAX_QUEUE_LIMIT,
    )


def queue_action(page: Page, action: str) -> Response:
    admin = page.admin
    form = page.request.form
    name = form.get("queue", "")
    try:
        if action == "pause":
            admin.pause_queue(name)
            page.flash(f"Queue {name} paused: workers claim none of its jobs until resumed.", "ok")
        elif action == "resume":
            admin.resume_queue(name)
            page.flash(f"Queue {name} resumed.", "ok")
        elif action == "limit":
            limit = _queue_limit(form.get("limit", ""))
            if isinstance(limit, str):
                return queue_list(page, error=f"Queue {name}: {limit}", status=400)
            admin.set_queue_limit(name, limit)
            page.flash(f"Queue {name}: at most {limit:,} of its jobs run at once.", "ok")
        elif action == "unlimit":
            admin.set_queue_limit(name, None)
            page.flash(f"Queue {name}: limit removed.", "ok")
        else:
            raise NotFound()
    except ValidationError as exc:
        return queue_list(page, error=str(exc), status=400)
    return page.redirect("queue_list")


def _queue_limit(raw: str) -> int | str:
    """The limit typed into the form, or the one-line problem with it."""
    text = raw.strip()
    if not text:
        return f"limit is empty: give a whole number from 1 to {MAX_QUEUE_LIMIT:,}"
    try:
        value = int(text)
    except ValueError:
        return f"limit must be a whole number, got {text[:40]!r}"
    if value < 1:
        return f"limit must be at least 1, got {value} (use Clear to remove the limit)"
    if value > MAX_QUEUE_LIMIT:
        return f"limit must be at most {MAX_QUEUE_LIMIT:,}, got {value:,}"
    return value


def worker_list(page: Page) -> Response:
    return page.render(
        "pgqueue/workers.html",
        workers=page.admin.list_workers(include_stale=True),
        stale_seconds=page.queue.settings.worker_stale_seconds,
    )


RULES: Final = [
    Rule("/", endpoint="overview", methods=["GET"]),
    Rule("/queues", endpoint="queue_list", methods=["GET"]),
    Rule("/queues/<action>", endpoint="queue_action", methods=["POST"]),
    Rule("/workers", endpoint="worker_list", methods=["GET"]),
]
VIEWS: Final[dict[str, Callable[..., Response]]] = {
    "overview": overview,
    "queue_list": queue_list,
    "queue_action": queue_action,
    "worker_list": worker_list,
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
}
