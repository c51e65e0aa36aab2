"""The standalone dashboard (``pgqueue dashboard``): the WSGI core behind a login, served by
waitress.

Authentication is on unless the bind address is loopback and it is turned off: a random token
printed once at start, or the users of an auth file (``passwords``), both through a login form
that sets a signed session cookie; or a reverse proxy's header naming the user
(``--trust-header``), believed only when told to, as anyone reaching the port could send it.
A request without a login gets 401 (with the login form, for a browser); the core answers 403
for what the role refuses.

The login form is guarded as the core's forms are: its POST carries the CSRF token of the
core's session cookie, set when the form is shown (so no other site can log a browser in under
an account of its choosing), and the token is renewed at the login. Failed logins are counted
per client address and per user name (``throttle``); past a few, attempts are refused with 429
and a ``Retry-After`` that grows. Cookies are HttpOnly, SameSite=Lax, and Secure over TLS
(``page.cookie_flags``). The signing secret is random per start unless ``--secret-file`` gives
one, so that logins outlive a restart and processes behind one address accept each other's.
"""

from __future__ import annotations

import hmac
import ipaddress
import math
import secrets
import socket
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Final
from urllib.parse import urlsplit

from itsdangerous import BadSignature, URLSafeTimedSerializer
from werkzeug.utils import redirect
from werkzeug.wrappers import Request, Response

from pgqueue.dashboard.access import DECISION_KEY, LOGOUT_KEY, USER_KEY, Role, decided
from pgqueue.dashboard.app import SECURITY_HEADERS, Dashboard
from pgqueue.dashboard.page import CSRF_FIELD, SESSION_COOKIE, Session, cookie_flags
from pgqueue.dashboard.passwords import Users
from pgqueue.dashboard.throttle import LoginThrottle
from pgqueue.errors import ConfigurationError, pgqueue_logger

if TYPE_CHECKING:
    from _typeshed.wsgi import StartResponse, WSGIEnvironment

    from pgqueue.core import PgQueue

LOGIN_COOKIE: Final = "pgqueue_login"
# A login lasts a working day; the cookie dies with the browser session before that.
LOGIN_SECONDS: Final = 12 * 3600
SHARED_LOGIN_ACTOR: Final = "token"
# A signing secret shorter than this is refused: 32 random bytes are beyond guessing.
MIN_SECRET_BYTES: Final = 32

log = pgqueue_logger("pgqueue.dashboard")


@dataclass(frozen=True, slots=True)
class Auth:
    """How the standalone dashboard knows its users: exactly one of a token, the users of an
    auth file, a trusted header; or none at all (loopback only)."""

    token: str | None = None
    users: Users | None = None
    trust_header: str | None = None

    @property
    def enabled(self) -> bool:
        return self.token is not None or self.users is not None or self.trust_header is not None


class Standalone:
    """The login in front of the core: ``/login`` (form, and its POST), ``/logout``, the
    session cookie's check, and the user's name handed to the core (the audit's actor)."""

    def __init__(
        self,
        core: Dashboard,
        auth: Auth,
        secret_key: str | bytes,
        role: Role,
        throttle: LoginThrottle | None = None,
    ) -> None:
        self.core = core
        self.auth = auth
        self.role = role
        self.signer = URLSafeTimedSerializer(secret_key, salt="pgqueue.dashboard.login")
        self.throttle = throttle or LoginThrottle()

    def __call__(self, environ: WSGIEnvironment, start_response: StartResponse) -> Iterable[bytes]:
        request = Request(environ)
        path = request.path[len(request.script_root) :] if request.script_root else request.path
        if path == "/login" and (self.auth.token is not None or self.auth.users is not None):
            return self._login(request)(environ, start_response)
        if path == "/logout" and request.method == "POST":
            response = redirect(request.script_root + "/login", 303)
            response.delete_cookie(
                LOGIN_COOKIE, path=request.script_root + "/", **cookie_flags(request)
            )
            response.headers.update(SECURITY_HEADERS)
            return response(environ, start_response)
        user = self._user(request)
        if user is None and not path.startswith("/static/"):
            return self._refusal(request)(environ, start_response)
        environ[USER_KEY] = user
        environ[DECISION_KEY] = self.role
        if self.auth.token is not None or self.auth.users is not None:
            environ[LOGOUT_KEY] = request.script_root + "/logout"
        return self.core(environ, start_response)

    def _user(self, request: Request) -> str | None:
        if not self.auth.enabled:
            return "dashboard"
        if self.auth.trust_header is not None:
            return request.headers.get(self.auth.trust_header) or None
        raw = request.cookies.get(LOGIN_COOKIE)
        if not raw:
            return None
        try:
            user = self.signer.loads(raw, max_age=LOGIN_SECONDS)
        except BadSignature:
            return None
        if not isinstance(user, str):
            return None
        # A user taken out of the auth file is logged out, even where the secret outlives
        # restarts (--secret-file).
        if self.auth.users is not None and user not in self.auth.users.hashes:
            return None
        return user

    def _refusal(self, request: Request) -> Response:
        if self.auth.trust_header is not None:
            response = Response(
                f"401: no {self.auth.trust_header} header (the proxy in front of this dashboard "
                "names the user in it)\n",
                status=401,
                mimetype="text/plain",
            )
            response.headers.update(SECURITY_HEADERS)
            return response
        return self._form(request, self._session(request), None, request.full_path.rstrip("?"), 401)

    def _session(self, request: Request) -> Session:
        """The core's session (its cookie), whose CSRF token the login form carries too."""
        return Session(self.core.settings.serializer, request.cookies.get(SESSION_COOKIE))

    def _form(
        self, request: Request, session: Session, error: str | None, next_url: str, status: int
    ) -> Response:
        html = self.core.templates.get_template("pgqueue/login.html").render(
            root=request.script_root,
            users=self.auth.users is not None,
            error=error,
            next=next_url,
            csrf_token=session.csrf_token,
        )
        response = Response(html, status=status, mimetype="text/html")
        session.save(response, request)
        response.headers.update(SECURITY_HEADERS)
        return response

    def _login(self, request: Request) -> Response:
        home = request.script_root + "/"
        next_url = local_target(request.values.get("next", ""), home)
        session = self._session(request)
        if request.method != "POST":
            return self._form(request, session, None, next_url, 200)
        if not session.csrf_matches(request.form.get(CSRF_FIELD, "")):
            # No token, or another's: this browser did not get the form from here (or its
            # cookie expired meanwhile). Nothing is checked or counted.
            problem = "The login form expired or did not come from this dashboard: log in again."
            return self._form(request, session, problem, next_url, 400)
        password = request.form.get("password", "")
        user = request.form.get("user", "") if self.auth.users is not None else None
        address = request.remote_addr
        wait = self.throttle.wait(address, user)
        if wait > 0:
            return self._too_many(request, session, next_url, wait)
        if self.auth.users is not None:
            assert user is not None
            ok = self.auth.users.check(user, password)
        else:
            assert self.auth.token is not None
            ok = hmac.compare_digest(
                password.encode("utf-8", "surrogatepass"), self.auth.token.encode("utf-8")
            )
        if not ok:
            wait = self.throttle.failed(address, user)
            if wait > 0:
                # The name tried is not logged: it is sometimes a password typed one field early.
                log.warning(
                    "dashboard: too many failed logins (the latest from %s); the next is refused "
                    "for %ds",
                    address,
                    math.ceil(wait),
                )
            return self._form(request, session, "Wrong user or password.", next_url, 401)
        self.throttle.succeeded(address, user)
        response = redirect(next_url, 303)
        response.set_cookie(
            LOGIN_COOKIE,
            self.signer.dumps(user if user is not None else SHARED_LOGIN_ACTOR),
            path=home,
            **cookie_flags(request),
        )
        session.renew()
        session.save(response, request)
        response.headers.update(SECURITY_HEADERS)
        return response

    def _too_many(self, request: Request, session: Session, next_url: str, wait: float) -> Response:
        seconds = max(1, math.ceil(wait))
        problem = f"Too many failed logins: try again in {seconds} seconds."
        response = self._form(request, session, problem, next_url, 429)
        response.headers["Retry-After"] = str(seconds)
        return response


