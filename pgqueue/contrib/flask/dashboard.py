"""A server-rendered dashboard for the app's queue: overview, job list, job detail, queue
controls, actions, and the running workers.

``init_dashboard(app, access=...)`` mounts a blueprint (default under ``/pgqueue``). Pages are
plain Jinja templates and forms, so everything works without JavaScript; the throughput chart
is inline SVG drawn on the server (``throughput_chart``). Every request passes the ``access``
callable first (falsy -> 403; it may also ``abort()`` with its own response, e.g. a 401 asking
for credentials). Registration without ``access`` is refused unless ``public=True`` says the
dashboard is meant to be open.

Actions (retry, cancel, delete; in bulk by filter, see ``_bulk_views``; pause, resume and limit
a queue on the Queues page) are POST forms carrying a CSRF token bound to the Flask session; a
POST without the matching token is rejected with 400 before anything runs.
"""

from __future__ import annotations

import datetime as dt
import hmac
import json
import secrets
from collections.abc import Callable
from typing import Any, Final

from flask import (
    Blueprint,
    Flask,
    abort,
    current_app,
    flash,
    redirect,
    render_template,
    request,
    session,
    url_for,
)
from werkzeug.wrappers import Response

from pgqueue.admin import (
    DEFAULT_COUNT_CAP,
    DEFAULT_THROUGHPUT_CAP,
    MAX_JOB_ID,
    Admin,
    QueueSettings,
)
from pgqueue.contrib.flask import _bulk_views as bulk_views
from pgqueue.contrib.flask import _workflow_view as workflow_view
from pgqueue.contrib.flask import get_state
from pgqueue.contrib.flask.job_display import (
    duration,
    error_summary,
    error_tooltip,
    folded_errors,
)
from pgqueue.contrib.flask.throughput_chart import chart, coarsened, total_series
from pgqueue.errors import ConfigurationError, PgQueueError, ValidationError
from pgqueue.states import FINAL_STATES, JobState, WorkflowRole

BLUEPRINT_NAME: Final = "pgqueue_dashboard"
CSRF_SESSION_KEY: Final = "_pgqueue_csrf"
CSRF_FIELD: Final = "csrf_token"
PAGE_SIZE: Final = 50
# Counts on the overview stop here ("1,000+"): each reads at most this many index entries, so
# the page costs the same however much history the jobs table holds.
COUNT_CAP: Final = DEFAULT_COUNT_CAP
STATES: Final = list(JobState)
# Config key: how many finished jobs the throughput chart may read (see Admin.recent_throughput).
THROUGHPUT_CAP_KEY: Final = "PGQUEUE_DASHBOARD_THROUGHPUT_CAP"
# A queue limit is a Postgres integer; anything above it cannot be stored.
MAX_QUEUE_LIMIT: Final = 2**31 - 1
CONTENT_SECURITY_POLICY: Final = "; ".join(
    [
        "default-src 'none'",
        "style-src 'self'",
        "img-src 'self'",
        "form-action 'self'",
        "base-uri 'none'",
        "frame-ancestors 'none'",
    ]
)
SECURITY_HEADERS: Final = {
    "Content-Security-Policy": CONTENT_SECURITY_POLICY,
    "X-Frame-Options": "DENY",
    "X-Content-Type-Options": "nosniff",
    "Cache-Control": "no-store",
    "Referrer-Policy": "same-origin",
}


def init_dashboard(
    app: Flask,
    url_prefix: str = "/pgqueue",
    access: Callable[[], Any] | None = None,
    public: bool = False,
    actor: Callable[[], str] | None = None,
) -> Blueprint:
    """Mount the dashboard on ``app`` (which must have the pgqueue extension) and return its
    blueprint. ``access`` is called on every dashboard request; ``public=True`` is required to
    mount it without one. ``actor`` names who takes a bulk action, for its audit record (called
    per action, e.g. returning the logged-in user's name; default: ``"dashboard"``)."""
    if access is None and not public:
        raise ConfigurationError(
            "init_dashboard needs access= (a callable deciding per request, e.g. checking the "
            "logged-in user); pass public=True to mount the dashboard without any check"
        )
    if access is not None and not callable(access):
        raise ConfigurationError(f"access must be a callable, got {access!r}")
    if actor is not None and not callable(actor):
        raise ConfigurationError(f"actor must be a callable, got {actor!r}")
    try:
        get_state(app)
    except RuntimeError:
        raise ConfigurationError("call pgq.init_app(app) before init_dashboard(app)") from None
    if not app.secret_key:
        raise ConfigurationError(
            "the dashboard's CSRF protection needs app.secret_key (SECRET_KEY)"
        )
    cap = app.config.get(THROUGHPUT_CAP_KEY, DEFAULT_THROUGHPUT_CAP)
    if not isinstance(cap, int) or isinstance(cap, bool) or cap < 1:
        raise ConfigurationError(f"{THROUGHPUT_CAP_KEY} must be a positive int, got {cap!r}")
    blueprint = _blueprint(access)
    bulk_views.register(blueprint, actor or _dashboard_actor)
    workflow_view.register(blueprint)
    app.register_blueprint(blueprint, url_prefix=url_prefix)
    return blueprint


