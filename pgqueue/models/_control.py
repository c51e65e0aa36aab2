"""The rows operators and schedulers write to steer the claim: per-queue switches and limits
(``QueueControl``), concurrency keys' counters and rate windows (``ConcurrencyKey``) and their
overrides by prefix (``KeyLimit``), the ticks periodic schedules have enqueued (``PeriodicTick``) and the
schedules operators paused (``ScheduleState``).
"""

from __future__ import annotations

import datetime as dt

from sqlalchemy import (
    BigInteger,
    Boolean,
    CheckConstraint,
    DateTime,
    Float,
    Index,
    Integer,
    Text,
    func,
    text,
)
from sqlalchemy.dialects.postgresql import ARRAY
from sqlalchemy.orm import Mapped, mapped_column

from pgqueue.models._base import Base

# A concurrency key's 32-bit hash, as ``sql.common.key_hash`` renders it for a key row: the
# expression of the index that leads from tickets' ``key_hash`` to key rows.
KEY_HASH_OF_KEY = "(CAST(CAST('x' || substr(md5(key), 1, 8) AS BIT(32)) AS INTEGER))"


# --- scheduling and queue control (migration pgqueue_0002) -----------------------------------


class QueueControl(Base):
    """Per-queue switches: paused, and a concurrency limit across all workers.

    A queue without a row is running and unlimited, so the common case costs the claim nothing
    but an anti-join against an empty set.
    """

    __tablename__ = "pgqueue_queues"

    name: Mapped[str] = mapped_column(Text, primary_key=True)
    """Queue name."""
    paused: Mapped[bool] = mapped_column(Boolean, server_default=text("false"))
    """While true no worker claims this queue's tickets (running jobs finish normally)."""
    concurrency_limit: Mapped[int | None] = mapped_column(Integer)
    """At most this many jobs of the queue RUNNING at once, across all workers; null = no limit."""
    running: Mapped[int] = mapped_column(Integer, server_default="0")
    """Jobs of the queue counted as RUNNING, maintained only while a limit is set: the claim adds
    what it claims and every exit from RUNNING subtracts, in the same statements. A counter on
    the locked row, not a count(*), because a claim waiting for this row's lock sees the row's
    newest version but only an older snapshot of ``pgqueue_jobs``."""
    updated_at: Mapped[dt.datetime] = mapped_column(
        DateTime(timezone=True), server_default=func.now()
    )
    """Last change of the switches."""
    max_depth: Mapped[int | None] = mapped_column(Integer)
    """Bounded queue: an enqueue that would take the queue above this many waiting jobs
    (queued, retrying or waiting on dependencies) raises ``QueueFull``; null = unbounded."""
    rate_limit: Mapped[int | None] = mapped_column(Integer)
    """At most this many jobs of the queue start in any window of ``rate_per`` seconds, across
    all workers; null = no rate limit."""
    rate_per: Mapped[float | None] = mapped_column(Float)
    """The rate limit's window in seconds."""
    recent_starts: Mapped[list[dt.datetime] | None] = mapped_column(ARRAY(DateTime(timezone=True)))
    """The latest starts of the queue's jobs (at most ``rate_limit``), written by the claim on
    this locked row: the sliding window the rate limit is checked against."""

    __table_args__ = (
        CheckConstraint(
            "concurrency_limit IS NULL OR concurrency_limit >= 1", name="limit_positive"
        ),
        CheckConstraint("max_depth IS NULL OR max_depth >= 1", name="max_depth_positive"),
        CheckConstraint(
            "(rate_limit IS NULL AND rate_per IS NULL) OR (rate_limit >= 1 AND rate_per > 0)",
            name="rate_valid",
        ),
    )


# --- flow control: per-key concurrency and rate limits (migration pgqueue_0012) -------------


