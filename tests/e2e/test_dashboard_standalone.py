"""``pgqueue dashboard`` as a real process on a free port of 127.0.0.1, read over HTTP: with the
token it prints (and an APP for task names from code), with an ``--auth-file`` (read-only),
behind a trusted proxy header, and behind a trusted TLS proxy with a secret file shared by two
processes; each mode one process for the module. Refused: a request without a login (401), a
login without the form's CSRF token (400), an action in read-only mode (403), logins past the
throttle (429)."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from click.testing import CliRunner
from server_databases import create_database, drop_database
from sqlalchemy import select
from sqlalchemy.engine import URL
from sqlalchemy.orm import Session
from support.dashboard import StandaloneProcess, standalone_login, start_standalone

from pgqueue import PgQueue
from pgqueue.cli import main
from pgqueue.dashboard.passwords import hash_password, matches
from pgqueue.models import AuditRecord

pytestmark = pytest.mark.slow

APP_SOURCE = """
from pgqueue import PgQueue

pgq = PgQueue()


@pgq.task(name="standalone.code_only", queue="from-code")
def code_only() -> None:
    pass
"""


@pytest.fixture(scope="module")
def url(server_url: URL, template_name: str) -> Iterator[URL]:
    database = create_database(server_url, template_name)
    yield database
    drop_database(server_url, database)


@pytest.fixture(scope="module")
def job_id(url: URL) -> Iterator[int]:
    queue = PgQueue(url)
    queue.task(name="standalone.noop", queue="plain")(_noop)
    yield queue.registry.get("standalone.noop").enqueue("<i>x</i>")
    queue.dispose()


def _noop(value: str) -> str:
    return value


@pytest.fixture(scope="module")
def directory(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("standalone")
    (path / "standalone_app.py").write_text(APP_SOURCE)
    return path


@pytest.fixture(scope="module")
def serve(url: URL, directory: Path) -> Iterator[list[StandaloneProcess]]:
    started: list[StandaloneProcess] = []
    yield started
    for served in started:
        served.process.terminate()
        served.process.wait(timeout=30)


def _post_forms(html: str) -> list[str]:
    """Where the page's POST forms go, in order."""
    return re.findall(r'<form[^>]*method="post" action="([^"]+)"', html)


def _token_of(html: str) -> str:
    found = re.search(r'name="csrf_token" value="([^"]+)"', html)
    assert found is not None
    return found.group(1)


def test_log_in_with_the_printed_token_then_every_page_and_an_action(
    url: URL, directory: Path, serve: list[StandaloneProcess], job_id: int
) -> None:
    served = start_standalone(url, directory, "standalone_app:pgq")
    serve.append(served)
    token_line = served.printed[-1]
    assert token_line.startswith("log in with this token (shown once): ")
    token = token_line.rsplit(" ", 1)[1]
    with httpx.Client(base_url=served.base) as client:
        anonymous = client.get(f"/jobs/{job_id}")
        assert anonymous.status_code == 401
        assert 'name="password"' in anonymous.text and 'name="user"' not in anonymous.text
        assert anonymous.headers["X-Frame-Options"] == "DENY"
        assert client.post(f"/jobs/{job_id}/cancel").status_code == 401
        assert client.get("/static/pgqueue.css").status_code == 200  # the login page's style
        wrong = standalone_login(client, password=token + "x", next="/jobs")
        assert wrong.status_code == 401 and "Wrong user or password." in wrong.text
        # A login without the form's CSRF token (posted from another site) logs nobody in.
        assert client.post("/login", data={"password": token}).status_code == 400
        # A login never sends the browser to another site.
        away = standalone_login(client, password=token, next="//evil.test/x")
        assert (away.status_code, away.headers["Location"]) == (303, "/")
        login = standalone_login(client, password=token, next=f"/jobs/{job_id}")
        assert (login.status_code, login.headers["Location"]) == (303, f"/jobs/{job_id}")
        assert "HttpOnly" in login.headers["Set-Cookie"]
        for path in ("/", "/jobs", f"/jobs/{job_id}", "/queues", "/workers"):
            assert client.get(path).status_code == 200, path
        page = client.get(f"/jobs/{job_id}")
        assert "&lt;i&gt;x&lt;/i&gt;" in page.text
        assert '<span class="user">token</span>' in page.text
        assert _post_forms(page.text)[0] == "/logout"
        assert "from-code" in client.get("/queues").text  # the APP's queue, with no job yet
        assert client.post(f"/jobs/{job_id}/cancel").status_code == 400  # no CSRF token
        cancelled = client.post(f"/jobs/{job_id}/cancel", data={"csrf_token": _token_of(page.text)})
        assert cancelled.status_code == 302
        assert "cancelled" in client.get(f"/jobs/{job_id}").text
        # An action's audit record names who logged in ("token" for the printed token).
        bulk = {"queue": "plain", "state": "cancelled", "action": "retry"}
        bulk["csrf_token"] = _token_of(client.get("/jobs").text)
        preview = client.post("/jobs/bulk", data=bulk)
        assert "This will retry 1 jobs." in preview.text
        confirm = {**bulk, "step": "confirm", "expected_count": "1"}
        assert client.post("/jobs/bulk", data=confirm).status_code == 302
        client.post("/logout")
        assert client.get("/").status_code == 401
    queue = PgQueue(url)
    try:
        with Session(queue.engine) as session:
            audit = session.execute(
                select(AuditRecord.actor, AuditRecord.action).order_by(AuditRecord.id)
            ).all()
        assert [tuple(row) for row in audit] == [("token", "cancel"), ("token", "retry")]
    finally:
        queue.dispose()