def _blueprint(access: Callable[[], Any] | None) -> Blueprint:
    bp = Blueprint(
        BLUEPRINT_NAME,
        __name__,
        template_folder="templates",
        static_folder="static",
        static_url_path="/static",
    )

    @bp.before_request
    def guard() -> None:
        if access is not None and not access():
            abort(403)
        if request.method == "POST":
            expected = session.get(CSRF_SESSION_KEY)
            given = request.form.get(CSRF_FIELD, "")
            # As bytes: compare_digest refuses str holding non-ASCII characters (TypeError,
            # a 500), and a forged token may hold anything.
            if not expected or not hmac.compare_digest(
                str(expected).encode("utf-8"), given.encode("utf-8", "surrogatepass")
            ):
                abort(400, description="CSRF token missing or invalid")

    @bp.after_request
    def security_headers(response: Response) -> Response:
        # Pages show job arguments and carry one-click action forms: never framed (no
        # clickjacking), never cached, no content sniffing, and nothing but the dashboard's own
        # stylesheet may load or run (the templates need no script at all).
        response.headers.update(SECURITY_HEADERS)
        return response

    @bp.context_processor
    def helpers() -> dict[str, Any]:
        return {
            "csrf_token": _csrf_token,
            "age": _age,
            "timestamp": _timestamp,
            "pretty_json": _pretty_json,
            "states": STATES,
            "count": _count,
            "duration": duration,
            "error_summary": error_summary,
            "error_tooltip": error_tooltip,
        }

    bp.add_url_rule("/", view_func=overview)
    bp.add_url_rule("/jobs", view_func=job_list)
    bp.add_url_rule("/jobs/<int:job_id>", view_func=job_detail)
    bp.add_url_rule("/jobs/<int:job_id>/<action>", view_func=job_action, methods=["POST"])
    bp.add_url_rule("/queues", view_func=queue_list)
    bp.add_url_rule("/queues/<action>", view_func=queue_action, methods=["POST"])
    bp.add_url_rule("/workers", view_func=worker_list)
    return bp


def _dashboard_actor() -> str:
    return "dashboard"


def _admin() -> Admin:
    return get_state().queue.admin


def _text_arg(name: str) -> str | None:
    """A text filter from the query string; None when absent or empty."""
    value = request.args.get(name) or None
    if value is not None and "\x00" in value:
        abort(400, description=f"{name} must not contain a NUL character")
    return value


def _job_id_arg(name: str) -> int | None:
    """A job id from the query string (a paging cursor); None when absent or empty."""
    raw = request.args.get(name) or None
    if raw is None:
        return None
    try:
        value = int(raw)
    except ValueError:
        abort(400, description=f"{name} must be a job id, got {raw!r}")
    if not 0 <= value <= MAX_JOB_ID:
        abort(400, description=f"{name} must be a job id from 0 to {MAX_JOB_ID}, got {value}")
    return value


def _csrf_token() -> str:
    token = session.get(CSRF_SESSION_KEY)
    if not token:
        token = secrets.token_urlsafe(32)
        session[CSRF_SESSION_KEY] = token
    return str(token)


# -- views ------------------------------------------------------------------------------------


