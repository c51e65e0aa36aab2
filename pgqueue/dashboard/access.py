"""Who may use the dashboard, framework-neutral: the request an ``access`` check is given, the
roles it may answer with, and how a serving layer hands down a decision it took itself.

An ``access`` check receives a :class:`DashboardRequest` and answers falsy (403), a
:class:`Role` (``Role.READ_ONLY``: pages shown, every action refused), or any other truthy
value (full access). It may instead raise a ``werkzeug.exceptions.HTTPException`` to answer
with that response itself, e.g. a 401 asking for credentials.

The Flask and ASGI layers run the host's check before the request reaches the WSGI core (Flask:
in its own request context; ASGI: possibly awaited) and leave its outcome in the WSGI environ
or the ASGI scope under :data:`DECISION_KEY`; :func:`decided` is the core's check that reads it.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from werkzeug.datastructures import EnvironHeaders, Headers
from werkzeug.exceptions import HTTPException
from werkzeug.http import parse_cookie

from pgqueue.errors import ConfigurationError

# Environ/scope key holding an access decision taken before the core (a Role or an exception).
DECISION_KEY: Final = "pgqueue.dashboard.access"
# Environ key holding the name of the user a serving layer authenticated (the default actor).
USER_KEY: Final = "pgqueue.dashboard.user"
# Environ key holding the address a serving layer's login is ended at (a POST), when it has one.
LOGOUT_KEY: Final = "pgqueue.dashboard.logout"


class Role(enum.StrEnum):
    """What an allowed request may do."""

    ADMIN = "admin"
    READ_ONLY = "read-only"


@dataclass(frozen=True, slots=True)
class DashboardRequest:
    """The request an ``access`` or ``actor`` callable is given, the same under every serving
    layer. ``path`` is the path inside the dashboard (``/jobs/12``); ``headers`` is
    case-insensitive; ``client`` the peer's address (behind a proxy: the proxy's). The raw
    WSGI ``environ`` (Flask, standalone) or ASGI ``scope`` (FastAPI, Starlette, Litestar) is
    there for anything else."""

    method: str
    path: str
    headers: Headers
    cookies: Mapping[str, str]
    client: str | None
    environ: Mapping[str, Any] | None = field(default=None, repr=False)
    scope: Mapping[str, Any] | None = field(default=None, repr=False)

    @classmethod
    def from_environ(cls, environ: Mapping[str, Any]) -> DashboardRequest:
        """The request a WSGI ``environ`` describes."""
        return cls(
            method=str(environ.get("REQUEST_METHOD", "GET")).upper(),
            path=_wsgi_text(str(environ.get("PATH_INFO", ""))) or "/",
            headers=EnvironHeaders(environ),  # type: ignore[arg-type]
            cookies=parse_cookie(str(environ.get("HTTP_COOKIE", ""))),
            client=environ.get("REMOTE_ADDR"),
            environ=environ,
            scope=environ.get("asgi.scope"),
        )

    @classmethod
    def from_scope(cls, scope: Mapping[str, Any]) -> DashboardRequest:
        """The request an ASGI HTTP ``scope`` describes (its path relative to ``root_path``)."""
        headers = Headers(
            [(k.decode("latin-1"), v.decode("latin-1")) for k, v in scope.get("headers", [])]
        )
        path = str(scope.get("path", "/"))
        root = str(scope.get("root_path", ""))
        if root and path.startswith(root):
            path = path[len(root) :]
        client = scope.get("client")
        return cls(
            method=str(scope.get("method", "GET")).upper(),
            path=path or "/",
            headers=headers,
            cookies=parse_cookie(headers.get("cookie", "")),
            client=None if client is None else str(client[0]),
            scope=scope,
        )


def _wsgi_text(value: str) -> str:
    # WSGI carries the path as latin-1 decoded bytes; the bytes themselves are UTF-8.
    try:
        return value.encode("latin-1").decode("utf-8")
    except UnicodeError:
        return value


def role_of(decision: object) -> Role | None:
    """The role an ``access`` answer grants; None when it refuses."""
    if isinstance(decision, Role):
        return decision
    if decision == Role.READ_ONLY.value:
        return Role.READ_ONLY
    return Role.ADMIN if decision else None


def decided(request: DashboardRequest) -> object:
    """The core's ``access`` check when a serving layer already decided: its answer, or the
    exception it raised (raised again here, so the core renders it)."""
    outcome: object = None
    if request.environ is not None and DECISION_KEY in request.environ:
        outcome = request.environ[DECISION_KEY]
    elif request.scope is not None:
        outcome = request.scope.get(DECISION_KEY)
    if isinstance(outcome, HTTPException):
        raise outcome
    return outcome


def check_options(access: object, actor: object, *, public: bool, who: str) -> None:
    """Refuse ``who``'s (the serving function's) ``access`` and ``actor`` when they cannot serve:
    no ``access`` without ``public=True`` (a dashboard open to anyone is a decision, never a
    default), and either of them given but not callable."""
    if access is None and not public:
        raise ConfigurationError(
            f"{who} needs access= (a callable deciding per request, e.g. checking the "
            "logged-in user); pass public=True to serve it without any check"
        )
    for name, value in (("access", access), ("actor", actor)):
        if value is not None and not callable(value):
            raise ConfigurationError(f"{name} must be a callable, got {value!r}")
