"""A side table where handlers record their effects (``(job id, attempt)`` rows written through
``ctx.session``): what committed shows which attempts' writes survived."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from sqlalchemy import Engine, text

from pgqueue import JobContext

TABLE = "handler_effects"


@contextmanager
def effects_table(engine: Engine) -> Iterator[None]:
    """The table, for the block."""
    with engine.begin() as connection:
        connection.execute(text(f"CREATE TABLE {TABLE} (job_id bigint, attempt int)"))
    try:
        yield
    finally:
        with engine.begin() as connection:
            connection.execute(text(f"DROP TABLE {TABLE}"))


def write_effect(ctx: JobContext) -> None:
    """Record this attempt's effect in the handler's session (committed with it, or never)."""
    ctx.session.execute(
        text(f"INSERT INTO {TABLE} VALUES (:job, :attempt)"),
        {"job": ctx.job_id, "attempt": ctx.attempt},
    )


def committed_effects(engine: Engine) -> list[tuple[int, int]]:
    """``(job id, attempt)`` of every effect committed, sorted."""
    with engine.connect() as connection:
        rows = connection.execute(text(f"SELECT job_id, attempt FROM {TABLE} ORDER BY 1, 2"))
        return [(row[0], row[1]) for row in rows]
