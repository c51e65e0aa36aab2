"""Statements and fragments of flow control: per-key concurrency limits and rate limits.

The claim (``sql.claim``) enforces both on rows it locks: a key's ``pgqueue_concurrency_keys``
row (its RUNNING counter and latest starts) and a queue's ``pgqueue_queues`` row (its rate and
latest starts). This module holds the pieces the claim and the enqueue share (the sliding
window, the longest-prefix override, the key rows an enqueue writes), the operators' writes
(``set_key_limit``, ``set_rate_limit``), the claimer's reads (which controls exist, how long
until a full rate window frees) and the maintenance recount of the key counters.

A rate limit of n per ``per`` seconds is a sliding window: the claim starts a job only while
fewer than n starts lie in the last ``per`` seconds plus a margin (``RATE_MARGIN_*``), counted
from the start times kept on the locked row. The margin covers the time between the claim's
clock reading and the handler's actual start, which differs from job to job (commit, answer,
hand-off to a pool thread): without it two starts claimed ``per`` seconds apart could run
closer than that. The claim returns each rate-limited job's ``start_within`` (the
stamp's delay after the statement began, plus the margin) and the worker starts its handler
only within that time of sending the claim, or gives the job back unstarted (``release``): so every handler start lies within the margin after its stamp, and
no window of ``per`` seconds of handler starts holds more than n, however late a loaded host
hands a job to a thread.
"""

from __future__ import annotations

from functools import cache
from typing import Any, Final

from sqlalchemy import (
    ColumnElement,
    DateTime,
    Float,
    Integer,
    Select,
    Text,
    bindparam,
    case,
    cast,
    column,
    delete,
    false,
    func,
    literal,
    null,
    or_,
    select,
    true,
    update,
)
from sqlalchemy.dialects.postgresql import ARRAY
from sqlalchemy.dialects.postgresql import array as pg_array
from sqlalchemy.dialects.postgresql import insert as pg_insert

from pgqueue.models import ConcurrencyKey, Job, KeyLimit, MessageQueue, QueueControl
from pgqueue.sql.common import key_hash, recounted, seconds
from pgqueue.states import JobState

# The window's margin: a tenth of the window, at most this many seconds. Starts are stamped
# when the claim commits; handlers start a few milliseconds later on a quiet host and up to
# tens of milliseconds later on a loaded one, so a hundred milliseconds keeps any window of
# handler starts within the limit while costing a limit of n per second a tenth of its rate.
RATE_MARGIN_SECONDS: Final = 0.1
RATE_MARGIN_SHARE: Final = 0.1

_TIMESTAMPS = ARRAY(DateTime(timezone=True))


def rate_margin(per: Any) -> ColumnElement[Any]:
    """The margin of a rate limit of ``per`` seconds, in seconds: how long after its claim a
    rate-limited job's handler may start (a worker gives back a job it cannot start by then)."""
    margin: ColumnElement[Any] = func.least(per * RATE_MARGIN_SHARE, RATE_MARGIN_SECONDS)
    return margin


def start_within(limit: Any, per: Any, starts: Any) -> ColumnElement[Any]:
    """For a row a claim just stamped (``starts`` newest first): the seconds from the claim
    statement's start until which its handlers may start, the stamp's delay (waiting for the
    row's lock, say) plus the margin; null without a rate. A duration on the server's clock, so
    a worker on another host can add it to its own reading taken before it sent the claim."""
    stamped_after = func.extract("epoch", starts[1] - func.statement_timestamp())
    return case((limit.is_not(None), stamped_after + rate_margin(per)), else_=null())


def rate_window(per: Any) -> ColumnElement[Any]:
    """The interval a rate limit of ``per`` seconds is checked over: ``per`` plus the margin."""
    return seconds(per + rate_margin(per))


def _starts(starts: Any) -> Any:
    return (
        func.unnest(starts)
        .table_valued(column("at", DateTime(timezone=True)))
        .render_derived(name="starts")
    )


