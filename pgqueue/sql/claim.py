"""The claim: one statement that locks ready tickets (``FOR UPDATE SKIP LOCKED``), deletes them
and moves their jobs to RUNNING, in one of the named ``ClaimVariant`` forms (or, for chosen
jobs, ``claim_listed``), within queue limits, per-key limits and rate limits (the flow
variant's parts are ``sql.flow``'s); plus the reads that go with it: which controls exist (they
choose the variant), how long until a full rate window has room, jobs a lost claim answer left
to a worker, and whether any ticket is claimable now.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from typing import Any

from sqlalchemy import (
    BigInteger,
    ColumnElement,
    Float,
    Integer,
    Select,
    Text,
    and_,
    bindparam,
    cast,
    delete,
    false,
    func,
    literal,
    or_,
    select,
    true,
    union_all,
    update,
)
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.sql.dml import ReturningUpdate

from pgqueue.models import ConcurrencyKey, Job, KeyLimit, MessageQueue, QueueControl
from pgqueue.sql import flow as flow_sql
from pgqueue.sql.common import (
    CLAIMED_COLUMNS,
    among,
    array_param,
    key_hash,
    seconds,
    source_states,
)
from pgqueue.states import (
    CLAIM,
    JobState,
)


@dataclass(frozen=True)
class ClaimVariant:
    """Which form of the claim statement to run; each variant is one cached statement.

    The forms differ only in what they leave out when it is not needed, so the common case
    (leased, every queue, no limits, default lease) is the cheapest statement.
    """

    atomic: bool
    """Atomic tickets instead of leased ones. Both commit at once; an atomic job's handler then
    runs in a transaction that first locks the job's row (``sql.atomic_runs.lock_claimed``),
    never a control row, whose counters the claims and outcomes of the queue keep writing."""
    some_queues: bool
    """Only the queues named by the ``queues`` bind; otherwise every queue."""
    queue_limits: bool
    """Some queue may have a concurrency limit: limited queues are claimed from first, each
    within its room. Otherwise the lean form, which leaves limited queues alone."""
    task_leases: bool
    """Some task has its own lease length: each job's lease is looked up in the
    ``task_leases`` bind. Otherwise every job gets ``lease_seconds``."""
    flow: bool = False
    """Some concurrency key, key override or rate limit may exist: keyed tickets are claimed
    per key within the key's room, and rate-limited queues within their window (with
    ``queue_limits``). Otherwise keyed tickets and rate-limited queues are left alone."""
    excluded: bool = False
    """The worker met jobs of tasks it does not register: tickets whose job's task is in the
    ``excluded`` bind (array) are passed over, each checked by the job's primary key. Otherwise
    the scans never read ``pgqueue_jobs``."""

    @property
    def name(self) -> str:
        """A short label, e.g. ``leased/all-queues/lean/default-lease``."""
        mode = "atomic" if self.atomic else "leased"
        return "/".join(
            (
                mode,
                "some-queues" if self.some_queues else "all-queues",
                ("flow" if self.flow else "limits") if self.queue_limits else "lean",
                "task-leases" if self.task_leases else "default-lease",
                *(("excluding",) if self.excluded else ()),
            )
        )


def _controlled_queues() -> Select[Any]:
    """Queues the main scan leaves alone: paused, concurrency-limited or rate-limited."""
    return select(QueueControl.name).where(
        or_(
            QueueControl.paused,
            QueueControl.concurrency_limit.is_not(None),
            QueueControl.rate_limit.is_not(None),
        )
    )


@cache
def claim(variant: ClaimVariant) -> ReturningUpdate[Any]:
    """Claim up to ``limit`` ready tickets: lock them (SKIP LOCKED), delete them, and move their
    jobs to RUNNING with a fresh lease, in one statement.

    Binds: ``limit``, ``worker`` (lease owner id), ``lease_seconds`` (default lease), and with
    ``variant.task_leases`` ``task_leases`` (JSON object task name -> lease seconds, for tasks
    with their own lease; without it every job gets the default, with no per-row JSON lookup),
    ``queues`` (array) with ``variant.some_queues``, and ``excluded`` (array of task names)
    with ``variant.excluded``. The atomic form takes atomic tickets the same way, counted
    against the same limits.

    The main index scan takes tickets without a concurrency key, of queues without a row in
    ``pgqueue_queues`` that is paused, limited or rate-limited (a hashed anti-join on a usually
    empty set). Each limited queue that is not paused is claimed from separately, and first:
    its control row is locked (SKIP LOCKED: a queue another worker is claiming right now is
    skipped, not waited for) and at most ``limit - running`` of its tickets are taken; the
    row's ``running`` counter grows by what was claimed, in this same statement. Priority
    therefore orders tickets within the limited queues and within the rest, not across the two.

    With ``variant.flow``, rate-limited queues are claimed from like limited ones, their room
    also bounded by the starts in their window (``sql.flow``), and their rows locked in name
    order and waited for (skipping a busy rate-limited queue would leave its window unused);
    the claim stamps its starts on the row, and returns each job's ``start_within``
    (``sql.flow.start_within`` of the tightest rate that applies to it; null when none): how
    long after the statement began the worker may start its handler. Keyed tickets are claimed per key before all
    others: the keys with ready tickets and room (``key_limit - running``, and a rate window
    with room) are locked (SKIP LOCKED), at most ``limit`` of them, those whose first ticket
    has the best priority, then the fewest running, then the oldest ticket first, so a key at
    its limit takes no slot from a waiting key; each gives at most its room of tickets, through
    the partial index on keyed tickets. Keyed tickets of paused, limited or rate-limited queues
    are not claimed.

    Without ``variant.queue_limits`` it is the lean form for when no queue has a limit (the
    common case): the main scan alone, still skipping controlled queues and keyed tickets, so
    it can never break a limit that was set after the caller last looked, it only leaves that
    work to the full form.
    """
    filter_queues = variant.some_queues
    limits = variant.queue_limits
    flow = variant.flow and limits
    task_leases = variant.task_leases
    ready = and_(
        MessageQueue.atomic == (true() if variant.atomic else false()),
        MessageQueue.run_at <= func.now(),
    )
    if variant.excluded:
        # Every scan below (free, per queue, per key) skips them, as if their tickets were not
        # ready: only this worker's claims, only once it met such a job.
        ready = and_(ready, _task_not_excluded())
    queue_filter: ColumnElement[bool] = true()
    if filter_queues:
        queue_filter = MessageQueue.queue == func.any(array_param("queues", Text))
    order = (MessageQueue.priority, MessageQueue.run_at, MessageQueue.job_id)
    controlled = _controlled_queues()
    unkeyed = MessageQueue.keyed == false()
    # The flow form leaves keyed tickets to its per-key scans inside the main scan. The other
    # forms drop the keyed tickets their main scan found afterwards (they exist only while
    # the claimer has not yet seen that keys exist): the scan itself, its plan and its cost
    # stay what they are without keys.
    free_where = [ready, queue_filter, MessageQueue.queue.not_in(controlled)]
    if flow:
        free_where.append(unkeyed)
    free = (
        select(MessageQueue.job_id, MessageQueue.priority, MessageQueue.run_at, MessageQueue.keyed)
        .where(*free_where)
        .order_by(*order)
        .limit(bindparam("limit", type_=Integer))
        .with_for_update(skip_locked=True)
    )
    lease: ColumnElement[Any] = bindparam("lease_seconds", type_=Float)
    if task_leases:
        task_lease = cast(
            func.jsonb_extract_path_text(bindparam("task_leases", type_=JSONB), Job.task_name),
            Float,
        )
        lease = func.coalesce(task_lease, lease)
    claimed_values = _claimed_values(lease)
    if not limits:
        lean_found = free.cte("picked")
        lean_picked = select(lean_found.c.job_id).where(lean_found.c.keyed == false())
        lean_deleted = (
            delete(MessageQueue)
            .where(MessageQueue.job_id == func.any(func.array(lean_picked.scalar_subquery())))
            .returning(MessageQueue.job_id)
            .cte("claimed")
        )
        return _move_to_running(lean_deleted, claimed_values)
    limited_where: list[ColumnElement[bool]] = [
        QueueControl.concurrency_limit.is_not(None),
        QueueControl.paused.is_(False),
        QueueControl.rate_limit.is_(None),
    ]
    if filter_queues:
        limited_where.append(QueueControl.name == func.any(array_param("queues", Text)))
    limited = (
        select(
            QueueControl.name,
            (QueueControl.concurrency_limit - QueueControl.running).label("room"),
        )
        .where(*limited_where)
        .with_for_update(skip_locked=True)
        .cte("limited")
    )
    controls: Any = limited
    if flow:
        controls = flow_sql.rated_and_limited(limited, filter_queues)
    per_queue = (
        select(MessageQueue.job_id, MessageQueue.priority, MessageQueue.run_at)
        .where(ready, MessageQueue.queue == controls.c.name, unkeyed)
        .order_by(*order)
        .limit(func.least(func.greatest(controls.c.room, 0), bindparam("limit", type_=Integer)))
        .with_for_update(skip_locked=True)
        .lateral("per_queue")
    )
    capped = select(per_queue.c.job_id, per_queue.c.priority, per_queue.c.run_at).select_from(
        controls.join(per_queue, true())
    )
    # FOR UPDATE is not allowed in a UNION's branches; as CTEs each keeps its own locking scan.
    # Keyed tickets first (each key bounded by its room), then limited queues (each bounded by
    # its room), the free scan fills the remaining slots. No ORDER BY over the union: each
    # branch already comes in index order, and a sort here would sit on the hot path of every
    # claim.
    free_cte = free.cte("free")
    capped_cte = capped.cte("capped")
    branches = [
        select(capped_cte.c.job_id),
        select(free_cte.c.job_id).where(free_cte.c.keyed == false()),
    ]
    keys = None
    if flow:
        keys = flow_sql.keys_with_room(ready, queue_filter, controlled, variant.atomic)
        branches.insert(0, flow_sql.keyed_tickets(keys, ready, queue_filter, controlled))
    both = union_all(*branches).subquery("candidates")
    picked_cte = select(both.c.job_id).limit(bindparam("limit", type_=Integer)).cte("picked")
    deleted = (
        delete(MessageQueue)
        .where(among(MessageQueue.job_id, picked_cte.c.job_id))
        .returning(MessageQueue.job_id, MessageQueue.queue)
        .cte("claimed")
    )
    # Count only tickets whose job this statement moves to RUNNING: a ticket whose job is gone
    # (tickets have no foreign key) or not waiting is deleted but runs nothing.
    moved = select(literal(1)).where(Job.id == deleted.c.job_id, source_states(CLAIM)).exists()
    # Per limited queue, not GROUP BY: grouping the claimed rows made the planner sort them.
    per_limited = (
        select(func.count())
        .select_from(deleted)
        .where(deleted.c.queue == controls.c.name, moved)
        .scalar_subquery()
    )
    taken = select(controls.c.name.label("queue"), per_limited.label("n")).subquery("taken")
    if flow:
        bump = flow_sql.bump_queues(taken)
    else:
        bump = (
            update(QueueControl)
            .where(QueueControl.name == taken.c.queue, taken.c.n > 0)
            .values(running=QueueControl.running + taken.c.n)
            .cte("bump")
        )
    if keys is None:
        return _move_to_running(deleted, claimed_values).add_cte(bump)
    bump_keys = flow_sql.bump_keys(keys, deleted)
    # Each rate-limited job's time to start (the tightest of its queue's and its key's).
    start_within = func.least(
        select(bump.c.start_within).where(bump.c.name == Job.queue).scalar_subquery(),
        select(bump_keys.c.start_within)
        .where(bump_keys.c.key == Job.concurrency_key)
        .scalar_subquery(),
    ).label("start_within")
    return _move_to_running(deleted, claimed_values, start_within).add_cte(bump, bump_keys)


def _task_not_excluded() -> ColumnElement[bool]:
    """The ticket's job is not of a task in the ``excluded`` bind (by the job's primary key)."""
    excluded = (
        select(literal(1))
        .where(
            Job.id == MessageQueue.job_id,
            Job.task_name == func.any(array_param("excluded", Text)),
        )
        .correlate_except(Job)
        .exists()
    )
    return ~excluded


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


@cache
def rate_wait() -> Select[float | None]:
    """Seconds until a rate window that was full when the claim looked (``looked_ago``
    seconds ago) has room again, 0 when it has room already; null when none was full (of
    keys, only those with tickets count). The claimer waits this long instead of a poll
    interval when its claim came back short. A window that freed between the claim and this
    statement gives 0, not null: the claim may have come back short because of it."""
    queue_room = select(
        flow_sql.room_at(
            QueueControl.rate_limit, QueueControl.rate_per, QueueControl.recent_starts
        ).label("room_at")
    ).where(QueueControl.rate_limit.is_not(None), QueueControl.paused.is_(False))
    limit, per = flow_sql.key_rate_of(ConcurrencyKey.key)
    # Only keys with waiting tickets can hold up a claim: start from those, never from every
    # key row.
    hashes = flow_sql.ticket_key_hashes()
    key_room = (
        select(flow_sql.room_at(limit, per, ConcurrencyKey.recent_starts).label("room_at"))
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
def claim_listed(in_transaction: bool) -> ReturningUpdate[Any]:
    """Claim the tickets of the jobs in ``job_ids`` (array), whatever their ``run_at``, and move
    those jobs to RUNNING like ``claim`` does (``in_transaction``: the atomic form). Binds ``job_ids``, ``worker``, ``lease_seconds``.

    For running chosen jobs at once (``pgqueue.testing.immediate``), not for workers: tickets of
    the other mode and of paused or limited queues are left alone, as the lean claim leaves them.
    A keyed job runs whatever its key's room (it was chosen to run now), and counts on its key
    like any claimed job, so the key's counter stays exact for the workers.
    """
    controlled = _controlled_queues()
    picked = (
        select(MessageQueue.job_id)
        .where(
            MessageQueue.job_id == func.any(array_param("job_ids", BigInteger)),
            MessageQueue.atomic == (true() if in_transaction else false()),
            MessageQueue.queue.not_in(controlled),
        )
        .order_by(MessageQueue.job_id)
        .with_for_update(skip_locked=True)
        .cte("picked")
    )
    claimed = (
        delete(MessageQueue)
        .where(among(MessageQueue.job_id, picked.c.job_id))
        .returning(MessageQueue.job_id, MessageQueue.keyed)
        .cte("claimed")
    )
    per_key = (
        select(Job.concurrency_key.label("key"), func.count().label("n"))
        .where(
            Job.id == claimed.c.job_id,
            claimed.c.keyed,
            source_states(CLAIM),
            Job.concurrency_key.is_not(None),
        )
        .group_by(Job.concurrency_key)
        .subquery("listed_keys")
    )
    counted = (
        update(ConcurrencyKey)
        .where(ConcurrencyKey.key == per_key.c.key)
        .values(running=ConcurrencyKey.running + per_key.c.n)
        .cte("counted_keys")
    )
    lease = bindparam("lease_seconds", type_=Float)
    return _move_to_running(claimed, _claimed_values(lease)).add_cte(counted)


def _claimed_values(lease: ColumnElement[Any]) -> dict[str, Any]:
    """The values a claim writes to each job it moves to RUNNING (``lease``: its seconds).

    An atomic job's lease is not extended while its handler runs: the handler's transaction
    holds the job's row, which the rescue skips. Once that transaction ends without an outcome
    (its worker died), the lease runs out and the job is rescued like a leased one."""
    lease_expiry: ColumnElement[Any] = func.now() + seconds(lease)
    return {
        "state": CLAIM.target,
        "attempts": Job.attempts + 1,
        "started_at": func.now(),
        "updated_at": func.now(),
        "lease_owner": bindparam("worker", type_=Text),
        "lease_token": func.gen_random_uuid(),
        "lease_expires_at": lease_expiry,
    }


def _move_to_running(
    claimed: Any, values: dict[str, Any], *extra: ColumnElement[Any]
) -> ReturningUpdate[Any]:
    """The claim's last step: the jobs of the ``claimed`` tickets (a CTE of deleted tickets)
    that still wait move to RUNNING with ``values``, returning ``CLAIMED_COLUMNS`` and
    ``extra`` (the flow form's ``start_within``)."""
    return (
        update(Job)
        .where(among(Job.id, claimed.c.job_id), source_states(CLAIM))
        .values(**values)
        .returning(*CLAIMED_COLUMNS, *extra)
    )


@cache
def claimed_by() -> Select[Any]:
    """RUNNING jobs leased to ``worker``, claimed in the last ``within`` seconds, other than
    ``held`` (array of ids): what a claim whose answer never arrived (the connection broke after
    its commit) left to that worker. Binds ``worker``, ``held``, ``within``. Reads the partial
    index on running jobs. Atomic jobs are left out: one whose claim's answer was lost is not the
    leased claimer's to run; it is rescued when its lease expires."""
    return select(*CLAIMED_COLUMNS).where(
        Job.state == JobState.RUNNING,
        Job.atomic.is_(False),
        Job.lease_owner == bindparam("worker", type_=Text),
        Job.started_at >= func.now() - seconds(bindparam("within", type_=Float)),
        Job.id != func.all(array_param("held", BigInteger)),
    )


@cache
def any_queue_limit() -> Select[bool]:
    """Whether any queue has a concurrency limit (chooses the claim variant)."""
    return select(select(literal(1)).where(QueueControl.concurrency_limit.is_not(None)).exists())


@cache
def ready_ticket_exists(filter_queues: bool, excluding: bool = False) -> Select[bool]:
    """Whether any ticket is claimable now (for ``drain``). Binds ``queues`` when filtering,
    ``excluded`` (task names the claimer passes over) with ``excluding``.

    Tickets of paused queues are not claimable, so they do not count."""
    paused = select(QueueControl.name).where(QueueControl.paused)
    inner = select(literal(1)).where(
        MessageQueue.run_at <= func.now(), MessageQueue.queue.not_in(paused)
    )
    if filter_queues:
        inner = inner.where(MessageQueue.queue == func.any(array_param("queues", Text)))
    if excluding:
        inner = inner.where(_task_not_excluded())
    return select(inner.exists())
