"""The standalone dashboard's login through its WSGI app (Werkzeug's test client) on a real
database: the login form's CSRF token (a POST without it, or with another browser's, is refused
and logs nobody in; the token is renewed at the login), failed logins throttled per client
address and per user name with 429 and a growing Retry-After (a success resetting them), the
cookies' attributes over plain HTTP and over TLS, and a secret shared by two processes."""

from __future__ import annotations

import re
from http.cookies import SimpleCookie

from werkzeug.test import Client, TestResponse

from pgqueue import PgQueue
from pgqueue.dashboard.passwords import Users, hash_password
from pgqueue.dashboard.standalone import LOGIN_COOKIE, Auth, application
from pgqueue.dashboard.throttle import ADDRESS_FREE_FAILURES, USER_FREE_FAILURES, LoginThrottle

TOKEN = "the-printed-token"
SECRET = b"s" * 32


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _token_of(html: str) -> str:
    found = re.search(r'name="csrf_token" value="([^"]+)"', html)
    assert found is not None, html
    return found.group(1)


def _log_in(client: Client, address: str = "127.0.0.1", **form: str) -> TestResponse:
    """POST the login form as a browser would: the form first, then its token."""
    page = client.get("/login", environ_base={"REMOTE_ADDR": address})
    data = {"csrf_token": _token_of(page.text), **form}
    return client.post("/login", data=data, environ_base={"REMOTE_ADDR": address})


def _cookies(response: TestResponse) -> dict[str, dict[str, str | bool]]:
    """The cookies ``response`` sets, each with its attributes (lower-cased names)."""
    found: dict[str, dict[str, str | bool]] = {}
    for header in response.headers.getlist("Set-Cookie"):
        parsed: SimpleCookie = SimpleCookie()
        parsed.load(header)
        for name, morsel in parsed.items():
            found[name] = {k: v for k, v in morsel.items() if v}
    return found


def test_the_login_form_carries_a_csrf_token_and_a_post_without_it_is_refused(
    pgq: PgQueue,
) -> None:
    client = Client(application(pgq, Auth(token=TOKEN)))
    refused = client.get("/jobs")  # the 401 page is a login form too, with its token
    assert refused.status_code == 401
    assert _token_of(refused.text)

    missing = client.post("/login", data={"password": TOKEN})
    assert missing.status_code == 400 and "did not come from this dashboard" in missing.text
    assert LOGIN_COOKIE not in _cookies(missing)
    # Another browser's token (an attacker's page posting one it fetched itself).
    other = Client(application(pgq, Auth(token=TOKEN), secret_key=SECRET))
    foreign = _token_of(other.get("/login").text)
    forged = client.post("/login", data={"password": TOKEN, "csrf_token": foreign})
    assert forged.status_code == 400 and LOGIN_COOKIE not in _cookies(forged)
    assert client.get("/").status_code == 401

    before = _token_of(client.get("/login").text)
    done = client.post("/login", data={"password": TOKEN, "csrf_token": before})
    assert done.status_code == 303 and LOGIN_COOKIE in _cookies(done)
    page = client.get("/jobs")
    assert page.status_code == 200
    assert _token_of(page.text) != before  # renewed: a token planted before is worthless


def test_failed_logins_from_one_address_wait_longer_each_time(pgq: PgQueue) -> None:
    clock = Clock()
    client = Client(application(pgq, Auth(token=TOKEN), throttle=LoginThrottle(clock=clock)))
    for _ in range(ADDRESS_FREE_FAILURES + 1):
        assert _log_in(client, password="wrong").status_code == 401
    held = _log_in(client, password=TOKEN)  # the right token, not even checked
    assert held.status_code == 429 and held.headers["Retry-After"] == "1"
    assert "Too many failed logins: try again in 1 seconds." in held.text
    assert LOGIN_COOKIE not in _cookies(held)
    clock.now += 1
    assert _log_in(client, password="wrong").status_code == 401
    assert _log_in(client, password="wrong").headers["Retry-After"] == "2"
    # Another address is not held back.
    assert _log_in(Client(client.application), "192.0.2.9", password=TOKEN).status_code == 303
    clock.now += 2
    assert _log_in(client, password=TOKEN).status_code == 303
    # The success reset the count: free failures again.
    assert _log_in(client, password="wrong").status_code == 401
    assert _log_in(client, password="wrong").status_code == 401


def test_failed_logins_as_one_user_hold_that_name_back_from_every_address(
    pgq: PgQueue,
) -> None:
    users = Users({"ada": hash_password("s3cret"), "bob": hash_password("other")})
    clock = Clock()
    app = application(pgq, Auth(users=users), throttle=LoginThrottle(clock=clock))
    for n in range(USER_FREE_FAILURES + 1):
        answer = _log_in(Client(app), f"203.0.113.{n}", user="ada", password="guess")
        assert answer.status_code == 401
    held = _log_in(Client(app), "198.51.100.1", user="ada", password="s3cret")
    assert held.status_code == 429 and held.headers["Retry-After"] == "1"
    assert _log_in(Client(app), "198.51.100.1", user="bob", password="other").status_code == 303
    clock.now += 1
    assert _log_in(Client(app), "198.51.100.1", user="ada", password="s3cret").status_code == 303
    assert _log_in(Client(app), "198.51.100.2", user="ada", password="guess").status_code == 401


def test_cookies_are_httponly_samesite_lax_and_secure_over_tls(pgq: PgQueue) -> None:
    app = application(pgq, Auth(token=TOKEN))
    for base, secure in (("http://dash.test/", False), ("https://dash.test/", True)):
        client = Client(app)
        form = client.get("/login", base_url=base)
        data = {"password": TOKEN, "csrf_token": _token_of(form.text)}
        login = client.post("/login", data=data, base_url=base)
        logout = client.post("/logout", base_url=base)
        set_by = {
            "form": _cookies(form)["pgqueue_dashboard"],
            "login": _cookies(login)[LOGIN_COOKIE],
            "renewed session": _cookies(login)["pgqueue_dashboard"],
            "logout": _cookies(logout)[LOGIN_COOKIE],
        }
        for what, cookie in set_by.items():
            assert cookie["httponly"] is True, (base, what)
            assert cookie["samesite"] == "Lax", (base, what)
            assert cookie["path"] == "/", (base, what)
            assert bool(cookie.get("secure")) is secure, (base, what)


def test_a_shared_secret_keeps_logins_across_processes_and_users_removed_out(
    pgq: PgQueue,
) -> None:
    users = Users({"ada": hash_password("s3cret")})
    first = Client(application(pgq, Auth(users=users), secret_key=SECRET))
    assert _log_in(first, user="ada", password="s3cret").status_code == 303
    cookie = first.get_cookie(LOGIN_COOKIE)
    assert cookie is not None

    def opens(app: object) -> int:
        other = Client(app)  # type: ignore[arg-type]
        other.set_cookie(LOGIN_COOKIE, cookie.value)
        return other.get("/").status_code

    assert opens(application(pgq, Auth(users=users), secret_key=SECRET)) == 200
    assert opens(application(pgq, Auth(users=users))) == 401  # a random secret of its own
    without_ada = Users({"bob": hash_password("other")})
    assert opens(application(pgq, Auth(users=without_ada), secret_key=SECRET)) == 401