def starts_in_window(starts: Any, per: Any) -> ColumnElement[Any]:
    """How many of ``starts`` (an array of start times) lie in the current window."""
    at = _starts(starts)
    return (
        select(func.count())
        .select_from(at)
        .where(at.c.at > func.clock_timestamp() - rate_window(per))
        .scalar_subquery()
    )


def rate_room(limit: Any, per: Any, starts: Any) -> ColumnElement[Any]:
    """How many more may start now under a rate limit of ``limit`` per ``per`` seconds."""
    room: ColumnElement[Any] = limit - starts_in_window(starts, per)
    return room


def starts_after(limit: Any, per: Any, starts: Any, started: Any) -> ColumnElement[Any]:
    """``starts`` with ``started`` new starts stamped now, cut to the ``limit`` newest ones in
    the window (older ones can no longer matter)."""
    stamped = func.array_cat(
        starts,
        func.array_fill(
            func.clock_timestamp(), pg_array([cast(started, Integer)]), type_=_TIMESTAMPS
        ),
    )
    at = _starts(stamped)
    return func.array(
        select(at.c.at)
        .where(at.c.at > func.clock_timestamp() - rate_window(per))
        .order_by(at.c.at.desc())
        .limit(limit)
        .scalar_subquery()
    )


def _override(key: Any, value: Any, present: ColumnElement[bool]) -> ColumnElement[Any]:
    """``value`` of the longest ``pgqueue_key_limits`` prefix of ``key`` where ``present``.

    Behind a test of whether any such override exists at all, which runs once per statement:
    with no override (the usual case) no key pays for the per-key lookup."""
    longest = (
        select(value)
        .where(present, func.starts_with(key, KeyLimit.prefix))
        .order_by(func.length(KeyLimit.prefix).desc())
        .limit(1)
        .correlate_except(KeyLimit)  # to the key's row, however deep it is nested
        .scalar_subquery()
    )
    any_override = select(literal(1)).select_from(KeyLimit).where(present).exists()
    return case((any_override, longest), else_=null())


def key_limit_of(key: Any, task_limit: Any) -> ColumnElement[Any]:
    """A key's limit: the longest matching override, else the task's (null: no limit)."""
    override = _override(key, KeyLimit.key_limit, KeyLimit.key_limit.is_not(None))
    return func.coalesce(override, task_limit)


def key_rate_of(key: Any) -> tuple[ColumnElement[Any], ColumnElement[Any]]:
    """``(limit, per)`` of the longest matching rate override of ``key`` (nulls: none)."""
    present = KeyLimit.rate_limit.is_not(None)
    return _override(key, KeyLimit.rate_limit, present), _override(key, KeyLimit.rate_per, present)


