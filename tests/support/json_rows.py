"""Job rows holding JSON that PostgreSQL accepts and Python cannot decode, written as another
client or a hand edit could: for the tests of every path that reads a job's JSON."""

from __future__ import annotations

from sqlalchemy import Engine, text


def nest_args(engine: Engine, job_id: int, depth: int) -> None:
    """Give a job ``args`` nested ``depth`` levels deep, as another client could.

    PostgreSQL's own JSON parser refuses nesting beyond its stack (about 15,000 levels with the
    default ``max_stack_depth``), so the deeper case is written through a binary-coercible cast
    that skips the parser, created and dropped in the same transaction (superuser only)."""
    deep = "[" * depth + "]" * depth
    with engine.begin() as connection:
        if depth > 10_000:
            connection.execute(text("CREATE CAST (text AS json) WITHOUT FUNCTION"))
        updated = connection.execute(
            text("UPDATE pgqueue_jobs SET args = CAST(CAST(:deep AS text) AS json) WHERE id = :id"),
            {"deep": deep, "id": job_id},
        ).rowcount
        if depth > 10_000:
            connection.execute(text("DROP CAST (text AS json)"))
    assert updated == 1
