"""The Flask extension against real PostgreSQL: transactional enqueue in requests, jobs in an
app context with db.session, registration rules, and the dashboard's server-side guards."""

from __future__ import annotations

import base64
import re
import shutil
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from flask import Flask
from flask_sqlalchemy import SQLAlchemy
from sqlalchemy import create_engine, func, select, text
from sqlalchemy.engine import URL

from pgqueue import ConfigurationError, Job, JobState, MessageQueue, embedded
from pgqueue.contrib.flask import PgQueue
from pgqueue.contrib.flask.dashboard import init_dashboard
from pgqueue.testing import run_until_final

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "flask_app"
if str(EXAMPLE) not in sys.path:
    sys.path.insert(0, str(EXAMPLE))

from orders import create_app  # noqa: E402
from orders.extensions import db, pgq  # noqa: E402
from orders.models import Order, Receipt  # noqa: E402


def _url(url: URL) -> str:
    return url.render_as_string(hide_password=False)


@pytest.fixture
def app(database_url: URL) -> Iterator[Flask]:
    app = create_app(
        {
            "SQLALCHEMY_DATABASE_URI": _url(database_url),
            "PGQUEUE_POLL_INTERVAL": 0.2,
            "SECRET_KEY": "test",
            "DASHBOARD_PASSWORD": "pw",
        }
    )
    with app.app_context():
        db.create_all()
    yield app
    with app.app_context():
        db.engine.dispose()


def _count(database_url: URL, model: Any) -> int:
    engine = create_engine(database_url)
    try:
        with engine.connect() as connection:
            return connection.scalar(select(func.count()).select_from(model)) or 0
    finally:
        engine.dispose()


def test_a_configured_database_url_never_starts_the_embedded_server(
    database_url: URL, monkeypatch: pytest.MonkeyPatch
) -> None:
    def refuse(*args: object, **kwargs: object) -> str:
        raise AssertionError("the embedded development server was started")

    monkeypatch.setattr(embedded, "shared_server", refuse)
    app = create_app({"SQLALCHEMY_DATABASE_URI": _url(database_url), "SECRET_KEY": "test"})
    assert app.config["SQLALCHEMY_DATABASE_URI"] == _url(database_url)


def test_order_and_its_job_are_written_by_the_same_transaction(
    app: Flask, database_url: URL
) -> None:
    response = app.test_client().post(
        "/orders", json={"item": "tea", "quantity": 2, "email": "a@example.com"}
    )
    assert response.status_code == 201, response.text
    order_id, job_id = response.json["id"], response.json["job_id"]
    engine = create_engine(database_url)
    try:
        with engine.connect() as connection:
            order_xmin = connection.scalar(
                text("SELECT xmin::text FROM orders WHERE id = :id"), {"id": order_id}
            )
            job_xmin, task_name, args, state = connection.execute(
                text(
                    "SELECT xmin::text, task_name, args::text, state FROM pgqueue_jobs WHERE id = :id"
                ),
                {"id": job_id},
            ).one()
    finally:
        engine.dispose()
    # Same xmin: one PostgreSQL transaction inserted both rows.
    assert job_xmin == order_xmin
    assert (task_name, args, state) == ("orders.tasks.send_receipt", f"[{order_id}]", "queued")
    assert _count(database_url, MessageQueue) == 1


def test_request_that_raises_after_enqueuing_leaves_neither_order_nor_job(
    app: Flask, database_url: URL
) -> None:
    from orders.tasks import send_receipt

    def boom() -> str:
        order = Order(item="tea", quantity=1, email="b@example.com")
        db.session.add(order)
        db.session.flush()
        send_receipt.enqueue(order.id)
        raise RuntimeError("payment provider down")

    app.add_url_rule("/boom", view_func=boom, methods=["POST"])
    app.config["PROPAGATE_EXCEPTIONS"] = False
    response = app.test_client().post("/boom")
    assert response.status_code == 500
    assert _count(database_url, Order) == 0
    assert _count(database_url, Job) == 0
    assert _count(database_url, MessageQueue) == 0