def key_rows(keys: Any) -> tuple[Any, Any]:
    """CTEs for an enqueue of keyed jobs: ``keys`` (a subquery of ``concurrency_key`` and
    ``key_limit`` per new job) get their key rows, and the transaction holds a ``FOR KEY SHARE``
    lock on each until it ends, so maintenance (``sql.maintenance.lock_idle_keys``) cannot
    delete a row that an uncommitted job needs. That lock conflicts with no claim (``FOR NO KEY
    UPDATE``) and no counter update, so a long host transaction holds up neither. An existing
    key whose task now declares another limit gets it."""
    wanted = (
        select(keys.c.concurrency_key.label("key"), func.max(keys.c.key_limit).label("key_limit"))
        .where(keys.c.concurrency_key.is_not(None))
        .group_by(keys.c.concurrency_key)
        .cte("wanted_keys")
    )
    # Existing rows are locked first (waiting for a deletion in progress to end): the insert
    # below reads this CTE for each key before it tries that key, so a row found deleted is
    # inserted anew, and a row found alive is already held.
    held = (
        select(ConcurrencyKey.key)
        .where(ConcurrencyKey.key == func.any(func.array(select(wanted.c.key).scalar_subquery())))
        .with_for_update(read=True, key_share=True)
        .cte("held_keys")
    )
    missing = select(wanted.c.key, wanted.c.key_limit).where(
        ~select(literal(1)).where(held.c.key == wanted.c.key).exists()
    )
    stmt = pg_insert(ConcurrencyKey).from_select(["key", "key_limit"], missing)
    # A row another enqueue inserted after this statement's snapshot conflicts: ``DO UPDATE``
    # with a false condition changes nothing but locks that row too (DO NOTHING would leave it
    # unlocked, and deletable before this transaction commits). Only that race pays the
    # stronger lock.
    added = stmt.on_conflict_do_update(
        index_elements=[ConcurrencyKey.key],
        set_={"running": ConcurrencyKey.running},
        where=false(),
    ).cte("added_keys")
    changed = (
        update(ConcurrencyKey)
        .where(
            ConcurrencyKey.key == wanted.c.key,
            wanted.c.key_limit.is_not(None),
            ConcurrencyKey.key_limit.is_distinct_from(wanted.c.key_limit),
        )
        .values(key_limit=wanted.c.key_limit)
        .cte("changed_keys")
    )
    return added, changed


@cache
def controls_exist() -> Select[bool, bool, bool]:
    """``(queue limits, flow controls, rate limits)``: whether any queue has a concurrency
    limit; whether any concurrency key, key override or rate limit exists (the claim's flow
    variant); whether any rate limit exists (the claimer then asks ``rate_wait``)."""

    def any_row(*where: ColumnElement[bool], table: Any) -> ColumnElement[bool]:
        return select(literal(1)).select_from(table).where(*where).exists()

    queue_rates = any_row(QueueControl.rate_limit.is_not(None), table=QueueControl)
    key_rates = any_row(KeyLimit.rate_limit.is_not(None), table=KeyLimit)
    return select(
        any_row(QueueControl.concurrency_limit.is_not(None), table=QueueControl),
        or_(
            any_row(table=ConcurrencyKey),
            any_row(table=KeyLimit),
            queue_rates,
        ),
        or_(queue_rates, key_rates),
    )


def ticket_key_hashes(atomic: bool | None = None) -> Any:
    """Recursive CTE: each distinct ``key_hash`` among the tickets (of this mode, unless
    ``atomic`` is None), as ``h``, in hash order, one index probe each (a loose scan of the
    partial index on keyed tickets): the keys with waiting work, however many keys were ever
    used. Joined to key rows through the index on their hash."""
    mode: list[ColumnElement[bool]] = []
    if atomic is not None:
        mode.append(MessageQueue.atomic == (true() if atomic else false()))
    start = (
        select(func.min(MessageQueue.key_hash).label("h"))
        .where(MessageQueue.key_hash.is_not(None), *mode)
        .cte("ticket_hashes", recursive=True)
    )
    after = (
        select(func.min(MessageQueue.key_hash))
        .where(MessageQueue.key_hash > start.c.h, *mode)
        .scalar_subquery()
    )
    return start.union_all(select(after).where(start.c.h.is_not(None)))


def _room_at(limit: Any, per: Any, starts: Any) -> ColumnElement[Any]:
    """When the window of a rate-limited row has (or had) room for one more start: its
    ``limit``-th newest start leaves the window then; null while it holds fewer starts."""
    at = _starts(starts)
    nth_newest = (
        select(at.c.at).order_by(at.c.at.desc()).offset(limit - 1).limit(1).scalar_subquery()
    )
    return nth_newest + rate_window(per)


def _wait_of(limit: Any, per: Any, starts: Any) -> ColumnElement[Any]:
    """Seconds until the window of a rate-limited row has room again; null while it has."""
    room_at = _room_at(limit, per, starts)
    now = func.clock_timestamp()
    return case((room_at > now, func.extract("epoch", room_at - now)), else_=null())


