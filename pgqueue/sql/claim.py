"""The claim: one statement that locks ready tickets (``FOR UPDATE SKIP LOCKED``), deletes them
and moves their jobs to RUNNING, in one of the named ``ClaimVariant`` forms (or, for chosen
jobs, ``claim_listed``); plus the reads that go with it (jobs a lost claim answer left to a
worker, whether any queue has a limit, whether any ticket is claimable now).
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
    null,
    or_,
    select,
    true,
    update,
)
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.sql.dml import ReturningUpdate

from pgqueue.models import Job, MessageQueue, QueueControl
from pgqueue.sql.common import (
    CLAIMED_COLUMNS,
    among,
    array_param,
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

    in_transaction: bool
    """Atomic mode: claimed inside the handler's open transaction, with no lease expiry (if
    that transaction dies, the claim itself rolls back). Otherwise leased, committed at once."""
    some_queues: bool
    """Only the queues named by the ``queues`` bind; otherwise every queue."""
    queue_limits: bool
    """Some queue may have a concurrency limit: limited queues are claimed from first, each
    within its room. Otherwise the lean form, which leaves limited queues alone."""
    task_leases: bool
    """Some task has its own lease length: each job's lease is looked up in the
    ``task_leases`` bind. Otherwise every job gets ``lease_seconds``."""

    @property
    def name(self) -> str:
        """A short label, e.g. ``leased/all-queues/lean/default-lease``."""
        return "/".join(
            (
                "atomic" if self.in_transaction else "leased",
                "some-queues" if self.some_queues else "all-queues",
                "limits" if self.queue_limits else "lean",
                "task-leases" if self.task_leases else "default-lease",
            )
        )


@cache
def claim(variant: ClaimVariant) -> ReturningUpdate[Any]:
    """Claim up to ``limit`` ready tickets: lock them (SKIP LOCKED), delete them, and move their
    jobs to RUNNING with a fresh lease, in one statement.

    Binds: ``limit``, ``worker`` (lease owner id), ``lease_seconds`` (default lease), and with
    ``variant.task_leases`` ``task_leases`` (JSON object task name -> lease seconds, for tasks
    with their own lease; without it every job gets the default, with no per-row JSON lookup),
    and ``queues`` (array) with ``variant.some_queues``. Atomic claims (one per open
    transaction) set no lease expiry: if the transaction dies the claim itself rolls back.

    Queues with a row in ``pgqueue_queues`` that is paused or limited are left out of the main
    index scan (a hashed anti-join on a usually empty set). Each limited queue that is not
    paused is claimed from separately, and first: its control row is locked (SKIP LOCKED: a
    queue another worker is claiming right now is skipped, not waited for) and at most
    ``limit - running`` of its tickets are taken; the row's ``running`` counter grows by what
    was claimed, in this same statement. Priority therefore orders tickets within the limited
    queues and within the rest, not across the two.

    Without ``variant.queue_limits`` it is the lean form for when no queue has a limit (the
    common case): the main scan alone, still skipping paused and limited queues, so it can
    never break a limit that was set after the caller last looked, it only leaves that queue to
    the full form.
    """
    atomic = variant.in_transaction
    filter_queues = variant.some_queues
    limits = variant.queue_limits
    task_leases = variant.task_leases
    ready = and_(
        MessageQueue.atomic == (true() if atomic else false()),
        MessageQueue.run_at <= func.now(),
    )
    queue_filter: ColumnElement[bool] = true()
    if filter_queues:
        queue_filter = MessageQueue.queue == func.any(array_param("queues", Text))
    order = (MessageQueue.priority, MessageQueue.run_at, MessageQueue.job_id)
    controlled = select(QueueControl.name).where(
        or_(QueueControl.paused, QueueControl.concurrency_limit.is_not(None))
    )
    free = (
        select(MessageQueue.job_id, MessageQueue.priority, MessageQueue.run_at)
        .where(ready, queue_filter, MessageQueue.queue.not_in(controlled))
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
    claimed_values = _claimed_values(atomic, lease)
    if not limits:
        lean_picked = free.cte("picked")
        lean_deleted = (
            delete(MessageQueue)
            .where(among(MessageQueue.job_id, lean_picked.c.job_id))
            .returning(MessageQueue.job_id)
            .cte("claimed")
        )
        return _move_to_running(lean_deleted, claimed_values)
    limited_where: list[ColumnElement[bool]] = [
        QueueControl.concurrency_limit.is_not(None),
        QueueControl.paused.is_(False),
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
    per_queue = (
        select(MessageQueue.job_id, MessageQueue.priority, MessageQueue.run_at)
        .where(ready, MessageQueue.queue == limited.c.name)
        .order_by(*order)
        .limit(func.least(func.greatest(limited.c.room, 0), bindparam("limit", type_=Integer)))
        .with_for_update(skip_locked=True)
        .lateral("per_queue")
    )
    capped = select(per_queue.c.job_id, per_queue.c.priority, per_queue.c.run_at).select_from(
        limited.join(per_queue, true())
    )
    # FOR UPDATE is not allowed in a UNION's branches; as CTEs each keeps its own locking scan.
    # Limited queues come first (each bounded by its room), the free scan fills the remaining
    # slots. No ORDER BY over the union: each branch already comes in index order, and a sort
    # here would sit on the hot path of every claim.
    free_cte = free.cte("free")
    capped_cte = capped.cte("capped")
    both = select(capped_cte.c.job_id).union_all(select(free_cte.c.job_id)).subquery("candidates")
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
        .where(deleted.c.queue == limited.c.name, moved)
        .scalar_subquery()
    )
    taken = select(limited.c.name.label("queue"), per_limited.label("n")).subquery("taken")
    bump = (
        update(QueueControl)
        .where(QueueControl.name == taken.c.queue, taken.c.n > 0)
        .values(running=QueueControl.running + taken.c.n)
        .cte("bump")
    )
    return _move_to_running(deleted, claimed_values).add_cte(bump)


@cache
def claim_listed(in_transaction: bool) -> ReturningUpdate[Any]:
    """Claim the tickets of the jobs in ``job_ids`` (array), whatever their ``run_at``, and move
    those jobs to RUNNING like ``claim`` does (``in_transaction``: the atomic form, no lease
    expiry). Binds ``job_ids``, ``worker``, ``lease_seconds``.

    For running chosen jobs at once (``pgqueue.testing.immediate``), not for workers: tickets of
    the other mode and of paused or limited queues are left alone, as the lean claim leaves them.
    """
    controlled = select(QueueControl.name).where(
        or_(QueueControl.paused, QueueControl.concurrency_limit.is_not(None))
    )
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
        .returning(MessageQueue.job_id)
        .cte("claimed")
    )
    lease = bindparam("lease_seconds", type_=Float)
    return _move_to_running(claimed, _claimed_values(in_transaction, lease))


def _claimed_values(atomic: bool, lease: ColumnElement[Any]) -> dict[str, Any]:
    """The values a claim writes to each job it moves to RUNNING (``lease``: its seconds)."""
    lease_expiry: ColumnElement[Any] = null() if atomic else func.now() + seconds(lease)
    return {
        "state": CLAIM.target,
        "attempts": Job.attempts + 1,
        "started_at": func.now(),
        "updated_at": func.now(),
        "lease_owner": bindparam("worker", type_=Text),
        "lease_token": func.gen_random_uuid(),
        "lease_expires_at": lease_expiry,
    }


def _move_to_running(claimed: Any, values: dict[str, Any]) -> ReturningUpdate[Any]:
    """The claim's last step: the jobs of the ``claimed`` tickets (a CTE of deleted tickets)
    that still wait move to RUNNING with ``values``, returning ``CLAIMED_COLUMNS``."""
    return (
        update(Job)
        .where(among(Job.id, claimed.c.job_id), source_states(CLAIM))
        .values(**values)
        .returning(*CLAIMED_COLUMNS)
    )


@cache
def claimed_by() -> Select[Any]:
    """RUNNING jobs leased to ``worker``, claimed in the last ``within`` seconds, other than
    ``held`` (array of ids): what a claim whose answer never arrived (the connection broke after
    its commit) left to that worker. Binds ``worker``, ``held``, ``within``. Reads the partial
    index on running jobs."""
    return select(*CLAIMED_COLUMNS).where(
        Job.state == JobState.RUNNING,
        Job.lease_owner == bindparam("worker", type_=Text),
        Job.started_at >= func.now() - seconds(bindparam("within", type_=Float)),
        Job.id != func.all(array_param("held", BigInteger)),
    )


@cache
def any_queue_limit() -> Select[bool]:
    """Whether any queue has a concurrency limit (chooses the claim variant)."""
    return select(select(literal(1)).where(QueueControl.concurrency_limit.is_not(None)).exists())


@cache
def ready_ticket_exists(filter_queues: bool) -> Select[bool]:
    """Whether any ticket is claimable now (for ``drain``). Binds ``queues`` when filtering.

    Tickets of paused queues are not claimable, so they do not count."""
    paused = select(QueueControl.name).where(QueueControl.paused)
    inner = select(literal(1)).where(
        MessageQueue.run_at <= func.now(), MessageQueue.queue.not_in(paused)
    )
    if filter_queues:
        inner = inner.where(MessageQueue.queue == func.any(array_param("queues", Text)))
    return select(inner.exists())
