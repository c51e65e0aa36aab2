"""The partitioned history's partitions (``history="partitioned"``): ``maintain`` creates the
coming days' partitions, drops the days past retention (and their per-minute counts), and
gives the rows the DEFAULT partition caught a day partition of their own. Behind
``PgQueue.maintain_history`` and ``pgqueue history maintain``.

Partitions are DDL: run this as the role that owns pgqueue's tables (the one that migrates).
Workers only move rows (``sql.history.move_finished``), which needs DML rights alone. A job
whose day has no partition when it is moved lands in the DEFAULT partition; the next
``maintain`` creates that day's partition and moves those rows into it (or deletes them if
their day is past retention), and reports how many it found.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass

from sqlalchemy import Connection, func, select
from sqlalchemy.exc import DBAPIError

from pgqueue.errors import NotSchemaOwner, is_insufficient_privilege
from pgqueue.sql import history as history_sql
from pgqueue.validation import limit_count


@dataclass(frozen=True, slots=True)
class HistoryMaintenance:
    """What one ``maintain`` did."""

    created: tuple[str, ...]
    """Partitions created (days ahead, and days the DEFAULT partition had rows of)."""
    dropped: tuple[str, ...]
    """Day partitions dropped, being past retention."""
    from_default: int
    """Rows the DEFAULT partition held for days within retention, now in their day's
    partition."""
    expired_in_default: int
    """Rows the DEFAULT partition held for days past retention, deleted."""
    kept_days: int
    """Day partitions there are now."""

    def summary(self) -> str:
        """One line for operators: what changed, and what the DEFAULT partition held."""
        parts = [
            f"history: {len(self.created)} partitions created",
            f"{len(self.dropped)} dropped",
            f"{self.kept_days} days kept",
        ]
        if self.from_default:
            parts.append(
                f"{self.from_default} jobs found in the DEFAULT partition (their day had no "
                "partition) moved to their day's partition"
            )
        if self.expired_in_default:
            parts.append(
                f"{self.expired_in_default} expired jobs deleted from the DEFAULT partition"
            )
        return ", ".join(parts)


def maintain(connection: Connection, *, days_ahead: int, retention_days: int) -> HistoryMaintenance:
    """Create, drop and adopt partitions in ``connection``'s transaction (the caller commits).
    Raises ``NotSchemaOwner`` when this role may not change the tables."""
    days_ahead = limit_count(days_ahead, what="days_ahead")
    retention_days = limit_count(retention_days, what="retention_days")
    try:
        return _maintain(connection, days_ahead=days_ahead, retention_days=retention_days)
    except DBAPIError as exc:
        if not is_insufficient_privilege(exc):
            raise
        reason = str(exc.orig).strip().splitlines()[0]
        raise NotSchemaOwner(
            f"history partitions are DDL and need the owner of {history_sql.HISTORY_TABLE}: "
            f"{reason} (SQLSTATE 42501); run `pgqueue history maintain` as the schema owner "
            "(workers need DML rights only)"
        ) from None


def _maintain(
    connection: Connection, *, days_ahead: int, retention_days: int
) -> HistoryMaintenance:
    today: dt.date = connection.execute(
        select(func.date(func.timezone("UTC", func.now())))
    ).scalar_one()
    oldest_kept = today - dt.timedelta(days=retention_days)
    existing = {
        day: name
        for name in connection.execute(history_sql.partitions()).scalars()
        if (day := history_sql.partition_day(name)) is not None
    }
    dropped = []
    for day, name in sorted(existing.items()):
        if day < oldest_kept:
            connection.execute(history_sql.drop_partition(name))
            dropped.append(name)
    in_default: dict[dt.date, int] = {
        day: int(count) for day, count in connection.execute(history_sql.default_partition_days())
    }
    expired = sum(count for day, count in in_default.items() if day < oldest_kept)
    if expired:
        connection.execute(
            history_sql.delete_expired_from_default(),
            {"before": history_sql.day_start(oldest_kept)},
        )
    # The chart's per-minute counts go with the days they count.
    connection.execute(
        history_sql.delete_finished_minutes(), {"before": history_sql.day_start(oldest_kept)}
    )
    created = []
    adopt = sorted(day for day in in_default if day >= oldest_kept and day not in existing)
    moved = 0
    if adopt:
        # A day's partition cannot be created while the DEFAULT partition holds rows of that
        # day: detach it, create the days, move their rows in, attach it again, all in this
        # transaction (readers wait for it; writers of history are only the maintenance move).
        connection.execute(history_sql.detach_default())
        for day in adopt:
            connection.execute(history_sql.create_day_partition(day))
            created.append(history_sql.partition_name(day))
            moved += int(connection.execute(history_sql.move_out_of_default(day)).scalar_one())
        connection.execute(history_sql.attach_default())
    for offset in range(days_ahead + 1):
        day = today + dt.timedelta(days=offset)
        if day not in existing and day not in adopt:
            connection.execute(history_sql.create_day_partition(day))
            created.append(history_sql.partition_name(day))
    kept = {day for day in existing if day >= oldest_kept}
    kept.update(history_sql.partition_day(name) or today for name in created)
    return HistoryMaintenance(
        created=tuple(created),
        dropped=tuple(dropped),
        from_default=moved,
        expired_in_default=expired,
        kept_days=len(kept),
    )
