"""Statements and fragments of flow control: per-key concurrency limits and rate limits.

The claim (``sql.claim``) enforces both on rows it locks: a key's ``pgqueue_concurrency_keys``
row (its RUNNING counter and latest starts) and a queue's ``pgqueue_queues`` row (its rate and
latest starts). This module holds the pieces the claim and the enqueue share (the sliding
window, the longest-prefix override, the key rows an enqueue writes), the flow variant's parts
of the claim statement (the keys with room and their tickets, the rate-limited queues, the
counters and windows the claim bumps) and ``explain``'s reads of a key or a queue rate. The
operators' writes and the recount of key counters are ``sql.flow_settings``'s.

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
    Integer,
    Select,
    Text,
    bindparam,
    case,
    cast,
    column,
    false,
    func,
    literal,
    null,
    select,
    true,
    union_all,
    update,
)
from sqlalchemy.dialects.postgresql import ARRAY
from sqlalchemy.dialects.postgresql import array as pg_array
from sqlalchemy.dialects.postgresql import insert as pg_insert

from pgqueue.models import ConcurrencyKey, Job, KeyLimit, MessageQueue, QueueControl
from pgqueue.sql.common import among, array_param, key_hash, seconds, source_states
from pgqueue.states import CLAIM, JobState

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


def new_job_keys() -> Any:
    """The bound ``concurrency_keys`` and ``key_limits`` (arrays, one entry per new job) as rows
    ``k(concurrency_key, key_limit, ord)``, joined to the jobs' rows by ``ord`` and given to
    ``key_rows``."""
    return (
        func.unnest(array_param("concurrency_keys", Text), array_param("key_limits", Integer))
        .table_valued("concurrency_key", "key_limit", with_ordinality="ord")
        .render_derived(name="k")
    )


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


def room_at(limit: Any, per: Any, starts: Any) -> ColumnElement[Any]:
    """When the window of a rate-limited row has (or had) room for one more start: its
    ``limit``-th newest start leaves the window then; null while it holds fewer starts."""
    at = _starts(starts)
    nth_newest = (
        select(at.c.at).order_by(at.c.at.desc()).offset(limit - 1).limit(1).scalar_subquery()
    )
    return nth_newest + rate_window(per)


def _wait_of(limit: Any, per: Any, starts: Any) -> ColumnElement[Any]:
    """Seconds until the window of a rate-limited row has room again; null while it has."""
    at = room_at(limit, per, starts)
    now = func.clock_timestamp()
    return case((at > now, func.extract("epoch", at - now)), else_=null())


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


# --- the claim's flow-controlled parts (``sql.claim.claim``'s flow variant) ---


def rated_and_limited(limited: Any, filter_queues: bool) -> Any:
    """CTE of the controlled queues a flow claim takes from: the limited ones of ``limited``
    plus the rate-limited ones (not paused), locked in name order, each with its room: the
    smaller of its limit's and its window's. The claim waits for a rate-limited row: every
    claim that locks one commits at once, so it is held for one statement."""
    rated_where: list[ColumnElement[bool]] = [
        QueueControl.rate_limit.is_not(None),
        QueueControl.paused.is_(False),
    ]
    if filter_queues:
        rated_where.append(QueueControl.name == func.any(array_param("queues", Text)))
    window_room = rate_room(
        QueueControl.rate_limit, QueueControl.rate_per, QueueControl.recent_starts
    )
    limit_room = func.coalesce(
        QueueControl.concurrency_limit - QueueControl.running, QueueControl.rate_limit
    )
    rated = (
        select(QueueControl.name, func.least(limit_room, window_room).label("room"))
        .where(*rated_where)
        .order_by(QueueControl.name)
        .with_for_update()
        .cte("rated")
    )
    return union_all(
        select(limited.c.name, limited.c.room), select(rated.c.name, rated.c.room)
    ).cte("controls")


def bump_queues(taken: Any) -> Any:
    """CTE: the controlled queues' rows after a flow claim: ``running`` grows where a limit is
    kept, the window gets the starts where a rate is."""
    return (
        update(QueueControl)
        .where(QueueControl.name == taken.c.queue, taken.c.n > 0)
        .values(
            running=case(
                (QueueControl.concurrency_limit.is_not(None), QueueControl.running + taken.c.n),
                else_=QueueControl.running,
            ),
            recent_starts=case(
                (
                    QueueControl.rate_limit.is_not(None),
                    starts_after(
                        QueueControl.rate_limit,
                        QueueControl.rate_per,
                        QueueControl.recent_starts,
                        taken.c.n,
                    ),
                ),
                else_=QueueControl.recent_starts,
            ),
        )
        .returning(
            QueueControl.name,
            start_within(
                QueueControl.rate_limit, QueueControl.rate_per, QueueControl.recent_starts
            ).label("start_within"),
        )
        .cte("bump")
    )


def keys_with_room(
    ready: ColumnElement[bool],
    queue_filter: ColumnElement[bool],
    controlled: Select[Any],
    atomic: bool,
) -> Any:
    """CTE: up to ``limit`` keys with a ready ticket and room, locked (SKIP LOCKED), fairest
    first; ``(key, room)``. Starts from the hashes of waiting tickets and reaches their key
    rows through the hash index, so idle keys' rows are never read."""
    hashes = ticket_key_hashes(atomic)
    order = (MessageQueue.priority, MessageQueue.run_at, MessageQueue.job_id)
    first = (
        select(*order)
        .where(
            MessageQueue.key_hash == hashes.c.h,
            ready,
            queue_filter,
            MessageQueue.queue.not_in(controlled),
        )
        .order_by(*order)
        .limit(1)
        .lateral("first_ticket")
    )
    any_room = bindparam("limit", type_=Integer)
    key_limit = key_limit_of(ConcurrencyKey.key, ConcurrencyKey.key_limit)
    rate_limit, rate_per = key_rate_of(ConcurrencyKey.key)
    limit_room = func.coalesce(key_limit - ConcurrencyKey.running, any_room)
    window_room = case(
        (
            rate_limit.is_not(None),
            rate_room(rate_limit, rate_per, ConcurrencyKey.recent_starts),
        ),
        else_=any_room,
    )
    # One level, no subquery between the lock and the room: after waiting for a key row that
    # changed, PostgreSQL re-evaluates the row's expressions on its newest version, so the room
    # is always computed from the counter this claim then holds locked.
    room = func.least(limit_room, window_room)
    # Two keys can share a hash: each key row of the hash is a candidate with the hash's first
    # ticket, and the per-key scan then takes only tickets whose job has that very key.
    return (
        select(ConcurrencyKey.key, room.label("room"))
        .select_from(hashes)
        .join(first, true())
        .join(ConcurrencyKey, key_hash(ConcurrencyKey.key) == hashes.c.h)
        .where(room > 0)
        .order_by(first.c.priority, ConcurrencyKey.running, first.c.run_at, first.c.job_id)
        .limit(any_room)
        # NO KEY UPDATE: it does not conflict with the KEY SHARE lock an enqueue holds on the
        # row until its (host's) transaction ends, which keeps maintenance from deleting it.
        .with_for_update(of=ConcurrencyKey, skip_locked=True, key_share=True)
        .cte("keys_with_room")
    )


