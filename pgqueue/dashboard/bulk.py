"""The dashboard's bulk actions: retry, cancel or delete the jobs a filter chooses, in two steps.

The job list carries a form (``_bulk.html``) with the list's filters plus a time range and error
text. "Preview" posts it here and shows how many jobs the action would change; "Confirm" posts
the same filter with that count, and the action runs only if it still matches exactly that many
jobs (otherwise nothing changes and the new count is shown for another confirmation). Each
action is recorded with the dashboard's actor (its ``actor=`` callable, else the authenticated
user) and source ``dashboard``. Both steps are POSTs, so the core's CSRF check covers them.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from typing import Any, Final

from werkzeug.datastructures import MultiDict
from werkzeug.routing import Rule
from werkzeug.wrappers import Response

from pgqueue.admin import Admin, BulkAction, BulkResult, JobFilter
from pgqueue.dashboard.page import Page
from pgqueue.errors import BulkCountChanged, InvalidStateTransition, ValidationError
from pgqueue.job_filter import TIME_COLUMNS, parse_states, parse_time

FIELDS: Final = ("queue", "state", "task", "since", "until", "time_column", "error_contains")
_DONE: Final = {
    BulkAction.RETRY: "Retried",
    BulkAction.CANCEL: "Cancelled",
    BulkAction.DELETE: "Deleted",
}


def _form(posted: MultiDict[str, str]) -> dict[str, str]:
    """The filter fields as posted (empty ones left out)."""
    return {name: value for name in FIELDS if (value := posted.get(name, "").strip())}


def _job_filter(form: dict[str, str]) -> JobFilter:
    now = dt.datetime.now(dt.UTC)
    since, until = form.get("since"), form.get("until")
    return JobFilter(
        queue=form.get("queue"),
        task_name=form.get("task"),
        states=parse_states(form.get("state")),
        since=None if since is None else parse_time("since", since, now),
        until=None if until is None else parse_time("until", until, now),
        time_column=form.get("time_column", "created_at"),
        error_contains=form.get("error_contains"),
    )


def _run(admin: Admin, action: BulkAction, job_filter: JobFilter, **options: Any) -> BulkResult:
    act = {
        BulkAction.RETRY: admin.bulk_retry,
        BulkAction.CANCEL: admin.bulk_cancel,
        BulkAction.DELETE: admin.bulk_delete,
    }[action]
    return act(job_filter, source="dashboard", **options)


def bulk_action(page: Page) -> Response:
    posted = page.request.form
    form = _form(posted)
    list_filters: dict[str, Any] = {k: form[k] for k in ("queue", "state", "task") if k in form}
    back = page.url_for("job_list", **list_filters)
    try:
        action = BulkAction(posted.get("action", ""))
    except ValueError:
        return _page(page, form, back, error="Choose retry, cancel or delete.", status=400)
    admin = page.admin
    who = page.actor()
    try:
        job_filter = _job_filter(form)
        if posted.get("step") != "confirm":
            preview = _run(admin, action, job_filter, dry_run=True, actor=who)
            return _page(page, form, back, action=action, count=preview.count, status=200)
        expected = posted.get("expected_count", "")
        if not expected.isdigit():
            return _page(
                page,
                form,
                back,
                error="The confirmation carries no count: preview again.",
                status=400,
            )
        try:
            result = _run(admin, action, job_filter, actor=who, expected_count=int(expected))
        except BulkCountChanged:
            now = _run(admin, action, job_filter, dry_run=True, actor=who).count
            message = (
                f"The matching jobs changed since the preview ({int(expected):,} then, {now:,} "
                f"now): nothing was done. Confirm again to {action.value} {now:,} jobs."
            )
            return _page(page, form, back, action=action, count=now, error=message, status=409)
    except ValidationError as exc:
        return _page(page, form, back, error=str(exc), status=400)
    except InvalidStateTransition as exc:  # a retry that would give a unique key two holders
        return _page(page, form, back, error=str(exc), status=409)
    running = (
        f" ({result.flagged_running:,} running, asked to stop)" if result.flagged_running else ""
    )
    page.flash(
        f"{_DONE[action]} {result.count:,} jobs{running} (audit record {result.audit_id}).", "ok"
    )
    return page.redirect_to(back)


def _page(
    page: Page,
    form: dict[str, str],
    back: str,
    *,
    action: BulkAction | None = None,
    count: int | None = None,
    error: str | None = None,
    status: int = 200,
) -> Response:
    return page.render(
        "pgqueue/bulk.html",
        status=status,
        form=form,
        back=back,
        action=action,
        count=count,
        error=error,
    )


RULES: Final = [Rule("/jobs/bulk", endpoint="bulk_action", methods=["POST"])]
VIEWS: Final[dict[str, Callable[..., Response]]] = {"bulk_action": bulk_action}
HELPERS: Final = {"bulk_actions": [a.value for a in BulkAction], "time_columns": TIME_COLUMNS}
