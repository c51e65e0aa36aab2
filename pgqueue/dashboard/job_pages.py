"""The dashboard's job pages: the job list with its search form, one job's page (arguments,
result, attempts timeline, errors, explain, progress, steps, signals), and the actions on one
job (retry, cancel, delete, run now, reschedule, priority, signal).

Every action goes through ``pgq.admin`` with this request's actor and ``source="dashboard"``,
so each writes its audit record; a refusal (the job's state does not allow it) comes back as a
message on the job's page, and bad input as a 400 re-showing the page with the problem.
``RULES``, ``VIEWS`` and ``HELPERS`` are what the core routes to and renders with.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final

from werkzeug.exceptions import BadRequest, NotFound
from werkzeug.routing import Rule
from werkzeug.wrappers import Response

from pgqueue.admin import MAX_JOB_ID, JobSignals
from pgqueue.dashboard.job_display import folded_errors
from pgqueue.dashboard.job_search_form import SearchForm, local_input, parse_moment
from pgqueue.dashboard.page import Page
from pgqueue.dashboard.tracebacks import traceback_parts
from pgqueue.errors import JobNotFound, PgQueueError, ValidationError
from pgqueue.models import Job
from pgqueue.states import FINAL_STATES, JobState, WorkflowRole

PAGE_SIZE: Final = 50
# A job that has not started: its run_at and priority may still change.
NOT_STARTED: Final = frozenset({JobState.QUEUED, JobState.RETRYING, JobState.WAITING})
ACTIONS: Final = ("retry", "cancel", "delete", "run_now", "reschedule", "priority", "signal")


class FormProblem(Exception):
    """Bad input in an action's form: answered 400 with the job's page and this message."""


def _cursor(page: Page, name: str) -> int | None:
    """A job id from the query string (a paging cursor); None when absent or empty."""
    raw = page.request.args.get(name) or None
    if raw is None:
        return None
    try:
        value = int(raw)
    except ValueError:
        raise BadRequest(description=f"{name} must be a job id, got {raw!r:.80}") from None
    if not 0 <= value <= MAX_JOB_ID:
        raise BadRequest(description=f"{name} must be a job id from 0 to {MAX_JOB_ID}, got {value}")
    return value


def job_list(page: Page) -> Response:
    args = page.request.args
    form = SearchForm.read(args)
    before = _cursor(page, "before")
    after = _cursor(page, "after") if before is None else None
    limit = min(max(args.get("limit", PAGE_SIZE, type=int), 1), 500)
    admin = page.admin
    context: dict[str, Any] = {
        "form": form,
        "filters": form.values,
        "queues": admin.queue_names(),
        "task_names": page.queue.registry.names(),
        "jobs": (),
        "search": None,
        "newer_url": None,
        "older_url": None,
    }
    try:
        form.check(dt.datetime.now(dt.UTC))
        if "job_id" in form.arguments:
            before = after = None  # one job: no page beside it
        found = admin.list_jobs(**form.arguments, before=before, after=after, limit=limit)
    except ValidationError as exc:
        return page.render("pgqueue/jobs.html", status=400, error=str(exc), **context)
    values = form.values
    context.update(
        jobs=found.jobs,
        search=found.search,
        newer_url=None
        if found.newer is None
        else page.url_for("job_list", after=found.newer, **values),
        older_url=None
        if found.older is None
        else page.url_for("job_list", before=found.older, **values),
    )
    return page.render("pgqueue/jobs.html", error=None, **context)


@dataclass(frozen=True, slots=True)
class Moment:
    """One line of a job's attempts timeline; ``at`` None when its record has no readable
    time."""

    at: dt.datetime | None
    what: str
    detail: str = ""
    failed: bool = False


def timeline(job: Job) -> list[Moment]:
    """What is known of a job's life, in order: created, each failed attempt's end (its error),
    the latest attempt's start, and its end. Earlier attempts' starts are not recorded."""
    moments = [Moment(job.created_at, "created", f"queue {job.queue}, priority {job.priority}")]
    for entry in job.errors or []:
        text = str(entry.get("error") or "").strip()
        moments.append(
            Moment(
                _recorded_time(entry.get("at")),
                f"attempt {entry.get('attempt')} failed",
                text.split("\n")[-1] if text else "",
                True,
            )
        )
    if job.started_at is not None:
        moments.append(Moment(job.started_at, f"attempt {job.attempts} started"))
    if job.finished_at is not None:
        moments.append(
            Moment(job.finished_at, job.state.value, failed=job.state is JobState.FAILED)
        )
    latest = dt.datetime.max.replace(tzinfo=dt.UTC)
    return sorted(moments, key=lambda moment: moment.at or latest)


def _recorded_time(value: object) -> dt.datetime | None:
    """An error record's ``at`` (ISO text in its JSON) as an aware datetime."""
    if not isinstance(value, str):
        return None
    try:
        parsed = dt.datetime.fromisoformat(value)
    except ValueError:
        return None
    return parsed if parsed.tzinfo is not None else parsed.replace(tzinfo=dt.UTC)