def keyed_tickets(
    keys: Any,
    ready: ColumnElement[bool],
    queue_filter: ColumnElement[bool],
    controlled: Select[Any],
) -> Select[Any]:
    """The union branch of keyed tickets: per locked key, at most its room of them in claim
    order (SKIP LOCKED), through the partial index on keyed tickets."""
    order = (MessageQueue.priority, MessageQueue.run_at, MessageQueue.job_id)
    per_key = (
        select(MessageQueue.job_id)
        .where(
            MessageQueue.key_hash == key_hash(keys.c.key),
            # Two keys can share a hash: only the tickets whose job has this very key.
            select(literal(1))
            .where(Job.id == MessageQueue.job_id, Job.concurrency_key == keys.c.key)
            .correlate_except(Job)
            .exists(),
            ready,
            queue_filter,
            MessageQueue.queue.not_in(controlled),
        )
        .order_by(*order)
        .limit(func.least(keys.c.room, bindparam("limit", type_=Integer)))
        .with_for_update(skip_locked=True)
        .lateral("per_key")
    )
    keyed = select(per_key.c.job_id).select_from(keys.join(per_key, true())).cte("keyed")
    return select(keyed.c.job_id)


def bump_keys(keys: Any, deleted: Any) -> Any:
    """CTE: each claimed key's ``running`` grows by what this claim moved to RUNNING, and its
    window gets the starts when a rate applies to it."""
    # From the claimed tickets to their jobs by primary key (never from a key to all of its
    # jobs, a backlog that can be long), then to the key rows this claim locked, by key: keyed
    # tickets are claimed only through those keys.
    claimed_keys = (
        select(Job.concurrency_key.label("key"), func.count().label("n"))
        .where(
            among(Job.id, deleted.c.job_id),
            source_states(CLAIM),
            Job.concurrency_key.is_not(None),
        )
        .group_by(Job.concurrency_key)
        .cte("claimed_keys")
    )
    taken = (
        select(claimed_keys.c.n)
        .where(claimed_keys.c.key == ConcurrencyKey.key)
        .correlate(ConcurrencyKey)
        .scalar_subquery()
    )
    rate_limit, rate_per = key_rate_of(ConcurrencyKey.key)
    return (
        update(ConcurrencyKey)
        .where(among(ConcurrencyKey.key, claimed_keys.c.key), among(ConcurrencyKey.key, keys.c.key))
        .values(
            running=ConcurrencyKey.running + taken,
            recent_starts=case(
                (
                    rate_limit.is_not(None),
                    starts_after(rate_limit, rate_per, ConcurrencyKey.recent_starts, taken),
                ),
                else_=ConcurrencyKey.recent_starts,
            ),
        )
        .returning(
            ConcurrencyKey.key,
            start_within(rate_limit, rate_per, ConcurrencyKey.recent_starts).label("start_within"),
        )
        .cte("bump_keys")
    )
