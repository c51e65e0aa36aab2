"""One dashboard request as its views see it (:class:`Page`): the request, the dashboard's
signed session cookie (CSRF token, messages for the next page), links, rendering, and the
queue's admin API.

Live fragments: a template block named ``live_<name>`` is a part of its page that refreshes
itself. The block wraps one element carrying ``data-live="<name>"``; ``static/live.js`` polls
the page's own URL with ``?fragment=<name>`` and swaps that element for the answer, which is
the block alone, rendered from the same template and context as the whole page (one rendering
for both). An unknown fragment name answers 400.
"""

from __future__ import annotations

import hmac
import secrets
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

from itsdangerous import BadSignature, URLSafeSerializer
from jinja2 import Environment
from werkzeug.exceptions import BadRequest
from werkzeug.routing import MapAdapter
from werkzeug.utils import redirect
from werkzeug.wrappers import Request, Response

from pgqueue.dashboard.access import LOGOUT_KEY, USER_KEY, DashboardRequest

if TYPE_CHECKING:
    from pgqueue.admin import Admin
    from pgqueue.core import PgQueue

CSRF_FIELD: Final = "csrf_token"
FRAGMENT_ARG: Final = "fragment"
FRAGMENT_BLOCK_PREFIX: Final = "live_"
SESSION_COOKIE: Final = "pgqueue_dashboard"


@dataclass(frozen=True, slots=True)
class Settings:
    """What every page of one dashboard shares."""

    queue: PgQueue
    templates: Environment
    serializer: URLSafeSerializer
    actor: Callable[[DashboardRequest], str] | None
    throughput_cap: int | Callable[[], int]


class Session:
    """The dashboard's own session, in a signed cookie: the CSRF token and the messages to
    show on the next page."""

    def __init__(self, serializer: URLSafeSerializer, raw: str | None) -> None:
        self._serializer = serializer
        self.data: dict[str, Any] = {}
        self.modified = False
        if raw:
            try:
                loaded = serializer.loads(raw)
            except BadSignature:
                loaded = None
            if isinstance(loaded, dict):
                self.data = loaded

    def csrf_token(self) -> str:
        token = self.data.get("csrf")
        if not isinstance(token, str) or not token:
            token = secrets.token_urlsafe(32)
            self.data["csrf"] = token
            self.modified = True
        return token

    def csrf_matches(self, given: str) -> bool:
        """Whether ``given`` (a form's token) is this session's CSRF token, compared in
        constant time; false when the session has none."""
        expected = self.data.get("csrf")
        # As bytes: compare_digest refuses str holding non-ASCII characters (TypeError, a
        # 500), and a forged token may hold anything.
        return isinstance(expected, str) and hmac.compare_digest(
            expected.encode("utf-8"), given.encode("utf-8", "surrogatepass")
        )

    def renew(self) -> None:
        """Start afresh with a new CSRF token (at a login: a token planted before it is
        worthless after)."""
        self.data = {"csrf": secrets.token_urlsafe(32)}
        self.modified = True

    def flash(self, message: str, category: str) -> None:
        self.data.setdefault("flashes", []).append([category, message])
        self.modified = True

    def take_flashes(self) -> list[tuple[str, str]]:
        flashes = self.data.pop("flashes", None)
        if flashes is None:
            return []
        self.modified = True
        return [(str(c), str(m)) for c, m in flashes]

    def save(self, response: Response, request: Request) -> None:
        if not self.modified:
            return
        response.set_cookie(
            SESSION_COOKIE,
            self._serializer.dumps(self.data),
            path=request.script_root + "/",
            **cookie_flags(request),
        )


def cookie_flags(request: Request) -> dict[str, Any]:
    """The attributes of every cookie the dashboard sets: out of scripts' reach, sent on no
    other site's request but a top-level link (Lax: a link into the dashboard from a chat or a
    mail still arrives logged in; every action is a POST carrying a CSRF token anyway), and
    ``Secure`` when the request came over TLS (``wsgi.url_scheme``: behind a reverse proxy that
    ends TLS, the scheme it forwards, once the server is told to believe it)."""
    return {"httponly": True, "secure": request.scheme == "https", "samesite": "Lax"}


class Page:
    """One request as the views see it: the dashboard, the request, its session, links."""

    def __init__(
        self, settings: Settings, request: Request, adapter: MapAdapter, read_only: bool
    ) -> None:
        self.settings = settings
        self.request = request
        self.adapter = adapter
        self.session = Session(settings.serializer, request.cookies.get(SESSION_COOKIE))
        self.read_only = read_only
        self.view = DashboardRequest.from_environ(request.environ)

    @property
    def queue(self) -> PgQueue:
        return self.settings.queue

    def throughput_cap(self) -> int:
        cap = self.settings.throughput_cap
        return cap() if callable(cap) else cap

    @property
    def admin(self) -> Admin:
        return self.settings.queue.admin

    def actor(self) -> str:
        """Who takes an action, for its audit record."""
        if self.settings.actor is not None:
            return self.settings.actor(self.view)
        user = self.request.environ.get(USER_KEY)
        return str(user) if user else "dashboard"

    def check_csrf(self) -> None:
        if not self.session.csrf_matches(self.request.form.get(CSRF_FIELD, "")):
            raise BadRequest(description="CSRF token missing or invalid")

    def url_for(self, endpoint: str, **values: Any) -> str:
        """The dashboard's URL for ``endpoint``; values the rule does not take become the query
        string, and None values are left out."""
        return self.adapter.build(endpoint, {k: v for k, v in values.items() if v is not None})

    def flash(self, message: str, category: str) -> None:
        self.session.flash(message, category)

    def redirect(self, endpoint: str, **values: Any) -> Response:
        return self.redirect_to(self.url_for(endpoint, **values))

    def redirect_to(self, url: str) -> Response:
        response: Response = redirect(url, 302)
        return response

    def render(self, template: str, status: int = 200, **context: Any) -> Response:
        """The page ``template`` renders, or, asked for ``?fragment=<name>``, its block
        ``live_<name>`` alone (see the module)."""
        loaded = self.settings.templates.get_template(template)
        values = {
            "url_for": self.url_for,
            "csrf_token": self.session.csrf_token,
            "get_flashed_messages": self._flashes,
            "read_only": self.read_only,
            "user": self.request.environ.get(USER_KEY),
            "logout_url": self.request.environ.get(LOGOUT_KEY),
            **context,
        }
        fragment = self.request.args.get(FRAGMENT_ARG)
        if fragment is None:
            return Response(loaded.render(values), status=status, mimetype="text/html")
        block = loaded.blocks.get(FRAGMENT_BLOCK_PREFIX + fragment)
        if block is None:
            names = sorted(
                name.removeprefix(FRAGMENT_BLOCK_PREFIX)
                for name in loaded.blocks
                if name.startswith(FRAGMENT_BLOCK_PREFIX)
            )
            raise BadRequest(
                description=f"this page has no live fragment {fragment[:60]!r}"
                + (f" (it has: {', '.join(names)})" if names else " (it has none)")
            )
        # Flashed messages stay for the next whole page: a fragment shows none.
        html = "".join(block(loaded.new_context(values)))
        return Response(html, status=status, mimetype="text/html")

    def _flashes(self, with_categories: bool = False) -> list[Any]:
        flashes = self.session.take_flashes()
        return list(flashes) if with_categories else [m for _, m in flashes]


def text_arg(args: Mapping[str, str], name: str) -> str | None:
    """A text filter from the query string; None when absent or empty."""
    value = args.get(name) or None
    if value is not None and "\x00" in value:
        raise BadRequest(description=f"{name} must not contain a NUL character")
    return value
