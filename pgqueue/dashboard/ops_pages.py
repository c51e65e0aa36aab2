"""The dashboard's operations pages: the periodic schedules (pause, resume, run now) and the
audit log of the actions operators took.

A schedule action is a POST naming the schedule in its form (a name may hold any character
but NUL, slashes included); it goes through ``pgq.admin`` with this request's actor and source
``dashboard``, which writes its audit record in the action's own transaction. A name neither
the code nor the database knows is shown as a message on the page, never as an error page.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any, Final

from werkzeug.exceptions import BadRequest, NotFound
from werkzeug.routing import Rule
from werkzeug.wrappers import Response

from pgqueue.admin import MAX_JOB_ID, AuditEntry
from pgqueue.dashboard.page import Page
from pgqueue.errors import ScheduleNotFound, ValidationError

AUDIT_PAGE_SIZE: Final = 50
SCHEDULE_ACTIONS: Final = frozenset({"pause", "resume", "run"})


def schedule_list(page: Page) -> Response:
    return page.render(
        "pgqueue/schedules.html",
        schedules=page.admin.schedules(),
        # Without the app's code (the standalone dashboard given no APP) the page knows only
        # what the database recorded: the ticks and the pauses.
        from_code=bool(page.queue.schedules),
    )


def schedule_action(page: Page, action: str) -> Response:
    if action not in SCHEDULE_ACTIONS:
        raise NotFound()
    name = page.request.form.get("schedule", "")
    admin = page.admin
    actor = page.actor()
    try:
        if action == "pause":
            if admin.pause_schedule(name, actor=actor, source="dashboard"):
                page.flash(
                    f"Schedule {name} paused: its ticks are dropped until it is resumed.", "ok"
                )
            else:
                page.flash(f"Schedule {name} was paused already.", "ok")
        elif action == "resume":
            if admin.resume_schedule(name, actor=actor, source="dashboard"):
                page.flash(f"Schedule {name} resumed from its next tick.", "ok")
            else:
                page.flash(f"Schedule {name} was not paused.", "ok")
        else:
            job_id = admin.run_schedule_now(name, actor=actor, source="dashboard")
            page.flash(f"Schedule {name} run now as job {job_id}.", "ok")
    except ScheduleNotFound as exc:
        page.flash(str(exc), "error")
    except ValidationError as exc:
        raise BadRequest(description=str(exc)) from None
    return page.redirect("schedule_list")


def audit_list(page: Page) -> Response:
    raw = page.request.args.get("before") or None
    before = None
    if raw is not None:
        try:
            before = int(raw)
        except ValueError:
            raise BadRequest(
                description=f"before must be an audit record id, got {raw!r}"
            ) from None
        if not 0 <= before <= MAX_JOB_ID:
            raise BadRequest(
                description=f"before must be an audit record id from 0 to {MAX_JOB_ID}, "
                f"got {before}"
            )
    found = page.admin.audit_log(limit=AUDIT_PAGE_SIZE, before=before)
    return page.render(
        "pgqueue/audit.html",
        entries=found.entries,
        first_page=before is None,
        older_url=None if found.older is None else page.url_for("audit_list", before=found.older),
    )


def audit_details(entry: AuditEntry) -> str:
    """What the record says beyond the job, schedule, queue or key prefix it names (a bulk
    action's filter, a new ``run_at``, priority or limit), as compact JSON; empty when
    nothing."""
    named = {"job_id", "schedule"}
    if entry.queue is not None or entry.key_prefix is not None:
        named |= {"queue", "key_prefix"}
    rest = {k: v for k, v in entry.target.items() if k not in named}
    if not rest:
        return ""
    return json.dumps(rest, sort_keys=True, default=str, ensure_ascii=False)


RULES: Final = [
    Rule("/schedules", endpoint="schedule_list", methods=["GET"]),
    Rule("/schedules/<action>", endpoint="schedule_action", methods=["POST"]),
    Rule("/audit", endpoint="audit_list", methods=["GET"]),
]
VIEWS: Final[dict[str, Callable[..., Response]]] = {
    "schedule_list": schedule_list,
    "schedule_action": schedule_action,
    "audit_list": audit_list,
}
HELPERS: Final[dict[str, Any]] = {"audit_details": audit_details}
