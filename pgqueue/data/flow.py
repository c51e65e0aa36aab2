"""Flow control's settings (``sql.flow_settings``): per-key limits and rates, queue rates, and
correcting drifted key counters; over ``db.Executor``, never committing.
"""

from __future__ import annotations

from typing import Any

from pgqueue.db import Executor
from pgqueue.sql import flow_settings as flow_settings_sql


def set_key_limit(db: Executor, prefix: str, key_limit: int | None) -> None:
    """Set (None: remove) the per-key limit override of keys starting with ``prefix``."""
    ex = db
    ex.rows(
        flow_settings_sql.set_key_override("key_limit"), {"prefix": prefix, "key_limit": key_limit}
    )
    ex.rows(flow_settings_sql.delete_empty_override(), {"prefix": prefix})


def set_key_rate(db: Executor, prefix: str, rate_limit: int | None, per: float | None) -> None:
    """Set (None: remove) the per-key rate limit of keys starting with ``prefix``."""
    ex = db
    params = {"prefix": prefix, "rate_limit": rate_limit, "rate_per": per}
    ex.rows(flow_settings_sql.set_key_override("rate"), params)
    ex.rows(flow_settings_sql.delete_empty_override(), {"prefix": prefix})


def set_queue_rate(db: Executor, queue: str, rate_limit: int | None, per: float | None) -> None:
    """Set (None: remove) the rate limit of ``queue``."""
    params = {"name": queue, "rate_limit": rate_limit, "rate_per": per}
    db.rows(flow_settings_sql.set_queue_rate(), params)


def key_overrides(db: Executor) -> list[Any]:
    """``(prefix, key_limit, rate_limit, rate_per)`` of every key override."""
    return list(db.rows(flow_settings_sql.key_overrides()))


def recount_keys(db: Executor) -> dict[str, int]:
    """Correct drifted ``running`` counters of concurrency keys (call inside a transaction);
    ``{key: corrected count}``. Keys a claim is using right now are skipped."""
    ex = db
    keys = [row[0] for row in ex.rows(flow_settings_sql.lock_counted_keys())]
    if not keys:
        return {}
    return {
        key: running for key, running in ex.rows(flow_settings_sql.recount_keys(), {"keys": keys})
    }
