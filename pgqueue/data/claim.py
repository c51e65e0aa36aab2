"""The claim: taking ready tickets and moving their jobs to RUNNING (``sql.claim``), over
``db.Executor``; never commits. Rows become ``ClaimedJob`` objects here, each decoded on its own.

Which variant of the statement runs is chosen here too (``claim_variant``). The lean variant
skips limited queues, rate-limited queues and keyed tickets, so a claimer must know whether any
queue has a concurrency limit and whether any flow control (concurrency key, key override, rate
limit) exists. It looks now and then (``LIMITS_CHECK_SECONDS``), and at once when a notified
claim came back empty, and keeps the answers in its ``LimitsSeen``: the worker's store owns
one; a claim given none starts from a new one.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from pgqueue import codec
from pgqueue.db import Executor
from pgqueue.errors import SerializationError
from pgqueue.jobs import ClaimedJob
from pgqueue.sql import claim as claim_sql
from pgqueue.sqlstates import is_connection_error

# How long a claimer trusts its last look at which controls exist. Only the controlled work waits
# on it (the lean claim skips limited and rate-limited queues and keyed tickets): pause and the
# limits themselves are read by every claim statement, so staleness can delay newly controlled
# work by this much, never let it exceed its limit; a notified claim that comes back empty looks
# again at once. Long enough that an idle worker's statement rate barely changes.
LIMITS_CHECK_SECONDS = 5.0


class LimitsSeen:
    """A claimer's last look at which controls exist (they choose the claim variant), and
    when its last short claim's rate windows free. Until the claimer has looked, queue limits
    are assumed (the full variant is always correct) and flow controls are not: the first claim
    is followed by the first look, and a short first claim by a claim of the flow variant when
    that look finds flow controls."""

    def __init__(self) -> None:
        self.exist = True
        self.flow = False
        self.rates = False
        self.until = 0.0  # monotonic time after which the answer is stale
        self.rate_wait: float | None = None
        """Seconds from the last claim until a full rate window has room (None: none full)."""

    def stale(self, now: float) -> bool:
        return now >= self.until

    def record(self, exist: bool, *, until: float, flow: bool = False, rates: bool = False) -> None:
        """What the claimer saw: queue limits (``exist``), flow controls and rate limits."""
        self.exist = exist
        self.flow = flow
        self.rates = rates
        self.until = until


def claim_variant(
    *,
    atomic: bool,
    queues: Sequence[str] | None,
    limits_exist: bool,
    task_leases: bool,
    flow_exists: bool = False,
    excluding: bool = False,
) -> claim_sql.ClaimVariant:
    """The claim variant for a claim of ``queues`` (None: all) in this mode (``excluding``:
    some task names are to be passed over)."""
    return claim_sql.ClaimVariant(
        atomic=atomic,
        some_queues=queues is not None,
        queue_limits=limits_exist or flow_exists,
        task_leases=task_leases,
        flow=flow_exists,
        excluded=excluding,
    )


def claim(
    db: Executor,
    *,
    worker_id: str,
    limit: int,
    queues: Sequence[str] | None,
    lease_seconds: float,
    task_leases: Mapping[str, float],
    atomic: bool = False,
    limits: LimitsSeen | None = None,
    notified: bool = False,
    autocommit: bool = False,
    excluded: Sequence[str] = (),
) -> list[ClaimedJob]:
    """Claim up to ``limit`` ready jobs (see ``sql.claim.claim``), none of a task named in
    ``excluded`` (tasks the claimer met and does not register; usually none); ``atomic``: atomic
    jobs instead of leased ones, each then run in a transaction that first takes its row
    (``data.atomic_runs.lock_claimed``). ``limits`` is the claimer's ``LimitsSeen`` (by default a new one:
    a first claim, which assumes queue limits and looks afterwards).

    ``notified``: the claim follows a wake-up for new work. If the lean form comes back empty
    the claimer looks at once whether controls exist (a first keyed job, say) and, if they do,
    claims with the full form. Only when empty: a claim that got jobs hands them over first,
    rather than delay them by a round trip on every wake-up of a lightly loaded worker. A
    short claim of the flow form, while rate limits
    exist, records in ``limits.rate_wait`` when the first window the claim found full has room
    (0: it has room already, claim again).

    ``autocommit``: each statement commits by itself (the worker's claims). Then a lost
    connection after a claim that got jobs returns those jobs instead of raising."""
    if limits is None:
        limits = LimitsSeen()
    ex = db
    params: dict[str, Any] = {"limit": limit, "worker": worker_id, "lease_seconds": lease_seconds}
    if task_leases:
        params["task_leases"] = dict(task_leases)
    if queues is not None:
        params["queues"] = list(queues)
    if excluded:
        params["excluded"] = list(excluded)

    def claim_with(seen: LimitsSeen, room: int) -> tuple[list[ClaimedJob], float]:
        variant = claim_variant(
            atomic=atomic,
            queues=queues,
            limits_exist=seen.exist,
            task_leases=bool(task_leases),
            flow_exists=seen.flow,
            excluding=bool(excluded),
        )
        # ``sent`` precedes the statement's start on the server: see ClaimedJob.start_by.
        rows, sent = ex.timed_rows(claim_sql.claim(variant), {**params, "limit": room})
        jobs = _claimed_jobs(rows)
        if variant.flow:
            for job in jobs:
                if job.start_within is not None:
                    job.start_by = sent + job.start_within
        return jobs, sent

    lean = not (limits.exist or limits.flow)
    with_flow = limits.flow
    jobs, sent = claim_with(limits, limit)
    limits.rate_wait = None
    try:
        # After the claim, so the claim itself stays the first and only statement of its turn.
        if limits.stale(time.monotonic()) or (notified and lean and not jobs):
            _look_at_controls(ex, limits)
            if not with_flow and limits.flow and len(jobs) < limit:
                more, sent = claim_with(limits, limit - len(jobs))
                jobs += more
        if limits.flow and limits.rates and len(jobs) < limit:
            # The windows as the claim saw them: one that freed since still counts (wait 0).
            looked_ago = time.monotonic() - sent
            wait = ex.rows(claim_sql.rate_wait(), {"looked_ago": looked_ago})[0][0]
            limits.rate_wait = None if wait is None else max(float(wait), 0.0)
    except Exception as exc:
        # A claim that committed on its own owns its jobs whatever happens to the connection
        # next: raising would leave them RUNNING under this worker's name, unseen, until their
        # leases expire (a retry takes them back only if the server answers before the worker
        # stops). The look at the controls is stale still, so the next claim looks again.
        if not (autocommit and jobs and is_connection_error(exc)):
            raise
    return jobs


def _look_at_controls(ex: Executor, limits: LimitsSeen) -> None:
    """Record in ``limits`` which controls exist now."""
    exist, flow, rates = ex.rows(claim_sql.controls_exist())[0]
    limits.record(
        bool(exist),
        until=time.monotonic() + LIMITS_CHECK_SECONDS,
        flow=bool(flow),
        rates=bool(rates),
    )


def claim_listed(
    db: Executor,
    job_ids: Sequence[int],
    *,
    worker_id: str,
    lease_seconds: float,
    atomic: bool = False,
) -> list[ClaimedJob]:
    """Claim the listed jobs whose ticket is there to take, due or not
    (``sql.claim.claim_listed``); for running chosen jobs at once, as test helpers do."""
    params = {"job_ids": list(job_ids), "worker": worker_id, "lease_seconds": lease_seconds}
    return _claimed_jobs(db.rows(claim_sql.claim_listed(atomic), params))


def claimed_by(
    db: Executor, *, worker_id: str, held: Iterable[int], within: float
) -> list[ClaimedJob]:
    """Jobs RUNNING under ``worker_id``, claimed in the last ``within`` seconds, that it does not
    hold (``sql.claim.claimed_by``)."""
    params = {"worker": worker_id, "held": sorted(held), "within": within}
    return _claimed_jobs(db.rows(claim_sql.claimed_by(), params))


def _claimed_jobs(rows: Iterable[Sequence[Any]]) -> list[ClaimedJob]:
    """Rows of ``sql.common.CLAIMED_COLUMNS`` as jobs, each job's arguments decoded on its own.
    The claim has committed: a row that cannot be decoded must not take the others' answer
    with it, so it becomes a job whose ``problem`` says why (the executor fails it at once)."""
    load = codec.load_arguments
    jobs = []
    for row in rows:
        job = ClaimedJob(*row)
        try:
            job.args, job.kwargs = load(row[3], row[4])
        except SerializationError as exc:
            job.args, job.kwargs = [], {}
            job.problem = f"job {job.id}'s arguments could not be decoded ({exc})"
        jobs.append(job)
    return jobs


def ready_ticket_exists(
    db: Executor, queues: Sequence[str] | None, excluded: Sequence[str] = ()
) -> bool:
    """Whether any ticket of ``queues`` (None: all) is claimable now, other than those of the
    tasks in ``excluded``."""
    params: dict[str, Any] = {} if queues is None else {"queues": list(queues)}
    if excluded:
        params["excluded"] = list(excluded)
    statement = claim_sql.ready_ticket_exists(queues is not None, bool(excluded))
    return bool(db.rows(statement, params)[0][0])


def any_queue_limit(db: Executor) -> bool:
    """Whether any queue has a concurrency limit."""
    return bool(db.rows(claim_sql.any_queue_limit())[0][0])