@cache
def rate_wait() -> Select[float | None]:
    """Seconds until a rate window that was full when the claim looked (``looked_ago``
    seconds ago) has room again, 0 when it has room already; null when none was full (of
    keys, only those with tickets count). The claimer waits this long instead of a poll
    interval when its claim came back short. A window that freed between the claim and this
    statement gives 0, not null: the claim may have come back short because of it."""
    queue_room = select(
        _room_at(QueueControl.rate_limit, QueueControl.rate_per, QueueControl.recent_starts).label(
            "room_at"
        )
    ).where(QueueControl.rate_limit.is_not(None), QueueControl.paused.is_(False))
    limit, per = key_rate_of(ConcurrencyKey.key)
    # Only keys with waiting tickets can hold up a claim: start from those, never from every
    # key row.
    hashes = ticket_key_hashes()
    key_room = (
        select(_room_at(limit, per, ConcurrencyKey.recent_starts).label("room_at"))
        .select_from(hashes)
        .join(ConcurrencyKey, key_hash(ConcurrencyKey.key) == hashes.c.h)
        .where(ConcurrencyKey.recent_starts.is_not(None), limit.is_not(None))
    )
    rooms = queue_room.union_all(key_room).subquery("rooms")
    now = func.clock_timestamp()
    wait = func.greatest(func.extract("epoch", rooms.c.room_at - now), 0.0)
    looked_at = now - seconds(bindparam("looked_ago", type_=Float))
    return select(func.min(wait)).where(rooms.c.room_at > looked_at)


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


@cache
def key_facts() -> Select[*tuple[Any, ...]]:
    """One key's row for ``explain``: ``(running, limit, rate_limit, rate_per, starts in the
    window, seconds until the window has room or null)``. Binds ``key``."""
    key = bindparam("key", type_=Text)
    limit, per = key_rate_of(ConcurrencyKey.key)
    return select(
        ConcurrencyKey.running,
        key_limit_of(ConcurrencyKey.key, ConcurrencyKey.key_limit),
        limit,
        per,
        starts_in_window(ConcurrencyKey.recent_starts, per),
        _wait_of(limit, per, ConcurrencyKey.recent_starts),
    ).where(ConcurrencyKey.key == key)


@cache
def queue_rate_facts() -> Select[*tuple[Any, ...]]:
    """A queue's rate limit for ``explain``: ``(rate_limit, rate_per, starts in the window,
    seconds until the window has room or null)``. Binds ``queue``."""
    row = (QueueControl.rate_limit, QueueControl.rate_per, QueueControl.recent_starts)
    return select(
        QueueControl.rate_limit,
        QueueControl.rate_per,
        starts_in_window(QueueControl.recent_starts, QueueControl.rate_per),
        _wait_of(*row),
    ).where(
        QueueControl.name == bindparam("queue", type_=Text), QueueControl.rate_limit.is_not(None)
    )


@cache
def running_with_key() -> Select[int]:
    """Ids of the RUNNING jobs with ``key``, lowest first, at most ``cap``: what fills a key's
    limit. Reads the partial index on running jobs."""
    return (
        select(Job.id)
        .where(
            Job.state == JobState.RUNNING.value,
            Job.concurrency_key == bindparam("key", type_=Text),
        )
        .order_by(Job.id)
        .limit(bindparam("cap", type_=Integer))
    )


__all__ = [
    "RATE_MARGIN_SECONDS",
    "RATE_MARGIN_SHARE",
    "controls_exist",
    "delete_empty_override",
    "key_facts",
    "key_limit_of",
    "key_overrides",
    "key_rate_of",
    "key_rows",
    "lock_counted_keys",
    "queue_rate_facts",
    "rate_margin",
    "rate_room",
    "rate_wait",
    "rate_window",
    "recount_keys",
    "running_with_key",
    "set_key_override",
    "set_queue_rate",
    "start_within",
    "starts_after",
    "starts_in_window",
    "ticket_key_hashes",
]