def job_detail(page: Page, job_id: int, problem: str | None = None, status: int = 200) -> Response:
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
    signals = admin.job_signals(job_id)
    # A workflow's jobs (but its on_failure job) are acted on through their workflow's page.
    by_workflow = job.workflow_id is not None and job.workflow_role != WorkflowRole.ON_FAILURE
    closing = job.workflow_role == WorkflowRole.CLOSING
    not_started = job.state in NOT_STARTED and not closing
    return page.render(
        "pgqueue/job.html",
        status=status,
        problem=problem,
        job=job,
        holder=holder,
        explanation=explanation,
        final=final,
        by_workflow=by_workflow,
        signals=signals,
        moments=timeline(job),
        can_retry=not by_workflow and job.state in {JobState.FAILED, JobState.CANCELLED},
        can_cancel=not by_workflow
        and job.state in {JobState.QUEUED, JobState.RETRYING, JobState.RUNNING},
        can_delete=not by_workflow and job.state is not JobState.RUNNING,
        can_reschedule=not_started and not signals.suspended,
        can_prioritize=not_started,
        can_signal=not final and not closing,
        run_at_value=local_input(job.run_at) if job.run_at is not None else "",
        error_runs=folded_errors(job.errors or []),
    )


def job_action(page: Page, job_id: int, action: str) -> Response:
    if action not in ACTIONS:
        raise NotFound()
    if job_id > MAX_JOB_ID:
        raise NotFound(description=f"no job with id {job_id}")
    try:
        return _act(page, job_id, action)
    except (FormProblem, ValidationError) as exc:
        return job_detail(page, job_id, problem=str(exc), status=400)
    except JobNotFound:
        page.flash(f"Job {job_id} no longer exists.", "error")
        return page.redirect("job_list")
    except PgQueueError as exc:
        page.flash(str(exc), "error")
        return page.redirect("job_detail", job_id=job_id)


def _act(page: Page, job_id: int, action: str) -> Response:
    """Carry out ``action``; the flash and redirect of its success."""
    admin = page.admin
    form = page.request.form
    # Each action writes its audit record, naming who took it, in its own transaction.
    actor = page.actor()
    back = page.redirect("job_detail", job_id=job_id)
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
    elif action == "delete":
        if not admin.delete_job(job_id, actor=actor, source="dashboard"):
            page.flash(f"Job {job_id} was not deleted (it is running, or already gone).", "error")
            return back
        page.flash(f"Job {job_id} deleted.", "ok")
        return page.redirect("job_list")
    elif action == "run_now":
        written = admin.run_now(job_id, actor=actor, source="dashboard")
        page.flash(f"Job {job_id} may run now ({_utc(written)}).", "ok")
    elif action == "reschedule":
        text = form.get("run_at", "").strip()
        if not text:
            raise FormProblem("run_at is empty: give a date and time in UTC")
        written = admin.reschedule(
            job_id, parse_moment(text, "run_at"), actor=actor, source="dashboard"
        )
        page.flash(f"Job {job_id} rescheduled to {_utc(written)}.", "ok")
    elif action == "priority":
        priority = _whole_number(form.get("priority", ""), "priority")
        admin.set_priority(job_id, priority, actor=actor, source="dashboard")
        page.flash(f"Job {job_id} now has priority {priority}.", "ok")
    else:
        name = form.get("name", "").strip()
        payload = _json_payload(form.get("payload", ""))
        if admin.signal(job_id, name, payload, actor=actor, source="dashboard"):
            page.flash(f"Signal {name!r} sent to job {job_id}.", "ok")
        else:
            page.flash(
                f"Job {job_id} already has a signal {name!r}: the first one is kept, this one "
                "was not stored.",
                "error",
            )
    return back


def _utc(moment: dt.datetime) -> str:
    return moment.astimezone(dt.UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def _whole_number(raw: str, label: str) -> int:
    text = raw.strip()
    try:
        return int(text)
    except ValueError:
        raise FormProblem(f"{label} must be a whole number, got {text[:40]!r}") from None


def _json_payload(raw: str) -> Any:
    """The signal's payload typed into the form: JSON, or nothing for null."""
    text = raw.strip()
    if not text:
        return None
    try:
        return json.loads(text)
    except (json.JSONDecodeError, RecursionError) as exc:
        raise FormProblem(
            f'payload is not JSON ({exc}): quote a string, as in "text", or leave it empty'
        ) from None


def signal_state(signals: JobSignals) -> str:
    """What a suspended job waits for, in one line; empty when it is not suspended."""
    if not signals.suspended:
        return ""
    until = "" if signals.wake_at is None else f" until {_utc(signals.wake_at)}"
    if signals.waiting_for is None:
        return f"sleeping{until}"
    arrived = " (it has arrived: the job resumes)" if signals.arrived else ""
    return f"waiting for signal {signals.waiting_for!r}{until}{arrived}"


RULES: Final = [
    Rule("/jobs", endpoint="job_list", methods=["GET"]),
    Rule("/jobs/<int:job_id>", endpoint="job_detail", methods=["GET"]),
    Rule("/jobs/<int:job_id>/<action>", endpoint="job_action", methods=["POST"]),
]
VIEWS: Final[dict[str, Callable[..., Response]]] = {
    "job_list": job_list,
    "job_detail": job_detail,
    "job_action": job_action,
}
HELPERS: Final = {"traceback_parts": traceback_parts, "signal_state": signal_state}
