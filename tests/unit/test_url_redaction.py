"""Database passwords never reach a repr, a log line or an error message.

A password can sit in the URL's user-info (unescaped ``@`` included, which SQLAlchemy's parser
cuts at the first ``@``) or in the query string (``password``/``sslpassword``, which libpq
accepts there); a string that does not parse as a URL at all (a libpq keyword string) is
redacted too.
"""

from __future__ import annotations

import pytest
from sqlalchemy.engine import make_url

from pgqueue.config import Settings
from pgqueue.database_urls import normalize_database_url, redact_url
from pgqueue.errors import ConfigurationError

SECRET = "Zq7SECRETx"


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        (f"postgresql://u:{SECRET}@host/db", "postgresql://u:***@host/db"),
        (f"postgresql://u:p@{SECRET}@host:5432/db", "postgresql://u:***@host:5432/db"),
        (f"postgresql://u:{SECRET}@x@y@host/db", "postgresql://u:***@host/db"),
        (f"postgresql://u:p/{SECRET}@host/db", "postgresql://u:***@host/db"),
        (f"postgresql://u:p%40{SECRET}@host/db", "postgresql://u:***@host/db"),
        (
            f"postgresql+psycopg://u@host/db?password={SECRET}&sslmode=require",
            "postgresql+psycopg://u@host/db?password=***&sslmode=require",
        ),
        (
            f"postgresql://u@host/db?sslmode=verify-full&sslpassword={SECRET}",
            "postgresql://u@host/db?sslmode=verify-full&sslpassword=***",
        ),
        (f"postgresql://u@host/db?PASSWORD={SECRET}", "postgresql://u@host/db?PASSWORD=***"),
        ("postgresql://u@host/db?application_name=a", "postgresql://u@host/db?application_name=a"),
    ],
)
def test_redacted_urls(url: str, shown: str) -> None:
    assert redact_url(url) == shown
    assert redact_url(make_url(url)) == shown


@pytest.mark.parametrize(
    "text",
    [
        f"host=h user=u password={SECRET} dbname=d",
        f"host=h password = '{SECRET} with space' dbname=d",
        f"postgresql://u:p@{SECRET}:x@host:notaport/db",
        f"postgresql://u:{SECRET}@host/db?password={SECRET}&x=%zz",
        f"not a url ://u:a@{SECRET}@h",
    ],
)
def test_strings_that_do_not_parse_are_redacted_too(text: str) -> None:
    redacted = redact_url(text)
    assert SECRET not in redacted
    assert "***" in redacted


def test_settings_repr_hides_passwords() -> None:
    settings = Settings(
        database_url=f"postgresql+psycopg://app:{SECRET}@db.internal/app",
        listen_database_url=f"postgresql://app@db.internal:5432/app?password={SECRET}",
        lease_seconds=45.0,
    )
    for text in (repr(settings), str(settings), f"{settings}", f"{settings!r}"):
        assert SECRET not in text
        assert "postgresql+psycopg://app:***@db.internal/app" in text
        assert "postgresql://app@db.internal:5432/app?password=***" in text
        assert "lease_seconds=45.0" in text
    # The values themselves are untouched: only what is shown is redacted.
    assert settings.database_url is not None and SECRET in settings.database_url


@pytest.mark.parametrize(
    "url",
    [
        f"postgresql://u:p@{SECRET}:x@host/db",  # the '@' makes the rest a bad port
        f"host=h password={SECRET}",
        f"mysql://u:p@{SECRET}@h/db",
    ],
)
def test_configuration_errors_hide_passwords(url: str) -> None:
    with pytest.raises(ConfigurationError) as raised:
        normalize_database_url(url)
    assert SECRET not in str(raised.value)
    with pytest.raises(ConfigurationError) as raised:
        Settings(database_url=url)
    assert SECRET not in str(raised.value)
