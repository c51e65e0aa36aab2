"""A server-rendered dashboard for the app's queue: overview, job list, job detail, actions, and
the running workers.

``init_dashboard(app, access=...)`` mounts a blueprint (default under ``/pgqueue``). Pages are
plain Jinja templates and forms, so everything works without JavaScript; the per-minute chart
is inline SVG. Every request passes the ``access`` callable first (falsy -> 403; it may also
``abort()`` with its own response, e.g. a 401 asking for credentials). Registration without
``access`` is refused unless ``public=True`` says the dashboard is meant to be open.

Actions (retry, cancel, delete) are POST forms carrying a CSRF token bound to the Flask session;
a POST without the matching token is rejected with 400 before anything runs.
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
    flash,
    redirect,
    render_template,
    request,
    session,
    url_for,
)
from werkzeug.wrappers import Response

from pgqueue.admin import DEFAULT_COUNT_CAP, MAX_JOB_ID, Admin
from pgqueue.contrib.flask import get_state
from pgqueue.errors import ConfigurationError, PgQueueError
from pgqueue.states import FINAL_STATES, JobState

__all__ = ["init_dashboard"]

BLUEPRINT_NAME: Final = "pgqueue_dashboard"
CSRF_SESSION_KEY: Final = "_pgqueue_csrf"
CSRF_FIELD: Final = "csrf_token"
PAGE_SIZE: Final = 50
# Counts on the overview stop here ("1,000+"): each reads at most this many index entries, so
# the page costs the same however much history the jobs table holds.
COUNT_CAP: Final = DEFAULT_COUNT_CAP
STATES: Final = list(JobState)
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
) -> Blueprint:
    """Mount the dashboard on ``app`` (which must have the pgqueue extension) and return its
    blueprint. ``access`` is called on every dashboard request; ``public=True`` is required to
    mount it without one."""
    if access is None and not public:
        raise ConfigurationError(
            "init_dashboard needs access= (a callable deciding per request, e.g. checking the "
            "logged-in user); pass public=True to mount the dashboard without any check"
        )
    if access is not None and not callable(access):
        raise ConfigurationError(f"access must be a callable, got {access!r}")
    try:
        get_state(app)
    except RuntimeError:
        raise ConfigurationError("call pgq.init_app(app) before init_dashboard(app)") from None
    if not app.secret_key:
        raise ConfigurationError(
            "the dashboard's CSRF protection needs app.secret_key (SECRET_KEY)"
        )
    blueprint = _blueprint(access)
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
        }

    bp.add_url_rule("/", view_func=overview)
    bp.add_url_rule("/jobs", view_func=job_list)
    bp.add_url_rule("/jobs/<int:job_id>", view_func=job_detail)
    bp.add_url_rule("/jobs/<int:job_id>/<action>", view_func=job_action, methods=["POST"])
    bp.add_url_rule("/workers", view_func=worker_list)
    return bp


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
    series = admin.throughput()
    names = sorted(set(counts) | set(oldest) | set(series))
    rows: list[dict[str, Any]] = []
    for name in names:
        by_state = counts.get(name, {})
        per_minute = series.get(name, {})
        succeeded = per_minute.get(JobState.SUCCEEDED, [0] * 60)
        failed = per_minute.get(JobState.FAILED, [0] * 60)
        rows.append(
            {
                "name": name,
                "counts": {s: by_state.get(s, 0) for s in STATES},
                "oldest": oldest.get(name),
                "chart": _chart(succeeded, failed),
                "done_last_hour": sum(succeeded) + sum(failed),
            }
        )
    totals = {s: sum(r["counts"][s] for r in rows) for s in STATES}
    capped = {s: any(r["counts"][s] >= COUNT_CAP for r in rows) for s in STATES}
    return render_template(
        "pgqueue/overview.html", rows=rows, totals=totals, capped=capped, cap=COUNT_CAP
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
    return render_template(
        "pgqueue/job.html",
        job=job,
        holder=holder,
        final=job.state in FINAL_STATES,
        can_retry=job.state in {JobState.FAILED, JobState.CANCELLED},
        can_cancel=job.state in {JobState.QUEUED, JobState.RETRYING, JobState.RUNNING},
        can_delete=job.state is not JobState.RUNNING,
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


def _chart(succeeded: list[int], failed: list[int]) -> dict[str, Any]:
    """Bars for the last hour, oldest minute on the left: SVG geometry for the template."""
    width, height, bar = 180, 36, 3
    peak = max([s + f for s, f in zip(succeeded, failed, strict=True)] + [1])
    bars = []
    for index in range(60):
        minutes_ago = 59 - index
        ok, bad = succeeded[minutes_ago], failed[minutes_ago]
        ok_h = round(height * ok / peak, 1)
        bad_h = round(height * bad / peak, 1)
        bars.append(
            {
                "x": index * bar,
                "ok_y": height - ok_h,
                "ok_h": ok_h,
                "bad_y": height - ok_h - bad_h,
                "bad_h": bad_h,
                "title": f"{minutes_ago} min ago: {ok} succeeded, {bad} failed",
            }
        )
    return {"width": width, "height": height, "bar": bar - 0.5, "bars": bars, "peak": peak}
