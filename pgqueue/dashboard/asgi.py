"""The dashboard in an ASGI app (FastAPI, Starlette, Litestar): ``asgi_app(pgq, access=...,
secret_key=...)`` returns an ASGI application to mount, e.g. ``app.mount("/pgqueue", ...)``.

The host's ``access`` check runs here, on the event loop, and may be ``async def``: it gets a
:class:`~pgqueue.dashboard.access.DashboardRequest` built from the ASGI scope. Its outcome
travels in the scope to the WSGI core, which a2wsgi's bridge runs in a thread pool: the core
calls ``pgq.admin``, which is synchronous, without blocking the loop.
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from a2wsgi import WSGIMiddleware
from werkzeug.exceptions import HTTPException

from pgqueue.admin import DEFAULT_THROUGHPUT_CAP
from pgqueue.core import PgQueue
from pgqueue.dashboard.access import DECISION_KEY, DashboardRequest, Role, check_options, decided
from pgqueue.dashboard.app import Dashboard

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]
AsyncAccess = Callable[[DashboardRequest], object]


class AsgiDashboard:
    """An ASGI application serving one :class:`~pgqueue.dashboard.app.Dashboard`."""

    def __init__(self, core: Dashboard, access: AsyncAccess | None, threads: int) -> None:
        self.core = core
        self.access = access
        self.bridge = WSGIMiddleware(core, workers=threads)  # type: ignore[arg-type]

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            scope = {**scope, DECISION_KEY: await self._decide(scope)}
        await self.bridge(scope, receive, send)  # type: ignore[arg-type]

    async def _decide(self, scope: Scope) -> object:
        if self.access is None:
            return Role.ADMIN
        try:
            answer = self.access(DashboardRequest.from_scope(scope))
            if inspect.isawaitable(answer):
                answer = await answer
        except HTTPException as exc:
            # Rendered by the core, with the dashboard's headers, like any other refusal.
            return exc
        return answer


def asgi_app(
    pgq: PgQueue,
    *,
    secret_key: str | bytes,
    access: AsyncAccess | None = None,
    public: bool = False,
    actor: Callable[[DashboardRequest], str] | None = None,
    read_only: bool = False,
    throughput_cap: int = DEFAULT_THROUGHPUT_CAP,
    threads: int = 8,
) -> AsgiDashboard:
    """The dashboard of ``pgq`` as an ASGI app to mount.

    ``access`` (sync or ``async def``) decides per request: falsy -> 403, ``Role.READ_ONLY``
    -> pages only, other truthy -> full access; it may raise a Werkzeug ``HTTPException`` (e.g.
    ``Unauthorized`` with a ``WWW-Authenticate`` header) to answer itself. ``public=True`` is
    required to serve it without one. ``secret_key`` signs the session cookie holding the CSRF
    token: the same in every process behind one address. ``actor`` names who takes an action
    (called in the core's thread). ``threads`` bounds the pages rendered at once."""
    check_options(access, actor, public=public, who="asgi_app")
    core = Dashboard(
        pgq,
        secret_key=secret_key,
        access=decided,
        actor=actor,
        read_only=read_only,
        throughput_cap=throughput_cap,
    )
    return AsgiDashboard(core, access, threads)