def test_worker_runs_the_job_in_an_app_context_and_commits_db_session(
    app: Flask, database_url: URL
) -> None:
    client = app.test_client()
    response = client.post("/orders", json={"item": "mug", "quantity": 3, "email": "c@x.org"})
    order_id, job_id = response.json["id"], response.json["job_id"]
    assert client.get(f"/orders/{order_id}").json["receipt_sent"] is False

    queue = pgq.state(app).queue
    assert run_until_final(queue, [job_id], concurrency=2) == {job_id: JobState.SUCCEEDED}
    job = queue.get_job(job_id)
    assert job.result == {"order_id": order_id}
    assert client.get(f"/orders/{order_id}").json["receipt_sent"] is True
    engine = create_engine(database_url)
    try:
        with engine.connect() as connection:
            body = connection.scalar(select(Receipt.body).where(Receipt.order_id == order_id))
    finally:
        engine.dispose()
    assert body == f"Thanks! 3 x mug, order #{order_id}."


def test_failed_handler_rolls_back_its_db_session_and_sessions_are_removed(
    database_url: URL,
) -> None:
    """A second, minimal app: the handler writes then raises; its write must not survive, and
    each job sees a fresh session (removed after the previous job)."""
    local_db = SQLAlchemy()
    local_pgq = PgQueue(db=local_db)
    # The sessions themselves, not their id(): a freed session's id can be reused by the next.
    seen_sessions: list[object] = []

    @local_pgq.task(name="t.write_then_fail", max_attempts=1)
    def write_then_fail(value: int) -> None:
        seen_sessions.append(local_db.session())
        local_db.session.execute(text("INSERT INTO notes (value) VALUES (:v)"), {"v": value})
        if value < 0:
            raise ValueError("negative")

    app = Flask("minimal")
    app.config["SQLALCHEMY_DATABASE_URI"] = _url(database_url)
    local_db.init_app(app)
    local_pgq.init_app(app)
    with app.app_context():
        local_db.session.execute(text("CREATE TABLE notes (value int)"))
        local_db.session.commit()
        ids = [write_then_fail.enqueue(1), write_then_fail.enqueue(-1), write_then_fail.enqueue(2)]
        local_db.session.commit()
    try:
        states = run_until_final(local_pgq.state(app).queue, ids, concurrency=1)
        assert states == {
            ids[0]: JobState.SUCCEEDED,
            ids[1]: JobState.FAILED,
            ids[2]: JobState.SUCCEEDED,
        }
        with app.app_context():
            values = sorted(local_db.session.scalars(text("SELECT value FROM notes")))
        assert values == [1, 2]
        assert len(seen_sessions) == 3 and len({id(s) for s in seen_sessions}) == 3
        assert "ValueError: negative" in (
            local_pgq.state(app).queue.get_job(ids[1]).last_error or ""
        )
    finally:
        with app.app_context():
            local_db.engine.dispose()


def test_registration_rules(app: Flask, database_url: URL) -> None:
    with pytest.raises(RuntimeError, match="already registered"):
        pgq.init_app(app)
    other = Flask("no_db_yet")
    other.config["SQLALCHEMY_DATABASE_URI"] = _url(database_url)
    with pytest.raises(ConfigurationError, match=r"db\.init_app"):
        PgQueue(db=SQLAlchemy()).init_app(other)
    assert "pgqueue" not in other.extensions
    # The app's config got the documented defaults.
    assert app.config["PGQUEUE_JOIN_SESSION"] is True
    assert pgq.state(app).queue.settings.poll_interval == 0.2
    with pytest.raises(RuntimeError, match="no Flask app context"):
        pgq.queue


