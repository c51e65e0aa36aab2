"""pgqueue's dashboard: one framework-neutral WSGI core (:class:`Dashboard`), served three ways.

* In Flask: ``pgqueue.contrib.flask.dashboard.init_dashboard(app, access=...)``.
* In an ASGI app (FastAPI, Starlette, Litestar):
  ``app.mount("/pgqueue", asgi_app(pgq, access=..., secret_key=...))`` with
  ``from pgqueue.dashboard.asgi import asgi_app`` (the ``dashboard`` extra, for a2wsgi).
* Standalone: ``pgqueue dashboard [APP] --bind 127.0.0.1:8321`` (``pgqueue.dashboard.standalone``).

Every way takes the same ``access`` check (:mod:`pgqueue.dashboard.access`).
"""

from pgqueue.dashboard.access import DashboardRequest as DashboardRequest
from pgqueue.dashboard.access import Role as Role
from pgqueue.dashboard.app import Dashboard as Dashboard
