"""pgqueue's dashboard, mounted at ``/pgqueue`` (see ``app.create_app``): HTTP basic auth
against ``$DASHBOARD_PASSWORD`` (any user name), closed while it is unset; ``$SECRET_KEY``
signs its session cookie (set the same one in every process of the service)."""

from __future__ import annotations

import hmac
import os
import secrets

from werkzeug.datastructures import Authorization, WWWAuthenticate
from werkzeug.exceptions import Forbidden, Unauthorized

from orders_api.tasks import pgq
from pgqueue.dashboard import DashboardRequest
from pgqueue.dashboard.asgi import asgi_app


async def dashboard_access(request: DashboardRequest) -> bool:
    password = os.environ.get("DASHBOARD_PASSWORD")
    if not password:
        raise Forbidden(description="set DASHBOARD_PASSWORD to open the dashboard")
    auth = Authorization.from_header(request.headers.get("Authorization"))
    given = auth.password if auth is not None and auth.password is not None else ""
    # As bytes: compare_digest refuses str holding non-ASCII characters, and a password may
    # hold anything.
    if hmac.compare_digest(
        given.encode("utf-8", "surrogatepass"), password.encode("utf-8", "surrogatepass")
    ):
        return True
    raise Unauthorized(www_authenticate=WWWAuthenticate("basic", {"realm": "pgqueue"}))


def dashboard_actor(request: DashboardRequest) -> str:
    """The basic-auth user name, for the audit record of each action."""
    auth = Authorization.from_header(request.headers.get("Authorization"))
    return (auth.username if auth is not None else None) or "dashboard"


dashboard = asgi_app(
    pgq,
    access=dashboard_access,
    actor=dashboard_actor,
    secret_key=os.environ.get("SECRET_KEY") or secrets.token_hex(32),
)
