"""The dashboard's access model without a server: the request an ``access`` check is given,
built alike from a WSGI environ and an ASGI scope; what each answer grants; and a decision a
serving layer took, handed to the core."""

from __future__ import annotations

import pytest
from werkzeug.exceptions import Unauthorized
from werkzeug.test import EnvironBuilder

from pgqueue import PgQueue
from pgqueue.dashboard.access import DECISION_KEY, DashboardRequest, Role, decided, role_of
from pgqueue.errors import ConfigurationError


def test_the_request_from_a_wsgi_environ() -> None:
    environ = EnvironBuilder(
        path="/pgqueue/jobs/12",
        method="post",
        headers={"X-Forwarded-User": "ada", "Cookie": "a=1; b=two"},
        environ_base={"REMOTE_ADDR": "10.0.0.7"},
    ).get_environ()
    environ["SCRIPT_NAME"], environ["PATH_INFO"] = "/pgqueue", "/jobs/12"
    request = DashboardRequest.from_environ(environ)
    assert (request.method, request.path, request.client) == ("POST", "/jobs/12", "10.0.0.7")
    assert request.headers["x-forwarded-user"] == "ada"
    assert dict(request.cookies) == {"a": "1", "b": "two"}
    assert request.environ is environ and request.scope is None


def test_the_request_from_an_asgi_scope_is_relative_to_its_mount() -> None:
    scope = {
        "type": "http",
        "method": "GET",
        "path": "/pgqueue/queues",
        "root_path": "/pgqueue",
        "headers": [(b"authorization", b"Bearer t"), (b"cookie", b"s=x")],
        "client": ("192.0.2.1", 5000),
    }
    request = DashboardRequest.from_scope(scope)
    assert (request.method, request.path, request.client) == ("GET", "/queues", "192.0.2.1")
    assert request.headers["Authorization"] == "Bearer t"
    assert dict(request.cookies) == {"s": "x"}
    assert request.scope is scope and request.environ is None
    assert DashboardRequest.from_scope({**scope, "path": "/pgqueue"}).path == "/"


@pytest.mark.parametrize(
    ("answer", "role"),
    [
        (True, Role.ADMIN),
        ("yes", Role.ADMIN),
        (Role.ADMIN, Role.ADMIN),
        (Role.READ_ONLY, Role.READ_ONLY),
        ("read-only", Role.READ_ONLY),
        (False, None),
        (None, None),
        (0, None),
    ],
)
def test_what_each_answer_grants(answer: object, role: Role | None) -> None:
    assert role_of(answer) is role


def test_a_decision_taken_before_the_core_is_read_or_raised_again() -> None:
    scope_request = DashboardRequest.from_scope({"path": "/", DECISION_KEY: Role.READ_ONLY})
    assert decided(scope_request) is Role.READ_ONLY
    environ = EnvironBuilder(path="/").get_environ()
    environ[DECISION_KEY] = Unauthorized()
    with pytest.raises(Unauthorized):
        decided(DashboardRequest.from_environ(environ))
    # No decision at all is a refusal, never an open door.
    assert role_of(decided(DashboardRequest.from_environ(EnvironBuilder().get_environ()))) is None


SERVINGS = ["init_dashboard", "asgi_app", "the dashboard"]


def _serve(who: str, **options: object) -> None:
    """The serving function ``who`` names, given ``options``; refused before it serves."""
    from flask import Flask

    from pgqueue.contrib.flask.dashboard import init_dashboard
    from pgqueue.dashboard import Dashboard
    from pgqueue.dashboard.asgi import asgi_app

    queue = PgQueue("postgresql+psycopg://nobody@127.0.0.1:1/none")
    try:
        if who == "init_dashboard":
            init_dashboard(Flask("refused"), **options)  # type: ignore[arg-type]
        elif who == "asgi_app":
            asgi_app(queue, secret_key="k", **options)  # type: ignore[arg-type]
        else:
            Dashboard(queue, secret_key="k", **options)  # type: ignore[arg-type]
    finally:
        queue.dispose()


@pytest.mark.parametrize("who", SERVINGS)
def test_every_way_of_serving_refuses_a_dashboard_open_to_anyone_unless_public(who: str) -> None:
    with pytest.raises(ConfigurationError, match=f"^{who} needs access="):
        _serve(who)


@pytest.mark.parametrize("who", SERVINGS)
@pytest.mark.parametrize("name", ["access", "actor"])
def test_every_way_of_serving_refuses_an_access_or_actor_not_callable(who: str, name: str) -> None:
    with pytest.raises(ConfigurationError, match=f"^{name} must be a callable, got 'yes'"):
        _serve(who, public=True, **{name: "yes"})
