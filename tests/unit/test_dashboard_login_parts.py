"""The standalone dashboard's parts that need no server: password hashes and auth files, the
bind address, where a login may send the browser, and the refusal to serve without
authentication off loopback (one line, exit 2, before any database is reached)."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from pgqueue.cli import main
from pgqueue.dashboard.passwords import Users, hash_password, matches
from pgqueue.dashboard.standalone import is_loopback, local_target, parse_bind
from pgqueue.errors import ConfigurationError


def test_a_hash_matches_its_password_only() -> None:
    encoded = hash_password("pässwörd")
    assert encoded.startswith("scrypt$16384$8$1$")
    assert encoded != hash_password("pässwörd")  # salted
    assert matches("pässwörd", encoded)
    assert not matches("passwort", encoded)
    assert not matches("pässwörd", encoded.replace("scrypt$", "md5$"))
    assert not matches("x", "scrypt$not$a$hash$at$all")


def test_an_auth_file_names_users_and_refuses_what_is_not_a_line(tmp_path: Path) -> None:
    good = tmp_path / "users"
    good.write_text(f"# who\n\nada:{hash_password('a')}\nbob:{hash_password('b')}\n")
    users = Users.read(good)
    assert sorted(users.hashes) == ["ada", "bob"]
    assert users.check("ada", "a") and not users.check("ada", "b")
    assert not users.check("eve", "a")
    bad = tmp_path / "bad"
    bad.write_text("ada:plaintext\n")
    with pytest.raises(ConfigurationError, match=r"bad:1: expected user:scrypt"):
        Users.read(bad)
    empty = tmp_path / "empty"
    empty.write_text("# nobody\n")
    with pytest.raises(ConfigurationError, match="names no user"):
        Users.read(empty)


@pytest.mark.parametrize(
    ("host", "loopback"),
    [
        ("127.0.0.1", True),
        ("127.0.0.2", True),
        ("::1", True),
        ("[::1]", True),
        ("localhost", True),
        ("0.0.0.0", False),
        ("::", False),
        ("192.168.1.10", False),
        ("no-such-host.invalid", False),
    ],
)
def test_loopback_addresses(host: str, loopback: bool) -> None:
    assert is_loopback(host) is loopback


def test_bind_addresses() -> None:
    assert parse_bind("127.0.0.1:8321") == ("127.0.0.1", 8321)
    assert parse_bind("[::1]:0") == ("::1", 0)
    for bad in ("8321", ":8321", "host:", "host:99999", "host:http"):
        with pytest.raises(ConfigurationError, match="expected HOST:PORT"):
            parse_bind(bad)


@pytest.mark.parametrize(
    ("target", "sent_to"),
    [
        ("/jobs/1", "/jobs/1"),
        ("/jobs?state=failed", "/jobs?state=failed"),
        ("//evil.test/x", "/"),
        ("https://evil.test/", "/"),
        ("/\\evil.test", "/"),
        ("/\t/evil.test", "/"),
        ("/\n/evil.test", "/"),
        ("/jobs?task=a b", "/"),
        ("jobs", "/"),
        ("", "/"),
    ],
)
def test_a_login_sends_the_browser_to_this_dashboard_only(target: str, sent_to: str) -> None:
    assert local_target(target, "/") == sent_to


@pytest.mark.parametrize(
    "args",
    [
        ["--bind", "0.0.0.0:8321", "--no-auth"],
        ["--bind", "[::]:8321", "--no-auth"],
        ["--no-auth", "--trust-header", "X-User"],
    ],
)
def test_no_unauthenticated_dashboard_off_loopback(args: list[str]) -> None:
    refused = CliRunner().invoke(
        main, ["dashboard", *args], env={"PGQUEUE_DATABASE_URL": "postgresql+psycopg://x@nowhere/y"}
    )
    assert refused.exit_code == 2
    lines = refused.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), refused.stderr