def overview() -> str:
    admin = _admin()
    counts = admin.capped_counts(COUNT_CAP)
    oldest = admin.oldest_waiting()
    cap = current_app.config.get(THROUGHPUT_CAP_KEY, DEFAULT_THROUGHPUT_CAP)
    throughput = coarsened(admin.recent_throughput(cap))
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
    return render_template(
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


def job_list() -> str:
    queue_name = _text_arg("queue")
    state_name = _text_arg("state")
    task_name = _text_arg("task")
    state = None
    if state_name is not None:
        try:
            state = JobState(state_name)
        except ValueError:
            abort(400, description=f"unknown state {state_name!r}")
    before = _job_id_arg("before")
    after = _job_id_arg("after") if before is None else None
    limit = min(max(request.args.get("limit", PAGE_SIZE, type=int), 1), 500)
    admin = _admin()
    queues = admin.queue_names()
    page = admin.list_jobs(
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
    return render_template(
        "pgqueue/jobs.html",
        jobs=page.jobs,
        filters=filters,
        queues=queues,
        task_names=sorted(get_state().tasks),
        newer_url=None if page.newer is None else url_for(".job_list", after=page.newer, **filters),
        older_url=None
        if page.older is None
        else url_for(".job_list", before=page.older, **filters),
    )


def job_detail(job_id: int) -> str:
    if job_id > MAX_JOB_ID:
        abort(404, description=f"no job with id {job_id}")
    try:
        job = _admin().get_job(job_id)
    except PgQueueError:
        abort(404, description=f"no job with id {job_id}")
    holder = _admin().job_holder(job_id) if job.state is JobState.RUNNING else None
    final = job.state in FINAL_STATES
    try:
        explanation = None if final else _admin().explain_job(job_id)
    except PgQueueError:  # deleted between the two reads
        abort(404, description=f"no job with id {job_id}")
    # A workflow's jobs (but its on_failure job) are acted on through their workflow's page.
    by_workflow = job.workflow_id is not None and job.workflow_role != WorkflowRole.ON_FAILURE
    return render_template(
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


def job_action(job_id: int, action: str) -> Response:
    admin = _admin()
    back = redirect(url_for(".job_detail", job_id=job_id))
    try:
        if action == "retry":
            admin.retry_job(job_id)
            flash(f"Job {job_id} queued again.", "ok")
        elif action == "cancel":
            state = admin.cancel_job(job_id)
            flash(
                f"Job {job_id} cancelled."
                if state is JobState.CANCELLED
                else f"Cancellation of running job {job_id} requested.",
                "ok",
            )
        elif action == "delete":
            if not admin.delete_job(job_id):
                flash(f"Job {job_id} was not deleted (it is running, or already gone).", "error")
                return back
            flash(f"Job {job_id} deleted.", "ok")
            return redirect(url_for(".job_list"))
        else:
            abort(404)
    except PgQueueError as exc:
        flash(str(exc), "error")
    return back


def queue_list(error: str | None = None, status: int = 200) -> tuple[str, int]:
    admin = _admin()
    settings = admin.queue_settings()
    names = set(admin.queue_names()) | set(settings)
    names |= {task.queue for task in get_state().tasks.values()}
    queues = [settings.get(name) or QueueSettings(name, False, None, 0) for name in sorted(names)]
    page = render_template(
        "pgqueue/queues.html",
        queues=queues,
        key_overrides=admin.key_overrides(),
        error=error,
        max_limit=MAX_QUEUE_LIMIT,
    )
    return page, status


def queue_action(action: str) -> Response | tuple[str, int]:
    admin = _admin()
    name = request.form.get("queue", "")
    try:
        if action == "pause":
            admin.pause_queue(name)
            flash(f"Queue {name} paused: workers claim none of its jobs until resumed.", "ok")
        elif action == "resume":
            admin.resume_queue(name)
            flash(f"Queue {name} resumed.", "ok")
        elif action == "limit":
            limit = _queue_limit(request.form.get("limit", ""))
            if isinstance(limit, str):
                return queue_list(error=f"Queue {name}: {limit}", status=400)
            admin.set_queue_limit(name, limit)
            flash(f"Queue {name}: at most {limit:,} of its jobs run at once.", "ok")
        elif action == "unlimit":
            admin.set_queue_limit(name, None)
            flash(f"Queue {name}: limit removed.", "ok")
        else:
            abort(404)
    except ValidationError as exc:
        return queue_list(error=str(exc), status=400)
    return redirect(url_for(".queue_list"))


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


def worker_list() -> str:
    admin = _admin()
    return render_template(
        "pgqueue/workers.html",
        workers=admin.list_workers(include_stale=True),
        stale_seconds=get_state().queue.settings.worker_stale_seconds,
    )


# -- formatting -------------------------------------------------------------------------------


def _age(seconds: float) -> str:
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


def _count(value: int, at_least: bool = False) -> str:
    """``123``; ``1,000+`` for a count that stopped at ``COUNT_CAP``."""
    return f"{value:,}+" if at_least or value >= COUNT_CAP else f"{value:,}"


def _timestamp(value: dt.datetime | None) -> str:
    if value is None:
        return ""
    return value.astimezone(dt.UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def _pretty_json(value: Any) -> str:
    return json.dumps(value, indent=2, sort_keys=True, default=str, ensure_ascii=False)
