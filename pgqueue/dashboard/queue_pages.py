"""The dashboard's queue and worker pages: each queue's switches (pause and resume, concurrency
limit, rate limit; its max depth and the concurrency keys' overrides shown), and the worker
registry with each worker's health and pool.

The queue forms post the queue's name and their numbers as typed; a number the form cannot
take re-shows the page with a 400 and the one-line problem, and writes nothing. Each switch
thrown goes through ``pgq.admin`` with the request's actor and ``source="dashboard"``, which
writes its audit record in the same transaction.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Final

from werkzeug.exceptions import NotFound
from werkzeug.routing import Rule
from werkzeug.wrappers import Response

from pgqueue.admin import QueueSettings
from pgqueue.dashboard.page import Page
from pgqueue.errors import ValidationError

# A queue limit is a Postgres integer; anything above it cannot be stored.
MAX_QUEUE_LIMIT: Final = 2**31 - 1
# A rate limit's window, as pgq.admin.set_rate_limit takes it.
MAX_RATE_SECONDS: Final = 86_400
QUEUE_ACTIONS: Final = frozenset({"pause", "resume", "limit", "unlimit", "rate", "unrate"})
# A worker's pool (Settings.pool) as its page names it.
POOL_NAMES: Final = {"thread": "threads", "process": "processes"}


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
        max_rate_seconds=MAX_RATE_SECONDS,
    )


def queue_action(page: Page, action: str) -> Response:
    if action not in QUEUE_ACTIONS:
        raise NotFound()
    admin = page.admin
    form = page.request.form
    name = form.get("queue", "")
    actor = page.actor()
    try:
        if action == "pause":
            admin.pause_queue(name, actor=actor, source="dashboard")
            page.flash(f"Queue {name} paused: workers claim none of its jobs until resumed.", "ok")
        elif action == "resume":
            admin.resume_queue(name, actor=actor, source="dashboard")
            page.flash(f"Queue {name} resumed.", "ok")
        elif action == "limit":
            limit = _whole_number(form.get("limit", ""), "limit")
            if isinstance(limit, str):
                return queue_list(page, error=f"Queue {name}: {limit}", status=400)
            admin.set_queue_limit(name, limit, actor=actor, source="dashboard")
            page.flash(f"Queue {name}: at most {limit:,} of its jobs run at once.", "ok")
        elif action == "unlimit":
            admin.set_queue_limit(name, None, actor=actor, source="dashboard")
            page.flash(f"Queue {name}: limit removed.", "ok")
        elif action == "rate":
            rate = _whole_number(form.get("rate", ""), "rate limit")
            per = _seconds(form.get("per", ""))
            problem = rate if isinstance(rate, str) else per if isinstance(per, str) else None
            if problem is not None:
                return queue_list(page, error=f"Queue {name}: {problem}", status=400)
            assert isinstance(rate, int) and isinstance(per, float)
            admin.set_rate_limit(name, rate, per=per, actor=actor, source="dashboard")
            page.flash(f"Queue {name}: at most {rate:,} of its jobs start per {per:g}s.", "ok")
        else:
            admin.set_rate_limit(name, None, actor=actor, source="dashboard")
            page.flash(f"Queue {name}: rate limit removed.", "ok")
    except ValidationError as exc:
        return queue_list(page, error=str(exc), status=400)
    return page.redirect("queue_list")


def _whole_number(raw: str, what: str) -> int | str:
    """The count typed into a form, or the one-line problem with it."""
    text = raw.strip()
    if not text:
        return f"{what} is empty: give a whole number from 1 to {MAX_QUEUE_LIMIT:,}"
    try:
        value = int(text)
    except ValueError:
        return f"{what} must be a whole number, got {text[:40]!r}"
    if value < 1:
        return f"{what} must be at least 1, got {value} (use Clear to remove it)"
    if value > MAX_QUEUE_LIMIT:
        return f"{what} must be at most {MAX_QUEUE_LIMIT:,}, got {value:,}"
    return value


def _seconds(raw: str) -> float | str:
    """A rate limit's window typed into the form, or the one-line problem with it."""
    text = raw.strip()
    try:
        value = float(text)
    except ValueError:
        return f"the window must be a number of seconds, got {text[:40]!r}"
    if not math.isfinite(value) or not 0 < value <= MAX_RATE_SECONDS:
        return f"the window must be more than 0 and at most {MAX_RATE_SECONDS:,} seconds"
    return value


def worker_list(page: Page) -> Response:
    return page.render(
        "pgqueue/workers.html",
        workers=page.admin.list_workers(include_stale=True),
        pool_names=POOL_NAMES,
        stale_seconds=page.queue.settings.worker_stale_seconds,
    )


RULES: Final = [
    Rule("/queues", endpoint="queue_list", methods=["GET"]),
    Rule("/queues/<action>", endpoint="queue_action", methods=["POST"]),
    Rule("/workers", endpoint="worker_list", methods=["GET"]),
]
VIEWS: Final[dict[str, Callable[..., Response]]] = {
    "queue_list": queue_list,
    "queue_action": queue_action,
    "worker_list": worker_list,
}
