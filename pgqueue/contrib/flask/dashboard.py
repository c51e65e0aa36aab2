"""The dashboard in a Flask app: ``init_dashboard(app, access=...)`` mounts a blueprint (default
under ``/pgqueue``) that serves :class:`pgqueue.dashboard.Dashboard`, the framework-neutral
core every way of serving the dashboard shares.

The blueprint runs ``access`` in Flask's own request context first (a no-argument callable, as
Flask code expects: it reads ``flask.request`` or the logged-in user; falsy -> 403; it may
``abort()`` with its own response, e.g. a 401 asking for credentials, and the app's error
handlers apply; ``Role.READ_ONLY`` shows the pages and refuses every action). Then it hands the
request's WSGI environ to the core, mounted at the blueprint's prefix. Registration without
``access`` is refused unless ``public=True`` says the dashboard is meant to be open.

Actions are POST forms carrying a CSRF token bound to the dashboard's signed session cookie
(signed with ``app.secret_key``); a POST without the matching token is rejected with 400
before anything runs.
"""

from __future__ import annotations

import io
from collections.abc import Callable
from typing import Any, Final

from flask import Blueprint, Flask, abort, request
from werkzeug.wrappers import Response

from pgqueue.admin import DEFAULT_THROUGHPUT_CAP
from pgqueue.contrib.flask import get_state
from pgqueue.dashboard import Dashboard, DashboardRequest
from pgqueue.dashboard.access import DECISION_KEY, check_options, decided, role_of
from pgqueue.dashboard.app import SECURITY_HEADERS
from pgqueue.errors import ConfigurationError

BLUEPRINT_NAME: Final = "pgqueue_dashboard"
# Config key: how many finished jobs the throughput chart may read (see Admin.recent_throughput).
THROUGHPUT_CAP_KEY: Final = "PGQUEUE_DASHBOARD_THROUGHPUT_CAP"
METHODS: Final = ["GET", "HEAD", "POST"]


def init_dashboard(
    app: Flask,
    url_prefix: str = "/pgqueue",
    access: Callable[[], Any] | None = None,
    public: bool = False,
    actor: Callable[[], str] | None = None,
    read_only: bool = False,
) -> Blueprint:
    """Mount the dashboard on ``app`` (which must have the pgqueue extension) and return its
    blueprint. ``access`` is called on every dashboard request; ``public=True`` is required to
    mount it without one. ``actor`` names who takes an action, for its audit record (called
    per action, e.g. returning the logged-in user's name; default: ``"dashboard"``).
    ``read_only=True`` shows every page and refuses every action."""
    check_options(access, actor, public=public, who="init_dashboard")
    try:
        state = get_state(app)
    except RuntimeError:
        raise ConfigurationError("call pgq.init_app(app) before init_dashboard(app)") from None
    if not app.secret_key:
        raise ConfigurationError(
            "the dashboard's CSRF protection needs app.secret_key (SECRET_KEY)"
        )
    cap = app.config.get(THROUGHPUT_CAP_KEY, DEFAULT_THROUGHPUT_CAP)
    if not isinstance(cap, int) or isinstance(cap, bool) or cap < 1:
        raise ConfigurationError(f"{THROUGHPUT_CAP_KEY} must be a positive int, got {cap!r}")
    core = Dashboard(
        state.queue,
        secret_key=app.secret_key,
        access=decided,
        actor=None if actor is None else _no_argument(actor),
        read_only=read_only,
        # Read per page: the app's config may change after registration.
        throughput_cap=lambda: int(app.config.get(THROUGHPUT_CAP_KEY, DEFAULT_THROUGHPUT_CAP)),
    )
    blueprint = _blueprint(core, access, url_prefix)
    app.register_blueprint(blueprint, url_prefix=url_prefix)
    return blueprint


def _blueprint(core: Dashboard, access: Callable[[], Any] | None, url_prefix: str) -> Blueprint:
    bp = Blueprint(BLUEPRINT_NAME, __name__)
    prefix = url_prefix.rstrip("/")

    def serve(**_values: Any) -> Response:
        # Read before the access check, which may parse the form itself: the core gets the
        # body from this copy, not from a stream the check already consumed.
        body = request.get_data(cache=True) if request.method == "POST" else b""
        role = role_of(access() if access is not None else True)
        if role is None:
            abort(403)
        environ = dict(request.environ)
        if request.method == "POST":
            environ["wsgi.input"] = io.BytesIO(body)
            environ["CONTENT_LENGTH"] = str(len(body))
        environ[DECISION_KEY] = role
        environ["SCRIPT_NAME"] = request.script_root + prefix
        path_info = str(environ.get("PATH_INFO", ""))
        environ["PATH_INFO"] = (
            path_info[len(prefix) :] if path_info.startswith(prefix) else path_info
        )
        return Response.from_app(core, environ)

    @bp.after_request
    def security_headers(response: Response) -> Response:
        # The refusals the blueprint answers itself (403, an access check's 401) too.
        response.headers.update(SECURITY_HEADERS)
        return response

    # The core's own rules, under their names: url_for("pgqueue_dashboard.job_detail",
    # job_id=7) links a host's page to the dashboard's. Each takes every method, so that a
    # wrong one, like an unknown path (the catch-all), is the core's answer after the access
    # check, never Flask's before it.
    for rule in core.url_map.iter_rules():
        bp.add_url_rule(rule.rule, endpoint=rule.endpoint, view_func=serve, methods=METHODS)
    bp.add_url_rule("/<path:path>", endpoint="serve", view_func=serve, methods=METHODS)
    return bp


def _no_argument(actor: Callable[[], str]) -> Callable[[DashboardRequest], str]:
    # Flask code names the user from its request context, which the core runs inside.
    def named(_request: DashboardRequest) -> str:
        return actor()

    return named