def test_enqueue_outside_a_request_joins_db_session_only_until_commit(
    app: Flask, database_url: URL
) -> None:
    from orders.tasks import send_receipt

    with app.app_context():
        send_receipt.enqueue(123)
        db.session.rollback()
        kept = send_receipt.enqueue(456)
        db.session.commit()
    engine = create_engine(database_url)
    try:
        with engine.connect() as connection:
            assert connection.scalars(select(Job.id)).all() == [kept]
    finally:
        engine.dispose()


def test_dashboard_refuses_registration_without_access_check(database_url: URL) -> None:
    local_pgq = PgQueue()
    app = Flask("dash")
    app.config.update(SECRET_KEY="k", PGQUEUE_DATABASE_URL=_url(database_url))
    local_pgq.init_app(app)
    with pytest.raises(ConfigurationError, match="access="):
        init_dashboard(app)
    assert "pgqueue_dashboard" not in app.blueprints
    init_dashboard(app, public=True)
    assert app.test_client().get("/pgqueue/").status_code == 200
    local_pgq.state(app).queue.dispose()


def test_dashboard_access_and_csrf_guards(app: Flask) -> None:
    client = app.test_client()
    response = client.post("/orders", json={"item": "pen", "quantity": 1, "email": "d@x.org"})
    job_id = response.json["job_id"]
    assert client.get("/pgqueue/").status_code == 401  # example's basic-auth access check
    auth = {"Authorization": "Basic dTpwdw=="}  # u:pw
    assert client.get("/pgqueue/", headers=auth).status_code == 200
    page = client.get(f"/pgqueue/jobs/{job_id}", headers=auth)
    token = re.search(r'name="csrf_token" value="([^"]+)"', page.text)
    assert token is not None
    # No token, and a wrong token: rejected, the job stays queued.
    assert client.post(f"/pgqueue/jobs/{job_id}/cancel", headers=auth).status_code == 400
    bad = client.post(f"/pgqueue/jobs/{job_id}/cancel", headers=auth, data={"csrf_token": "x"})
    assert bad.status_code == 400
    queue = pgq.state(app).queue
    assert queue.get_job(job_id).state is JobState.QUEUED
    ok = client.post(
        f"/pgqueue/jobs/{job_id}/cancel", headers=auth, data={"csrf_token": token.group(1)}
    )
    assert ok.status_code == 302
    assert queue.get_job(job_id).state is JobState.CANCELLED
    deleted = client.post(
        f"/pgqueue/jobs/{job_id}/delete", headers=auth, data={"csrf_token": token.group(1)}
    )
    assert deleted.status_code == 302
    assert client.get(f"/pgqueue/jobs/{job_id}", headers=auth).status_code == 404


def _basic(credentials: bytes) -> dict[str, str]:
    return {"Authorization": "Basic " + base64.b64encode(credentials).decode("ascii")}


@pytest.mark.parametrize(
    "credentials",
    [
        "u:pé".encode(),  # non-ASCII, UTF-8
        "u:pé".encode("latin-1"),  # not UTF-8 at all
        "u:p\u00e9\U0001f600".encode(),
        "ü:pw".encode(),  # the right password, a non-ASCII user name: let in
    ],
)
def test_the_examples_dashboard_login_never_fails_on_non_ascii(
    app: Flask, credentials: bytes
) -> None:
    client = app.test_client()
    response = client.get("/pgqueue/", headers=_basic(credentials))
    expected = 200 if credentials.endswith(b":pw") else 401
    assert response.status_code == expected
    if expected == 401:
        assert response.headers["WWW-Authenticate"] == 'Basic realm="pgqueue"'
    undecodable = client.get("/pgqueue/", headers={"Authorization": "Basic %%%"})
    assert undecodable.status_code == 401


