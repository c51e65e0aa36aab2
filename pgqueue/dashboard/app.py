"""The dashboard's core: one WSGI application (Werkzeug routing and responses, Jinja templates)
that every serving layer hands its requests to: Flask's blueprint, the ASGI bridge, and the
standalone server.

Each request is checked in this order: the ``access`` answer (403 when falsy; a
``Role.READ_ONLY`` answer or ``read_only=True`` refuses every POST with 403 and hides the
action forms; only the stylesheet is served before it), then the route (404/405), then, for a POST, the CSRF token: a random value kept
in the dashboard's own signed session cookie and posted back by every form, compared in
constant time (400 when missing or wrong). Only then does the page's view run, and it reaches
the database through ``pgq.admin`` alone.

Every response carries a strict Content-Security-Policy: nothing but the dashboard's own
stylesheet and script (``static/live.js``, which refreshes a page's live fragments from the
same origin) may load, nothing inline runs, and no page may be framed.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Final

from itsdangerous import URLSafeSerializer
from jinja2 import Environment, PackageLoader, select_autoescape
from sqlalchemy.exc import DBAPIError
from werkzeug.exceptions import Forbidden, HTTPException, NotFound, ServiceUnavailable
from werkzeug.routing import Map, Rule
from werkzeug.utils import redirect, send_from_directory
from werkzeug.wrappers import Request, Response

from pgqueue.admin import DEFAULT_THROUGHPUT_CAP
from pgqueue.dashboard import bulk, job_pages, ops_pages, pages, queue_pages, workflow_view
from pgqueue.dashboard.access import DashboardRequest, Role, check_options, role_of
from pgqueue.dashboard.page import Page, Settings
from pgqueue.errors import ConfigurationError
from pgqueue.sqlstates import is_connection_error

if TYPE_CHECKING:
    from _typeshed.wsgi import StartResponse, WSGIEnvironment

    from pgqueue.core import PgQueue

STATIC_DIR: Final = Path(__file__).parent / "static"
CONTENT_SECURITY_POLICY: Final = "; ".join(
    [
        "default-src 'none'",
        "script-src 'self'",
        "connect-src 'self'",
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

Access = Callable[[DashboardRequest], object]
Actor = Callable[[DashboardRequest], str]
View = Callable[..., Response]


class Dashboard:
    """The dashboard as a WSGI application for ``queue`` (a core ``pgqueue.PgQueue``).

    ``access`` decides per request (see :mod:`pgqueue.dashboard.access`); ``public=True`` is
    required to serve it without one. ``actor`` names who takes an action, for its audit record
    (default: the user a serving layer authenticated, else ``"dashboard"``). ``secret_key``
    signs the session cookie that holds the CSRF token. ``read_only=True`` shows every page
    and refuses every action. ``throughput_cap`` bounds the finished jobs the overview's chart
    reads (see ``Admin.recent_throughput``), or a callable asked per page (e.g. reading the
    host app's config)."""

    def __init__(
        self,
        queue: PgQueue,
        *,
        secret_key: str | bytes,
        access: Access | None = None,
        public: bool = False,
        actor: Actor | None = None,
        read_only: bool = False,
        throughput_cap: int | Callable[[], int] = DEFAULT_THROUGHPUT_CAP,
    ) -> None:
        check_options(access, actor, public=public, who="the dashboard")
        if not secret_key:
            raise ConfigurationError("the dashboard's CSRF protection needs a secret key")
        if not callable(throughput_cap) and (
            not isinstance(throughput_cap, int)
            or isinstance(throughput_cap, bool)
            or throughput_cap < 1
        ):
            raise ConfigurationError(
                f"throughput_cap must be a positive int, got {throughput_cap!r}"
            )
        self.queue = queue
        self.access = access
        self.read_only = read_only
        self.views: dict[str, View] = {
            **pages.VIEWS,
            **job_pages.VIEWS,
            **bulk.VIEWS,
            **workflow_view.VIEWS,
            **ops_pages.VIEWS,
            **queue_pages.VIEWS,
        }
        rules = [
            *pages.RULES,
            *job_pages.RULES,
            *bulk.RULES,
            *workflow_view.RULES,
            *ops_pages.RULES,
            *queue_pages.RULES,
        ]
        # Copies: a rule binds to one map, and each dashboard has its own.
        self.url_map = Map(
            [rule.empty() for rule in rules]
            + [Rule("/static/<path:filename>", endpoint="static", methods=["GET"])]
        )
        self.templates = Environment(
            loader=PackageLoader("pgqueue.dashboard", "templates"),
            autoescape=select_autoescape(["html"]),
        )
        self.templates.globals.update(pages.HELPERS)
        self.templates.globals.update(bulk.HELPERS)
        self.templates.globals.update(job_pages.HELPERS)
        self.templates.globals.update(ops_pages.HELPERS)
        self.settings = Settings(
            queue=queue,
            templates=self.templates,
            serializer=URLSafeSerializer(secret_key, salt="pgqueue.dashboard.session"),
            actor=actor,
            throughput_cap=throughput_cap,
        )

    def __call__(self, environ: WSGIEnvironment, start_response: StartResponse) -> Iterable[bytes]:
        request = Request(environ)
        if not environ.get("PATH_INFO"):
            # Mounted at /pgqueue and asked for /pgqueue: the pages' links need the slash.
            query = environ.get("QUERY_STRING")
            target = request.script_root + "/" + (f"?{query}" if query else "")
            moved: Response = redirect(target, 308)
            return moved(environ, start_response)
        adapter = self.url_map.bind_to_environ(environ)
        page = Page(self.settings, request, adapter, self.read_only)
        try:
            response = self._respond(page)
        except HTTPException as exc:
            response = exc.get_response(environ)
        except DBAPIError as exc:
            if not is_connection_error(exc):
                raise
            response = database_unreachable(exc).get_response(environ)
        page.session.save(response, request)
        response.headers.update(SECURITY_HEADERS)
        return response(environ, start_response)

    def _respond(self, page: Page) -> Response:
        try:
            endpoint, args = page.adapter.match()
        except HTTPException as exc:
            # Raised after the access check: a stranger learns nothing of what exists.
            unmatched: HTTPException | None = exc
            endpoint, args = "", {}
        else:
            unmatched = None
        if endpoint == "static":
            # The stylesheet is no secret: a login page shown before any access check uses it.
            return send_from_directory(STATIC_DIR, args["filename"], page.request.environ)
        role = Role.ADMIN
        if self.access is not None:
            granted = role_of(self.access(page.view))
            if granted is None:
                raise Forbidden()
            role = granted
        page.read_only = self.read_only or role is Role.READ_ONLY
        if unmatched is not None:
            raise unmatched
        if page.request.method == "POST":
            if page.read_only:
                raise Forbidden(description="this dashboard is read-only")
            page.check_csrf()
        view = self.views.get(endpoint)
        if view is None:
            raise NotFound()
        return view(page, **args)


def database_unreachable(exc: DBAPIError) -> ServiceUnavailable:
    """503 for a page whose database connection failed (a server down, restarting, failing
    over): the driver's first line, which names where it went, and a ``Retry-After``; the
    live parts' polling backs off on it and takes up again when the server is back."""
    reason = str(exc.orig or exc).strip().splitlines()[0]
    unavailable = ServiceUnavailable(
        description=f"The jobs database cannot be reached now: {reason}", retry_after=5
    )
    return unavailable
