"""Statements of flow control outside the claim: the operators' per-key overrides (limit and
rate, by key prefix) and queue rates, and the maintenance recount of the key counters.

What the claim and the enqueue read of these rows is ``sql.flow``'s.
"""

from __future__ import annotations

from functools import cache
from typing import Any

from sqlalchemy import Float, Integer, Select, Text, bindparam, case, delete, func, null, select
from sqlalchemy.dialects.postgresql import insert as pg_insert

from pgqueue.models import ConcurrencyKey, Job, KeyLimit, QueueControl
from pgqueue.sql.common import recounted


@cache
def set_key_override(field: str) -> Any:
    """Upsert the override ``prefix`` with ``field`` (``key_limit``, or ``rate`` for
    ``rate_limit`` and ``rate_per``) from the binds of the same names; then delete the row if
    it holds nothing any more. Returns nothing."""
    values: dict[str, Any]
    if field == "key_limit":
        values = {"key_limit": bindparam("key_limit", type_=Integer)}
    else:
        values = {
            "rate_limit": bindparam("rate_limit", type_=Integer),
            "rate_per": bindparam("rate_per", type_=Float),
        }
    prefix = bindparam("prefix", type_=Text)
    stmt = pg_insert(KeyLimit).values(prefix=prefix, **values)
    return stmt.on_conflict_do_update(
        index_elements=[KeyLimit.prefix],
        set_={**{name: stmt.excluded[name] for name in values}, "updated_at": func.now()},
    )


@cache
def delete_empty_override() -> Any:
    """Delete the override ``prefix`` when it holds neither a limit nor a rate."""
    return delete(KeyLimit).where(
        KeyLimit.prefix == bindparam("prefix", type_=Text),
        KeyLimit.key_limit.is_(None),
        KeyLimit.rate_limit.is_(None),
    )


@cache
def set_queue_rate() -> Any:
    """Upsert queue ``name``'s rate limit (binds ``rate_limit``, ``rate_per``; nulls remove it,
    and the kept starts with it)."""
    rate_limit = bindparam("rate_limit", type_=Integer)
    stmt = pg_insert(QueueControl).values(
        name=bindparam("name", type_=Text),
        rate_limit=rate_limit,
        rate_per=bindparam("rate_per", type_=Float),
    )
    return stmt.on_conflict_do_update(
        index_elements=[QueueControl.name],
        set_={
            "rate_limit": stmt.excluded.rate_limit,
            "rate_per": stmt.excluded.rate_per,
            "recent_starts": case(
                (stmt.excluded.rate_limit.is_(None), null()), else_=QueueControl.recent_starts
            ),
            "updated_at": func.now(),
        },
    )


@cache
def key_overrides() -> Select[str, int | None, int | None, float | None]:
    """All overrides: ``(prefix, key_limit, rate_limit, rate_per)``, by prefix."""
    return select(
        KeyLimit.prefix, KeyLimit.key_limit, KeyLimit.rate_limit, KeyLimit.rate_per
    ).order_by(KeyLimit.prefix)


@cache
def lock_counted_keys() -> Select[str]:
    """Keys whose counter is above zero, their rows locked (SKIP LOCKED: keys a claim holds
    right now are left for later) until the transaction ends: the first half of
    ``recount_keys``."""
    return (
        select(ConcurrencyKey.key)
        .where(ConcurrencyKey.running > 0)
        .order_by(ConcurrencyKey.key)
        .with_for_update(skip_locked=True, key_share=True)
    )


@cache
def recount_keys() -> Any:  # a ReturningUpdate
    """Reset the ``running`` counter of the keys ``keys`` (array) to their RUNNING jobs where
    it drifted (a job ended by hand, say); ``(key, running)`` of each corrected key.

    Run in the transaction that locked those rows (``lock_counted_keys``), as a later
    statement, for the reason ``sql.maintenance.recount_running`` gives."""
    return recounted(ConcurrencyKey.key, ConcurrencyKey.running, Job.concurrency_key, "keys")