def test_auth_file_users_log_in_and_read_only_refuses_actions(
    url: URL, directory: Path, serve: list[StandaloneProcess], job_id: int
) -> None:
    made = CliRunner().invoke(
        main,
        ["dashboard", "--hash-password", "ada"],
        input="s3cret\ns3cret\n",
    )
    assert made.exit_code == 0, made.output
    line = made.output.strip().splitlines()[-1]
    assert line.startswith("ada:scrypt$") and matches("s3cret", line.split(":", 1)[1])
    users = directory / "users"
    users.write_text(f"# dashboard users\n{line}\nbob:{hash_password('other')}\n")
    served = start_standalone(url, directory, "--auth-file", str(users), "--read-only")
    serve.append(served)
    assert not any("token" in printed for printed in served.printed)
    with httpx.Client(base_url=served.base) as client:
        form = client.get("/")
        assert form.status_code == 401 and 'name="user"' in form.text
        for user, password in (("ada", "other"), ("eve", "s3cret"), ("ada", "")):
            bad = standalone_login(client, user=user, password=password)
            assert bad.status_code == 401, (user, password)
        good = standalone_login(client, user="ada", password="s3cret")
        assert good.status_code == 303
        page = client.get(f"/jobs/{job_id}")
        assert page.status_code == 200
        assert _post_forms(page.text) == ["/logout"]  # no action, only the way out
        assert '<span class="user">ada</span>' in page.text
        assert client.post(f"/jobs/{job_id}/delete").status_code == 403
        assert client.post("/queues/pause", data={"queue": "plain"}).status_code == 403


def test_a_trusted_proxy_header_names_the_user(
    url: URL, directory: Path, serve: list[StandaloneProcess]
) -> None:
    served = start_standalone(url, directory, "--trust-header", "X-Forwarded-User")
    serve.append(served)
    with httpx.Client(base_url=served.base) as client:
        missing = client.get("/")
        assert missing.status_code == 401 and "X-Forwarded-User" in missing.text
        page = client.get("/", headers={"X-Forwarded-User": "ada"})
        assert page.status_code == 200
        # The proxy owns the login: no way out offered here.
        assert "/logout" not in page.text
        # The header is the login: no form to post a token to.
        assert client.post("/login", data={"password": "x"}).status_code == 401


def _set_cookie(response: httpx.Response, name: str) -> str:
    """The ``Set-Cookie`` header ``response`` sets ``name`` with."""
    [header] = [h for h in response.headers.get_list("set-cookie") if h.startswith(f"{name}=")]
    return header


def _fail_logins(client: httpx.Client, count: int, addresses: list[str]) -> None:
    for n in range(count):
        forwarded = {"X-Forwarded-Proto": "https", "X-Forwarded-For": addresses[n % len(addresses)]}
        assert standalone_login(client, forwarded, password="wrong").status_code == 401


def test_a_trusted_tls_proxy_and_a_secret_file_shared_by_two_processes(
    url: URL, directory: Path, serve: list[StandaloneProcess]
) -> None:
    secret = directory / "secret"
    secret.write_text("0123456789abcdef" * 4 + "\n")
    proxied = start_standalone(
        url, directory, "--trusted-proxy", "127.0.0.1", "--secret-file", str(secret)
    )
    serve.append(proxied)
    token = proxied.printed[-1].rsplit(" ", 1)[1]
    with httpx.Client(base_url=proxied.base) as client:
        # The client address counted is the one the proxy forwards.
        _fail_logins(client, 6, ["203.0.113.9"])
        tls = {"X-Forwarded-Proto": "https", "X-Forwarded-For": "203.0.113.9"}
        held = standalone_login(client, tls, password=token)
        assert held.status_code == 429 and held.headers["Retry-After"] == "1"
        tls["X-Forwarded-For"] = "203.0.113.10"
        login = standalone_login(client, tls, password=token)
        assert login.status_code == 303
        cookie = _set_cookie(login, "pgqueue_login")
        for flag in ("; Secure", "; HttpOnly", "; SameSite=Lax", "; Path=/"):
            assert flag in cookie, (flag, cookie)
    logged_in = {"Cookie": cookie.split(";")[0]}

    # Another process with the same secret (a restart, or a second one behind a load
    # balancer) accepts the login; it was told of no proxy, so forwarded headers count for
    # nothing there: every failure is 127.0.0.1's, and no cookie is Secure over plain HTTP.
    same_secret = start_standalone(url, directory, "--secret-file", str(secret))
    serve.append(same_secret)
    with httpx.Client(base_url=same_secret.base) as client:
        assert client.get("/", headers=logged_in).status_code == 200
        _fail_logins(client, 6, [f"198.51.100.{n}" for n in range(6)])
        elsewhere = {"X-Forwarded-Proto": "https", "X-Forwarded-For": "198.51.100.99"}
        assert standalone_login(client, elsewhere, password="x").status_code == 429
        client.cookies.clear()
        form = client.get("/login", headers=elsewhere)
        assert "Secure" not in _set_cookie(form, "pgqueue_dashboard")

    # A process with a random secret of its own does not.
    own_secret = start_standalone(url, directory)
    serve.append(own_secret)
    with httpx.Client(base_url=own_secret.base) as client:
        assert client.get("/", headers=logged_in).status_code == 401