class ConcurrencyKey(Base):
    """One concurrency key: its RUNNING count and recent starts, on one row the claim locks.

    Written by the enqueue of the key's first job; an enqueue holds a ``FOR KEY SHARE`` lock on
    it until its transaction ends (which no claim or outcome waits for). The claim reaches the
    rows of the keys its ready tickets carry (through the hash index), never the others, and
    maintenance deletes the row of a key no job has any more (``sql.maintenance``).
    """

    __tablename__ = "pgqueue_concurrency_keys"

    key: Mapped[str] = mapped_column(Text, primary_key=True)
    """The key (``concurrency_key`` of its jobs)."""
    key_limit: Mapped[int | None] = mapped_column(Integer)
    """The limit the key's task declared (``key_limit=``), written by enqueue; a
    ``KeyLimit`` override wins over it; null = no limit."""
    running: Mapped[int] = mapped_column(Integer, server_default="0")
    """The key's jobs counted as RUNNING: the claim adds what it claims and every exit from
    RUNNING subtracts, in the same statements (a counter on the locked row, for the reason
    ``QueueControl.running`` gives)."""
    recent_starts: Mapped[list[dt.datetime] | None] = mapped_column(ARRAY(DateTime(timezone=True)))
    """The key's latest starts, kept while a rate limit applies to it."""

    __table_args__ = (
        CheckConstraint("key_limit IS NULL OR key_limit >= 1", name="limit_positive"),
        # From a ready ticket's ``key_hash`` to the key rows of that hash (migration
        # pgqueue_0017). The expression must stay ``sql.common.key_hash`` as it renders.
        Index("ix_pgqueue_concurrency_keys_key_hash", text(KEY_HASH_OF_KEY)),
    )


class KeyLimit(Base):
    """An operator's override for every key starting with ``prefix`` (``set_key_limit``,
    ``set_rate_limit(key=...)``); the longest matching prefix wins, each key counted alone."""

    __tablename__ = "pgqueue_key_limits"

    prefix: Mapped[str] = mapped_column(Text, primary_key=True)
    """A key, or the start of keys (``"account:"``)."""
    key_limit: Mapped[int | None] = mapped_column(Integer)
    """At most this many RUNNING jobs per matching key; null = the task's ``key_limit``."""
    rate_limit: Mapped[int | None] = mapped_column(Integer)
    """At most this many starts per matching key in any window of ``rate_per`` seconds."""
    rate_per: Mapped[float | None] = mapped_column(Float)
    """The rate limit's window in seconds."""
    updated_at: Mapped[dt.datetime] = mapped_column(
        DateTime(timezone=True), server_default=func.now()
    )
    """Last change."""

    __table_args__ = (
        CheckConstraint("key_limit IS NULL OR key_limit >= 1", name="limit_positive"),
        CheckConstraint(
            "(rate_limit IS NULL AND rate_per IS NULL) OR (rate_limit >= 1 AND rate_per > 0)",
            name="rate_valid",
        ),
    )


class PeriodicTick(Base):
    """One enqueued tick of a periodic schedule. The primary key makes each tick happen once,
    however many schedulers race for it (insert ``ON CONFLICT DO NOTHING``)."""

    __tablename__ = "pgqueue_periodic_ticks"

    schedule_name: Mapped[str] = mapped_column(Text, primary_key=True)
    """The schedule's name (``periodic(name=...)``, default the task name)."""
    scheduled_at: Mapped[dt.datetime] = mapped_column(DateTime(timezone=True), primary_key=True)
    """The cron instant this tick stands for (UTC), not when it was enqueued."""
    job_id: Mapped[int | None] = mapped_column(BigInteger)
    """The job enqueued for the tick (no foreign key: pruning jobs keeps the tick history)."""
    created_at: Mapped[dt.datetime] = mapped_column(
        DateTime(timezone=True), server_default=func.now()
    )
    """When a scheduler enqueued it (database clock)."""


# --- schedules paused by operators (migration pgqueue_0027) ----------------------------------


class ScheduleState(Base):
    """An operator's switch of one periodic schedule, by name (``pause_schedule``,
    ``resume_schedule``). A schedule without a row runs; while ``paused``, no scheduler records
    or enqueues any of its ticks (the tick's insert checks the row under the schedule's lock),
    and on resume the ticks that fell while it was paused are dropped, not caught up."""

    __tablename__ = "pgqueue_schedules"

    name: Mapped[str] = mapped_column(Text, primary_key=True)
    """The schedule's name (``PeriodicTick.schedule_name``)."""
    paused: Mapped[bool] = mapped_column(Boolean, server_default=text("false"))
    """While true the schedule enqueues nothing."""
    changed_at: Mapped[dt.datetime] = mapped_column(
        DateTime(timezone=True), server_default=func.now()
    )
    """When it was last paused or resumed (database clock): a resumed schedule's ticks start
    after it."""
