"""The partitioned history (``history="partitioned"``), owned here: the states of jobs moved
there (read only when the executor's ``tables``, a ``jobs.JobTables``, include the history), the
maintenance move of finished jobs into ``pgqueue_job_history``, and the upkeep of its partitions
(``maintain``). The statements are ``sql.history``'s; over ``db.Executor``, never committing.

``maintain`` creates the coming days' partitions, drops the days past retention (and their
per-minute counts), and gives the rows the DEFAULT partition caught a day partition of their
own. It is behind ``PgQueue.maintain_history`` and ``pgqueue history maintain``. Partitions are
DDL: run it as the role that owns pgqueue's tables (the one that migrates). Workers only move
rows (``move_to_history``), which needs DML rights alone. A job whose day has no partition when
it is moved lands in the DEFAULT partition; the next ``maintain`` creates that day's partition
and moves those rows into it (or deletes them if their day is past retention), and reports how
many it found.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

from sqlalchemy.exc import DBAPIError

from pgqueue.db import Executor
from pgqueue.errors import NotSchemaOwner, ValidationError
from pgqueue.sql import history as history_sql
from pgqueue.sqlstates import is_insufficient_privilege
from pgqueue.states import JobState
from pgqueue.validation import MAX_DELAY_SECONDS, limit_count


def moved_state(db: Executor, job_id: int) -> JobState | None:
    """The state job ``job_id`` was moved to the history in, when ``db.tables`` include the
    history and it is there; else None (nothing reads the history then)."""
    return moved_states(db, [job_id]).get(job_id)


def moved_states(db: Executor, job_ids: Sequence[int]) -> dict[int, JobState]:
    """``{id: state}`` of those of ``job_ids`` moved to the history, when ``db.tables`` include
    it (else empty: nothing reads the history then)."""
    if not db.tables.partitioned or not job_ids:
        return {}
    rows = db.rows(history_sql.moved_states(), {"ids": list(job_ids)})
    return {job_id: JobState(state) for job_id, state in rows}


def move_to_history(db: Executor, *, age: float, limit: int) -> int:
    """Move up to ``limit`` jobs finished more than ``age`` seconds ago into the partitioned
    history; how many were moved."""
    params = {"age": age, "limit": limit}
    return int(db.rows(history_sql.move_finished(), params)[0][0])


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


# How many days of partitions one maintenance creates ahead at most: each is a table, and one
# transaction creating thousands of them runs out of the server's lock table.
MAX_DAYS_AHEAD: Final = 366
# How many days of history are kept at most: ten years, the bound of every duration pgqueue
# takes (far longer ones reach before the first date there is).
MAX_RETENTION_DAYS: Final = MAX_DELAY_SECONDS // 86_400


def maintain(ex: Executor, *, days_ahead: int, retention_days: int) -> HistoryMaintenance:
    """Create, drop and adopt partitions in ``ex``'s transaction (the caller commits).
    Raises ``NotSchemaOwner`` when this role may not change the tables."""
    days_ahead = limit_count(days_ahead, what="days_ahead")
    if days_ahead > MAX_DAYS_AHEAD:
        raise ValidationError(
            f"days_ahead must be at most {MAX_DAYS_AHEAD} (a year of daily partitions), "
            f"got {days_ahead}"
        )
    retention_days = limit_count(retention_days, what="retention_days")
    if retention_days > MAX_RETENTION_DAYS:
        raise ValidationError(
            f"retention_days must be at most {MAX_RETENTION_DAYS} (ten years), got {retention_days}"
        )
    try:
        return _maintain(ex, days_ahead=days_ahead, retention_days=retention_days)
    except DBAPIError as exc:
        if not is_insufficient_privilege(exc):
            raise
        reason = str(exc.orig).strip().splitlines()[0]
        raise NotSchemaOwner(
            f"history partitions are DDL and need the owner of {history_sql.HISTORY_TABLE}: "
            f"{reason} (SQLSTATE 42501); run `pgqueue history maintain` as the schema owner "
            "(workers need DML rights only)"
        ) from None


def _maintain(ex: Executor, *, days_ahead: int, retention_days: int) -> HistoryMaintenance:
    today: dt.date = ex.rows(history_sql.utc_today())[0][0]
    oldest_kept = today - dt.timedelta(days=retention_days)
    existing = {
        day: name
        for (name,) in ex.rows(history_sql.partitions())
        if (day := history_sql.partition_day(name)) is not None
    }
    dropped = []
    for day, name in sorted(existing.items()):
        if day < oldest_kept:
            ex.rows(history_sql.drop_partition(name))
            dropped.append(name)
    in_default: dict[dt.date, int] = {
        day: int(count) for day, count in ex.rows(history_sql.default_partition_days())
    }
    expired = sum(count for day, count in in_default.items() if day < oldest_kept)
    if expired:
        ex.rows(
            history_sql.delete_expired_from_default(),
            {"before": history_sql.day_start(oldest_kept)},
        )
    # The chart's per-minute counts go with the days they count.
    ex.rows(history_sql.delete_finished_minutes(), {"before": history_sql.day_start(oldest_kept)})
    created = []
    adopt = sorted(day for day in in_default if day >= oldest_kept and day not in existing)
    moved = 0
    if adopt:
        # A day's partition cannot be created while the DEFAULT partition holds rows of that
        # day: detach it, create the days, move their rows in, attach it again, all in this
        # transaction (readers wait for it; writers of history are only the maintenance move).
        ex.rows(history_sql.detach_default())
        for day in adopt:
            ex.rows(history_sql.create_day_partition(day))
            created.append(history_sql.partition_name(day))
            moved += int(ex.rows(history_sql.move_out_of_default(day))[0][0])
        ex.rows(history_sql.attach_default())
    for offset in range(days_ahead + 1):
        day = today + dt.timedelta(days=offset)
        if day not in existing and day not in adopt:
            ex.rows(history_sql.create_day_partition(day))
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
