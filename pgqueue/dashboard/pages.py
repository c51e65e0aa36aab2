"""The dashboard's pages: overview, job list, job detail and its actions; with the formatting
helpers every template uses (queues and workers are ``queue_pages``').

Each view takes the request's :class:`~pgqueue.dashboard.page.Page` and returns a response;
``RULES`` and ``VIEWS`` are what the core routes to them.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Callable
from typing import Any, Final

from werkzeug.exceptions import BadRequest, NotFound
from werkzeug.routing import Rule
from werkzeug.wrappers import Response

from pgqueue.admin import DEFAULT_COUNT_CAP, MAX_JOB_ID
from pgqueue.dashboard.job_display import duration, error_summary, error_tooltip, folded_errors
from pgqueue.dashboard.page import Page, text_arg
from pgqueue.dashboard.queue_charts import failure_chart, wait_chart
from pgqueue.dashboard.throughput_chart import chart, coarsened, total_series
from pgqueue.errors import PgQueueError
from pgqueue.states import FINAL_STATES, JobState, WorkflowRole

PAGE_SIZE: Final = 50
# Counts on the overview stop here ("1,000+"): each reads at most this many index entries, so
# the page costs the same however much history the jobs table holds.
COUNT_CAP: Final = DEFAULT_COUNT_CAP
STATES: Final = list(JobState)


def overview(page: Page) -> Response:
    admin = page.admin
    counts = admin.capped_counts(COUNT_CAP)
    oldest = admin.oldest_waiting()
    cap = page.throughput_cap()
    throughput = coarsened(admin.recent_throughput(cap))
    waits = admin.recent_wait_times(throughput.window, throughput.width, cap)
    settings = admin.queue_settings()
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


def _job_id_arg(page: Page, name: str) -> int | None:
    """A job id from the query string (a paging cursor); None when absent or empty."""
    raw = page.request.args.get(name) or None
    if raw is None:
        return None
    try:
        value = int(raw)
    except ValueError:
        raise BadRequest(description=f"{name} must be a job id, got {raw!r}") from None
    if not 0 <= value <= MAX_JOB_ID:
        raise BadRequest(description=f"{name} must be a job id from 0 to {MAX_JOB_ID}, got {value}")
    return value


def job_list(page: Page) -> Response:
    args = page.request.args
    queue_name = text_arg(args, "queue")
    state_name = text_arg(args, "state")
    task_name = text_arg(args, "task")
    state = None
    if state_name is not None:
        try:
            state = JobState(state_name)
        except ValueError:
            raise BadRequest(description=f"unknown state {state_name!r}") from None
    before = _job_id_arg(page, "before")
    after = _job_id_arg(page, "after") if before is None else None
    limit = min(max(args.get("limit", PAGE_SIZE, type=int), 1), 500)
    admin = page.admin
    queues = admin.queue_names()
    found = admin.list_jobs(
        queue=queue_name,
        state=state,
        task_name=task_name,
        before=before,
        after=after,
        limit=limit,
    )
    filters: dict[str, Any] = {
        k: v for k, v in (("queue", queue_name), ("state", state_name), ("task", task_name)) if v
    }
    return page.render(
        "pgqueue/jobs.html",
        jobs=found.jobs,
        filters=filters,
        queues=queues,
        task_names=page.queue.registry.names(),
        newer_url=None
        if found.newer is None
        else page.url_for("job_list", after=found.newer, **filters),
        older_url=None
        if found.older is None
        else page.url_for("job_list", before=found.older, **filters),
    )


def job_detail(page: Page, job_id: int) -> Response:
    if job_id > MAX_JOB_ID:
        raise NotFound(description=f"no job with id {job_id}")
    admin = page.admin
    try:
        job = admin.get_job(job_id)
    except PgQueueError:
        raise NotFound(description=f"no job with id {job_id}") from None
    holder = admin.job_holder(job_id) if job.state is JobState.RUNNING else None
    final = job.state in FINAL_STATES
    try:
        explanation = None if final else admin.explain_job(job_id)
    except PgQueueError:  # deleted between the two reads
        raise NotFound(description=f"no job with id {job_id}") from None
    # A workflow's jobs (but its on_failure job) are acted on through their workflow's page.
    by_workflow = job.workflow_id is not None and job.workflow_role != WorkflowRole.ON_FAILURE
    return page.render(
        "pgqueue/job.html",
        job=job,
        holder=holder,
        explanation=explanation,
        final=final,
        by_workflow=by_workflow,
        can_retry=not by_workflow and job.state in {JobState.FAILED, JobState.CANCELLED},
        can_cancel=not by_workflow
        and job.state in {JobState.QUEUED, JobState.RETRYING, JobState.RUNNING},
        can_delete=not by_workflow and job.state is not JobState.RUNNING,
        error_runs=folded_errors(job.errors or []),
    )


def job_action(page: Page, job_id: int, action: str) -> Response:
    admin = page.admin
    back = page.redirect("job_detail", job_id=job_id)
    if action not in {"retry", "cancel", "delete"}:
        raise NotFound()
    # Each action writes its audit record, naming who took it, in its own transaction.
    actor = page.actor()
    try:
        if action == "retry":
            admin.retry_job(job_id, actor=actor, source="dashboard")
            page.flash(f"Job {job_id} queued again.", "ok")
        elif action == "cancel":
            state = admin.cancel_job(job_id, actor=actor, source="dashboard")
            page.flash(
                f"Job {job_id} cancelled."
                if state is JobState.CANCELLED
                else f"Cancellation of running job {job_id} requested.",
                "ok",
            )
        else:
            if not admin.delete_job(job_id, actor=actor, source="dashboard"):
                page.flash(
                    f"Job {job_id} was not deleted (it is running, or already gone).", "error"
                )
                return back
            page.flash(f"Job {job_id} deleted.", "ok")
            return page.redirect("job_list")
    except PgQueueError as exc:
        page.flash(str(exc), "error")
    return back


RULES: Final = [
    Rule("/", endpoint="overview", methods=["GET"]),
    Rule("/jobs", endpoint="job_list", methods=["GET"]),
    Rule("/jobs/<int:job_id>", endpoint="job_detail", methods=["GET"]),
    Rule("/jobs/<int:job_id>/<action>", endpoint="job_action", methods=["POST"]),
]
VIEWS: Final[dict[str, Callable[..., Response]]] = {
    "overview": overview,
    "job_list": job_list,
    "job_detail": job_detail,
    "job_action": job_action,
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