def test_the_examples_dashboard_accepts_a_non_ascii_password(database_url: URL) -> None:
    app = create_app(
        {
            "SQLALCHEMY_DATABASE_URI": _url(database_url),
            "SECRET_KEY": "test",
            "DASHBOARD_PASSWORD": "pässwörd",
        }
    )
    try:
        client = app.test_client()
        assert client.get("/pgqueue/", headers=_basic("u:pässwörd".encode())).status_code == 200
        assert client.get("/pgqueue/", headers=_basic(b"u:passwort")).status_code == 401
        latin1 = _basic("u:pässwörd".encode("latin-1"))
        assert client.get("/pgqueue/", headers=latin1).status_code == 401
    finally:
        pgq.state(app).queue.dispose()
        with app.app_context():
            db.engine.dispose()


def test_without_db_the_extension_uses_the_apps_flask_sqlalchemy(database_url: URL) -> None:
    """The usual extension style, ``PgQueue()`` then ``init_app``: jobs live in the app's
    database and commit with the request, so a failed request's job never runs and a committed
    request's job runs once."""
    local_db = SQLAlchemy()
    local_pgq = PgQueue()

    @local_pgq.task(name="t.ship")
    def ship(order_id: int) -> None:
        local_db.session.execute(text("INSERT INTO shipped VALUES (:id)"), {"id": order_id})

    app = Flask("usual_style")
    # Should the app's database be missed, the jobs would go to this throwaway embedded server
    # rather than the user's default one.
    spare = Path(tempfile.mkdtemp(prefix="pgqueue-test-spare-"))
    spare.chmod(0o755)
    app.config.update(
        SQLALCHEMY_DATABASE_URI=_url(database_url),
        PROPAGATE_EXCEPTIONS=False,
        PGQUEUE_EMBEDDED_DATA_DIR=str(spare / "postgres"),
    )
    local_db.init_app(app)
    local_pgq.init_app(app)

    def place(fail: int) -> dict[str, int]:
        order_id = local_db.session.scalar(text("INSERT INTO placed DEFAULT VALUES RETURNING id"))
        assert order_id is not None
        ship.enqueue(order_id)
        if fail:
            raise RuntimeError("payment declined")
        local_db.session.commit()
        return {"id": order_id}

    app.add_url_rule("/place/<int:fail>", view_func=place, methods=["POST"])
    queue = local_pgq.state(app).queue
    try:
        with app.app_context():
            local_db.session.execute(text("CREATE TABLE placed (id serial PRIMARY KEY)"))
            local_db.session.execute(text("CREATE TABLE shipped (order_id int NOT NULL)"))
            local_db.session.commit()
        queue.migrate()  # a no-op on the app's database, which has pgqueue's tables already
        client = app.test_client()
        statuses = [client.post(f"/place/{n % 2}").status_code for n in range(10)]
        assert statuses == [200, 500] * 5
        stats = queue.run_worker(concurrency=2, drain=True)
        with app.app_context():
            placed = sorted(local_db.session.scalars(text("SELECT id FROM placed")))
            shipped = sorted(local_db.session.scalars(text("SELECT order_id FROM shipped")))
        assert stats.claimed == 5
        assert len(placed) == 5
        assert shipped == placed
        assert _count(database_url, Job) == 5
        assert queue.engine.url.database == database_url.database
    finally:
        with app.app_context():
            local_db.engine.dispose()
        server = embedded.shared._SHARED.pop(spare / "postgres", None)
        if server is not None:
            server.stop()
        shutil.rmtree(spare, ignore_errors=True)


def test_another_extension_under_the_sqlalchemy_key_is_refused(database_url: URL) -> None:
    app = Flask("lite")
    app.extensions["sqlalchemy"] = object()
    with pytest.raises(ConfigurationError, match=r"PGQUEUE_DATABASE_URL"):
        PgQueue().init_app(app)
    assert "pgqueue" not in app.extensions
    # A separate jobs database is still a choice the app can make.
    app.config["PGQUEUE_DATABASE_URL"] = _url(database_url)
    separate = PgQueue()
    separate.init_app(app)
    assert separate.state(app).queue.url.database == database_url.database
