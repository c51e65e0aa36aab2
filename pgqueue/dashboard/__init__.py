"""pgqueue's dashboard: one framework-neutral WSGI core (:class:`Dashboard`), served three ways.

* In Flask: ``pgqueue.contrib.flask.dashboard.init_dashboard(app, access=...)``.
* In an ASGI app (FastAPI, Starlette, Litestar):
  ``app.mount("/pgqueue", pgqueue.dashboard.asgi_dashboard(pgq, access=..., secret_key=...))``
  (``pgqueue.dashboard.asgi``; needs the ``dashboard`` extra).
* Standalone: ``pgqueue dashboard [APP] --bind 127.0.0.1:8321`` (``pgqueue.dashboard.standalone``).

Every way takes the same ``access`` check (:mod:`pgqueue.dashboard.access`).
"""

from pgqueue.dashboard.access import DashboardRequest, Role
from pgqueue.dashboard.app import Dashboard

__all__ = ["Dashboard", "DashboardRequest", "Role"]
