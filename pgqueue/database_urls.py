"""Database URLs as pgqueue takes and shows them: ``normalize_database_url`` checks a URL and
selects the psycopg 3 driver for pgqueue's own engines; ``redact_url`` hides every password in a
URL (or a string that only looks like one) before it reaches a log line or a message.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Final

from pgqueue.errors import ConfigurationError

if TYPE_CHECKING:
    from sqlalchemy.engine import URL


def normalize_database_url(url: str | URL) -> URL:
    """Parse a PostgreSQL URL and select the psycopg 3 driver for pgqueue's own engines;
    raise ConfigurationError if bad."""
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError

    try:
        parsed = make_url(url) if isinstance(url, str) else url
    except (ArgumentError, ValueError):
        # Not the parser's message: for a password holding ':' or '@' it quotes the part it
        # took for a port, which is part of the password.
        raise ConfigurationError(
            f"invalid database URL {redact_url(url)!r}: expected "
            "postgresql+psycopg://user:password@host:port/database (percent-encode '@', ':' "
            "and '/' in the user and password)"
        ) from None
    backend = parsed.get_backend_name()
    if backend not in {"postgresql", "postgres"}:
        raise ConfigurationError(
            f"pgqueue needs a PostgreSQL URL (postgresql+psycopg://...), got backend {backend!r}"
        )
    # Read from the name itself: SQLAlchemy's driver lookup loads a dialect, and it has none
    # named "postgres" (the scheme Heroku and many platforms hand out).
    _, _, driver = parsed.drivername.partition("+")
    # psycopg's asyncio driver is the same library: an asyncio app's URL serves as it is. A
    # psycopg2 URL is what most Flask apps configure: libpq takes the same parameters from
    # either, so the same URL names the server for psycopg 3, which pgqueue's engines need
    # (its driver fast path, COPY, LISTEN); the app's own engine stays on psycopg2.
    if driver in {"", "psycopg", "psycopg_async", "psycopg2"}:
        return parsed.set(drivername="postgresql+psycopg")
    raise ConfigurationError(
        f"pgqueue uses the psycopg 3 driver (postgresql+psycopg://); got driver {driver!r}"
    )


# Query parameters libpq reads a secret from (``?password=...`` works like the user-info's).
_SECRET_PARAMETERS: Final = frozenset({"password", "sslpassword"})
_HIDDEN: Final = "***"
# For strings that are not URLs: ``password=...`` in a libpq keyword string or a query string,
# the value quoted or not.
_SECRET_ASSIGNMENT: Final = re.compile(
    r"(?i)\b((?:ssl)?password\s*=\s*)(?:'(?:[^'\\]|\\.)*'?|[^&\s]*)"
)


def redact_url(url: str | URL) -> str:
    """``url`` as it may be shown (logs, messages, reprs): every password replaced by ``***``.

    The password of the user-info (``user:password@``, an unencoded ``@`` in it included) and
    the ``password``/``sslpassword`` query parameters are hidden; a string that does not parse
    as a URL is masked the same way by pattern.
    """
    from sqlalchemy.engine import URL, make_url
    from sqlalchemy.exc import ArgumentError

    if isinstance(url, URL):
        parsed = url
    else:
        try:
            parsed = make_url(url)
        except (ArgumentError, ValueError, TypeError):
            return _redact_unparsed(str(url))
    host = parsed.host or ""
    if "@" in host:
        # The parser ends the password at its first '@', libpq users expect the last one to
        # end it: what sits before the host's last '@' is the rest of the password.
        parsed = parsed.set(password=_HIDDEN, host=host.rpartition("@")[2])
    secret_keys = {key for key in parsed.query if key.lower() in _SECRET_PARAMETERS}
    if secret_keys:
        query = {
            key: _HIDDEN if key in secret_keys else value for key, value in parsed.query.items()
        }
        parsed = parsed.set(query=query)
    shown = parsed.render_as_string(hide_password=True)
    # render_as_string percent-encodes the '*' of a query value.
    for key in secret_keys:
        shown = shown.replace(f"{key}=%2A%2A%2A", f"{key}={_HIDDEN}")
    return shown


def _redact_unparsed(text: str) -> str:
    scheme, marker, rest = text.partition("://")
    if marker:
        before_query, question, query = rest.partition("?")
        credentials, at, host = before_query.rpartition("@")
        if at:
            user, colon, _ = credentials.partition(":")
            before_query = f"{user}:{_HIDDEN}@{host}" if colon else f"{_HIDDEN}@{host}"
        text = f"{scheme}://{before_query}{question}{query}"
    return _SECRET_ASSIGNMENT.sub(lambda match: match.group(1) + _HIDDEN, text)
