"""The standalone dashboard's parts that need no server: password hashes and auth files, the
bind address, where a login may send the browser, the signing secret read from a file (a short
one refused), what waitress is told of a trusted proxy, and the refusals to serve without
authentication off loopback or with a short secret (one line, exit 2, before any database is
reached)."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from pgqueue.cli import main
from pgqueue.dashboard.passwords import Users, hash_password, matches
from pgqueue.dashboard.standalone import (
    MIN_SECRET_BYTES,
    is_loopback,
    local_target,
    parse_bind,
    read_secret,
    server_options,
)
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


def test_a_secret_file_gives_its_bytes_and_a_short_one_is_refused(tmp_path: Path) -> None:
    good = tmp_path / "secret"
    good.write_bytes(b"  " + b"k" * MIN_SECRET_BYTES + b"\n")
    assert read_secret(good) == b"k" * MIN_SECRET_BYTES
    short = tmp_path / "short"
    short.write_text("k" * (MIN_SECRET_BYTES - 1) + "\n" * 5)
    with pytest.raises(
        ConfigurationError, match=r"the secret is 31 bytes, too short .* at least 32"
    ):
        read_secret(short)


def test_a_trusted_proxy_is_believed_for_the_scheme_and_the_client_address_only() -> None:
    from waitress.adjustments import Adjustments

    assert server_options(None) == {}
    options = server_options("10.0.0.5")
    adjusted = Adjustments(**options)  # waitress accepts them as they are
    assert adjusted.trusted_proxy == "10.0.0.5" and adjusted.trusted_proxy_count == 1
    assert adjusted.trusted_proxy_headers == {"x-forwarded-proto", "x-forwarded-for"}


def _dashboard_refusal(args: list[str]) -> None:
    refused = CliRunner().invoke(
        main, ["dashboard", *args], env={"PGQUEUE_DATABASE_URL": "postgresql+psycopg://x@nowhere/y"}
    )
    assert refused.exit_code == 2
    lines = refused.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), refused.stderr


@pytest.mark.parametrize(
    "args",
    [
        ["--bind", "0.0.0.0:8321", "--no-auth"],
        ["--bind", "[::]:8321", "--no-auth"],
        ["--no-auth", "--trust-header", "X-User"],
    ],
)
def test_no_unauthenticated_dashboard_off_loopback(args: list[str]) -> None:
    _dashboard_refusal(args)


def test_no_dashboard_with_a_short_secret(tmp_path: Path) -> None:
    short = tmp_path / "secret"
    short.write_text("changeme\n")
    _dashboard_refusal(["--secret-file", str(short)])
