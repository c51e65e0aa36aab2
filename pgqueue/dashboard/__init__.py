"""pgqueue's dashboard: one framework-neutral WSGI core (:class:`Dashboard`), served three ways.

* In Flask: ``pgqueue.contrib.flask.dashboard.init_dashboard(app, access=...)``.
* In an ASGI app (FastAPI, Starlette, Litestar):
  ``app.mount("/pgqueue", pgqueue.dashboard.asgi_app(pgq, access=..., secret_key=...))``
  (``pgqueue.dashboard.asgi``; needs the ``dashboard`` extra, for a2wsgi).
* Standalone: ``pgqueue dashboard [APP] --bind 127.0.0.1:8321`` (``pgqueue.dashboard.standalone``).

Every way takes the same ``access`` check (:mod:`pgqueue.dashboard.access`).
"""

from typing import Any

from pgqueue.dashboard.access import DashboardRequest, Role
from pgqueue.dashboard.app import Dashboard

__all__ = ["Dashboard", "DashboardRequest", "Role", "asgi_app"]


def __getattr__(name: str) -> Any:
    # Imported on first use: a2wsgi is needed by ASGI hosts only.
    if name == "asgi_app":
        from pgqueue.dashboard.asgi import asgi_app

        return asgi_app
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
