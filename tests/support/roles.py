"""The role with DML rights only that pgqueue's documentation tells operators to create, for
the tests that run pgqueue as it (``app_role``), directly or through PgBouncer.

The role is made by running the SQL block of the documentation's "Security and least
privilege" page itself (role, database and password substituted), so the documentation and
the tests cannot drift.
"""

from __future__ import annotations

import itertools
import os
import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from server_databases import admin_engine
from sqlalchemy import text
from sqlalchemy.engine import URL

# The documentation page whose SQL block makes the role.
SECURITY_PAGE = Path(__file__).resolve().parents[2] / "docs" / "explanation" / "security.md"
PASSWORD = "pgqueue-app-secret"
_counter = itertools.count()


def readme_sql() -> list[str]:
    """The statements of the SQL block of the "Security and least privilege" page, comments
    dropped and whitespace collapsed, exactly as documented (role ``app``, database ``mydb``,
    password ``'...'``)."""
    page = SECURITY_PAGE.read_text(encoding="utf-8")
    assert page.startswith("# Security and least privilege\n"), f"{SECURITY_PAGE} has moved"
    section = page.split("\n## ", 1)[0]
    block = re.search(r"```sql\n(.*?)```", section, re.DOTALL)
    assert block is not None, "the least-privilege page has no ```sql block before its sections"
    lines = [line for line in block.group(1).splitlines() if not line.lstrip().startswith("--")]
    return [" ".join(s.split()) for s in "\n".join(lines).split(";") if s.strip()]


def grant_statements(role: str, database: str) -> list[str]:
    """The documented statements for ``role`` on ``database``."""
    statements = []
    for statement in readme_sql():
        statement = re.sub(r"\bapp\b", role, statement)
        statement = re.sub(r"\bmydb\b", f'"{database}"', statement)
        statements.append(statement.replace("'...'", f"'{PASSWORD}'"))
    return statements


@pytest.fixture
def app_role(database_url: URL, empty_database_url: URL) -> Iterator[str]:
    """A login role holding only the documented grants on ``database_url``."""
    role = f"pgqueue_app_{os.getpid()}_{next(_counter)}"
    assert re.fullmatch(r"[a-z0-9_]+", role)  # interpolated as an identifier below
    admin = admin_engine(database_url)
    with admin.connect() as connection:
        # What PostgreSQL 15+ does by default, done explicitly so the test means the same on 14;
        # and no TEMP or CONNECT through PUBLIC: the role gets only what the documentation grants.
        connection.execute(text("REVOKE CREATE ON SCHEMA public FROM PUBLIC"))
        connection.execute(text(f'REVOKE ALL ON DATABASE "{database_url.database}" FROM PUBLIC'))
        for statement in grant_statements(role, str(database_url.database)):
            connection.execute(text(statement))
    empty_admin = admin_engine(empty_database_url)
    with empty_admin.connect() as connection:
        connection.execute(text("REVOKE CREATE ON SCHEMA public FROM PUBLIC"))
        connection.execute(
            text(f'GRANT CONNECT ON DATABASE "{empty_database_url.database}" TO {role}')
        )
    try:
        yield role
    finally:
        for engine in (admin, empty_admin):
            with engine.connect() as connection:
                connection.execute(
                    text(
                        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = :r"
                    ),
                    {"r": role},
                )
                connection.execute(text(f"DROP OWNED BY {role}"))
            engine.dispose()
        with admin.connect() as connection:
            connection.execute(text(f"DROP ROLE {role}"))
        admin.dispose()


def as_role(url: URL, role: str) -> URL:
    """``url`` logging in as ``role`` (made by ``app_role``)."""
    return url.set(username=role, password=PASSWORD)