def local_target(target: str, home: str) -> str:
    """``target`` when it is a path on this dashboard, else ``home``: a login never sends the
    browser to another site."""
    parts = urlsplit(target)
    # Browsers drop tabs and newlines from a URL and read a backslash as a slash: "/\t/x" and
    # "/\\x" would leave the site.
    odd = any(c.isspace() or c == "\\" or not c.isprintable() for c in target)
    if parts.scheme or parts.netloc or odd or not target.startswith(home):
        return home
    return target


def is_loopback(host: str) -> bool:
    """Whether ``host`` (a name or an address) only ever reaches this machine."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        pass
    try:
        addresses = {info[4][0] for info in socket.getaddrinfo(host, None)}
    except OSError:
        return False
    return bool(addresses) and all(ipaddress.ip_address(a).is_loopback for a in addresses)


def parse_bind(bind: str) -> tuple[str, int]:
    """``host:port`` (``[::1]:8321`` for IPv6) -> (host, port)."""
    host, sep, port = bind.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ConfigurationError(f"--bind {bind!r}: expected HOST:PORT, e.g. 127.0.0.1:8321")
    return host.strip("[]"), int(port)


def read_secret(path: str | Path) -> bytes:
    """The signing secret in the file at ``path`` (``--secret-file``): its bytes, without the
    whitespace around them; refused when shorter than ``MIN_SECRET_BYTES``."""
    try:
        secret = Path(path).read_bytes().strip()
    except OSError as exc:
        raise ConfigurationError(f"--secret-file {path}: {exc.strerror or exc}") from exc
    if len(secret) < MIN_SECRET_BYTES:
        raise ConfigurationError(
            f"--secret-file {path}: the secret is {len(secret)} bytes, too short to sign logins "
            f"with; give at least {MIN_SECRET_BYTES} (e.g. openssl rand -hex 32 > {path})"
        )
    return secret


def server_options(trusted_proxy: str | None) -> dict[str, object]:
    """What waitress is told of the reverse proxy in front (``--trusted-proxy``): from that
    peer alone (``*``: any), the scheme and client address it forwards (``X-Forwarded-Proto``,
    ``X-Forwarded-For``, its own hop only) become the request's; from any other, waitress drops
    those headers. The scheme makes cookies Secure; the address is what login throttling counts."""
    if trusted_proxy is None:
        return {}
    return {
        "trusted_proxy": trusted_proxy,
        "trusted_proxy_count": 1,
        "trusted_proxy_headers": {"x-forwarded-proto", "x-forwarded-for"},
    }


def application(
    pgq: PgQueue,
    auth: Auth,
    *,
    read_only: bool = False,
    secret_key: str | bytes | None = None,
    throttle: LoginThrottle | None = None,
) -> Standalone:
    """The standalone dashboard of ``pgq`` as a WSGI app (what ``serve`` runs). Without
    ``secret_key``, a random one: every login ends with the process."""
    key = secret_key or secrets.token_urlsafe(32)
    core = Dashboard(pgq, secret_key=key, access=decided, read_only=read_only)
    return Standalone(core, auth, key, Role.READ_ONLY if read_only else Role.ADMIN, throttle)
