"""One function per database operation, over ``db.Executor``; never commits.

Each function takes a caller's ``Session`` (its transaction, e.g. the host application's for
transactional enqueue) or an ``Executor`` from ``db.Database`` (pgqueue's own unit of work,
possibly on the driver). Functions translate between Python values and the bind parameters of
the statements of ``pgqueue.sql``, and report lost leases as the set of ids that matched no
row. Functions that return ORM objects take a ``Session`` only.

Sectioned by topic like ``pgqueue.sql``, and kept one module (a little over 500 lines) so that
each operation has one import path: the worker, the scheduler, the admin surface and tests all
name them as ``repository.<operation>``.
"""

from __future__ import annotations

import datetime as dt
import time
import uuid
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from sqlalchemy.orm import Session

from pgqueue import claim_choice, copy_rows, dependencies, queue_bounds, validation
from pgqueue.db import Executor, claimer_key, executor_for
from pgqueue.errors import JobNotFound, SerializationError, ValidationError, is_connection_error
from pgqueue.insert_choice import BoundedQueuesSeen
from pgqueue.jobs import ClaimedJob, NewJob, Outcome, Progress, WorkerEntry
from pgqueue.models import JOB_COLUMN_NAMES, Job, JobHistory
from pgqueue.sql import admin, atomic_runs, control, enqueue, maintenance
from pgqueue.sql import claim as claim_sql
from pgqueue.sql import flow as flow_sql
from pgqueue.sql import history as history_sql
from pgqueue.sql import outcomes as outcome_sql
from pgqueue.sql import workers as workers_sql
from pgqueue.states import FINAL_STATES, JobState, OutcomeKind

SessionOrExecutor = Session | Executor

# --- enqueue ----------------------------------------------------------------------------------


def insert_jobs(
    db: SessionOrExecutor,
    jobs: Sequence[NewJob],
    trace_context: str | None = None,
    bounded: BoundedQueuesSeen | None = None,
) -> list[int]:
    """Insert jobs and their tickets; return ids in input order. ``trace_context`` (JSON
    text, see ``pgqueue.tracing``) is stored with every job.

    A job whose unique key is already held by an active job is not inserted; the existing job's
    id is returned in its place (if that job finished meanwhile, the insert is tried again).

    Bounded queues: the jobs of a queue with a ``max_depth`` are inserted all or none, after
    their queue's lock (``queue_bounds.lock``); when they do not fit, QueueFull is
    raised and nothing of the batch was written (no SQL error: the transaction stays usable).
    Queues ``bounded`` believes bounded are locked first; the others are found by the plain
    insert's guard, which then inserted nothing. The belief is corrected by each lock's answer.
    """
    if not jobs:
        return []
    ex = executor_for(db)
    with_dependencies = any(j.depends_on for j in jobs)
    if with_dependencies and any(j.unique_key is not None and j.depends_on for j in jobs):
        raise ValidationError("a job with depends_on cannot also have a unique_key")
    with_keys = any(j.unique_key is not None for j in jobs)
    seen = bounded if bounded is not None else BoundedQueuesSeen()
    locked = queue_bounds.lock(ex, jobs, seen) if seen.covers(jobs) else None
    for _ in range(10):
        rows = _insert_rows(ex, jobs, trace_context, locked, with_keys, with_dependencies)
        if queue_bounds.stopped_by_bound(ex, jobs, rows, locked):
            locked = queue_bounds.lock(ex, jobs, seen)
            continue
        if not with_keys:
            return [row[0] for row in rows]
        resolved = _match_unique(ex, jobs, rows)
        if resolved is not None:
            return resolved
        if with_dependencies:  # pragma: no cover - a key's holder is never a dependent job
            raise RuntimeError("unique-key enqueue with dependencies did not settle")
    raise RuntimeError("enqueue did not settle after 10 tries")  # pragma: no cover


def _insert_rows(
    ex: Executor,
    jobs: Sequence[NewJob],
    trace_context: str | None,
    locked: list[str] | None,
    with_keys: bool,
    with_dependencies: bool,
) -> Sequence[Any]:
    """One run of ``sql.enqueue.insert_jobs``: plain, or checked against the bounds of the
    ``locked`` queues; its rows (none when a bound stopped it)."""
    params = _insert_params(jobs, trace_context)
    if locked is not None:
        params["locked_queues"] = locked
    keyed = _add_concurrency_keys(jobs, params)
    statement = enqueue.insert_jobs(
        with_keys,
        with_dependencies=with_dependencies,
        traced=trace_context is not None,
        bounded=locked is not None,
        with_concurrency_keys=keyed,
    )
    if with_dependencies:
        return _insert_dependent_jobs(ex, jobs, params, statement)
    return ex.rows(statement, params)


def insert_one_job(db: Executor, job: NewJob, trace_context: str | None = None) -> int | None:
    """Insert one job without unique key or dependencies, and its ticket; return its id. None
    when its queue has a bound: nothing was written, and ``insert_jobs`` inserts it (in a
    transaction, which the queue's lock needs)."""
    params: dict[str, Any] = {
        "task_name": job.task_name,
        "queue": job.queue,
        "args": job.args_json,
        "kwargs": job.kwargs_json,
        "priority": job.priority,
        "max_attempts": job.max_attempts,
        "delay": job.delay,
        "run_at": job.run_at,
        "atomic": job.atomic,
    }
    if trace_context is None:
        rows = db.rows(enqueue.insert_one_job(), params)
    else:
        params["trace_context"] = trace_context
        rows = db.rows(enqueue.insert_one_job(traced=True), params)
    return int(rows[0][0]) if rows else None


def copy_jobs(
    db: Executor, jobs: Sequence[NewJob], trace_context: str | None = None
) -> list[int] | None:
    """Insert a large ``insert_choice.uniform`` batch of jobs and their tickets: one statement
    allocates the ids, inserts the tickets and sends the wake-up, then one ``COPY`` writes the
    jobs; return the ids in input order. None when the batch's queue has a bound: nothing was
    written, and ``insert_jobs`` inserts it.

    Ids come from the identity sequence first (``sql.enqueue.allocate_jobs_with_tickets``,
    ascending like the ``INSERT``'s), with the batch's ``run_at``, so both tables get the same
    values.
    """
    first = jobs[0]
    params = {
        "n": len(jobs),
        "run_at": first.run_at,
        "delay": first.delay,
        "queue": first.queue,
        "priority": first.priority,
        "atomic": first.atomic,
    }
    ids: list[int] | None
    ids, run_at = db.rows(enqueue.allocate_jobs_with_tickets(), params)[0]
    if ids is None:
        return None
    ids.sort()  # drawn ascending already: a linear check, unless the server reordered them
    lines = copy_rows.job_lines(ids, jobs, run_at.isoformat(), trace_context)
    db.copy(enqueue.copy_jobs(traced=trace_context is not None), copy_rows.chunks(lines))
    return ids


def set_queue_max_depth(db: SessionOrExecutor, name: str, max_depth: int | None) -> None:
    """Set (or, with None, remove) queue ``name``'s bound."""
    executor_for(db).rows(enqueue.set_max_depth(), {"name": name, "max_depth": max_depth})


def _insert_params(jobs: Sequence[NewJob], trace_context: str | None) -> dict[str, Any]:
    """The parallel arrays ``sql.enqueue.insert_jobs`` binds, one entry per job (and the one
    ``trace_context`` of them all, when there is one)."""
    params: dict[str, Any] = {
        "task_names": [j.task_name for j in jobs],
        "queues": [j.queue for j in jobs],
        "args": [j.args_json for j in jobs],
        "kwargs": [j.kwargs_json for j in jobs],
        "priorities": [j.priority for j in jobs],
        "max_attempts": [j.max_attempts for j in jobs],
        "delays": [j.delay for j in jobs],
        "run_ats": [None if j.run_at is None else j.run_at.isoformat() for j in jobs],
        "unique_keys": [j.unique_key for j in jobs],
        "atomics": [j.atomic for j in jobs],
    }
    if trace_context is not None:
        params["trace_context"] = trace_context
    return params


def _add_concurrency_keys(jobs: Sequence[NewJob], params: dict[str, Any]) -> bool:
    """Add the binds of keyed jobs to ``params`` when any job has a concurrency key."""
    if all(j.concurrency_key is None for j in jobs):
        return False
    params["concurrency_keys"] = [j.concurrency_key for j in jobs]
    params["key_limits"] = [j.key_limit for j in jobs]
    return True


def _match_unique(ex: Executor, jobs: Sequence[NewJob], rows: Sequence[Any]) -> list[int] | None:
    """Map inserted rows back to inputs; look up the holders of keys that conflicted."""
    inserted_plain = iter(sorted(row[0] for row in rows if row[1] is None))
    by_key: dict[str, int] = {row[1]: row[0] for row in rows if row[1] is not None}
    missing = [
        j.unique_key for j in jobs if j.unique_key is not None and j.unique_key not in by_key
    ]
    if missing:
        found = ex.rows(enqueue.active_job_ids_by_unique_key(), {"unique_keys": missing})
        by_key.update({key: job_id for job_id, key in found if key is not None})
        if any(key not in by_key for key in missing):
            return None  # the holder finished between our insert and lookup: insert again
    return [next(inserted_plain) if j.unique_key is None else by_key[j.unique_key] for j in jobs]


def _insert_dependent_jobs(
    ex: Executor, jobs: Sequence[NewJob], params: dict[str, Any], statement: Any
) -> Sequence[Any]:
    """Insert jobs some of which depend on others (``NewJob.depends_on``) with ``statement``
    (``sql.enqueue.insert_jobs`` with dependencies) and the jobs' ``params``; the insert's rows
    (none when a bound stopped it: see ``insert_jobs``).

    The dependencies are locked first (see ``sql.enqueue.lock_dependencies``) and their states
    read after the lock; each job's state follows ``dependencies.initial_state``, and the
    waiting ones are appended to their unfinished dependencies' ``dependents``. Unique keys are
    not combined with dependencies (the waiting job would hold no key).
    """
    wanted = sorted({d for j in jobs for d in j.depends_on})
    found = {
        job_id: JobState(state)
        for job_id, state in ex.rows(enqueue.lock_dependencies(), {"ids": wanted})
    }
    missing = [d for d in wanted if d not in found]
    if missing:
        raise JobNotFound(f"depends_on names jobs that do not exist: {missing}")
    states: list[str] = []
    reasons: list[str | None] = []
    for job in jobs:
        state, reason = dependencies.initial_state({d: found[d] for d in job.depends_on})
        states.append(state.value)
        reasons.append(reason)
    params.update(
        states=states,
        depends_ons=[dependencies.array_text(j.depends_on) for j in jobs],
        reasons=reasons,
    )
    rows = ex.rows(statement, params)
    edges = [
        (dependency, row[0])
        for row in rows
        if row[2] == JobState.WAITING.value
        for dependency in row[3] or ()
        if found[dependency] is not JobState.SUCCEEDED
    ]
    if edges:
        ex.rows(
            enqueue.add_dependents(),
            {"dependency_ids": [d for d, _ in edges], "dependent_ids": [j for _, j in edges]},
        )
    return rows


# --- claim ------------------------------------------------------------------------------------

# How long a claimer trusts its last look at which controls exist. Only the controlled work waits
# on it (the lean claim skips limited and rate-limited queues and keyed tickets): pause and the
# limits themselves are read by every claim statement, so staleness can delay newly controlled
# work by this much, never let it exceed its limit; a notified claim that comes back empty looks
# again at once. Long enough that an idle worker's statement rate barely changes.
LIMITS_CHECK_SECONDS = 5.0


def claim(
    db: SessionOrExecutor,
    *,
    worker_id: str,
    limit: int,
    queues: Sequence[str] | None,
    lease_seconds: float,
    task_leases: Mapping[str, float],
    atomic: bool = False,
    limits: claim_choice.LimitsSeen | None = None,
    notified: bool = False,
    autocommit: bool = False,
    excluded: Sequence[str] = (),
) -> list[ClaimedJob]:
    """Claim up to ``limit`` ready jobs (see ``sql.claim.claim``), none of a task named in
    ``excluded`` (tasks the claimer met and does not register; usually none). ``limits`` is the claimer's
    ``LimitsSeen`` (by default the one of the session's bind, or of the executor).

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
        limits = claim_choice.limits_seen_by(claimer_key(db))
    ex = executor_for(db)
    params: dict[str, Any] = {"limit": limit, "worker": worker_id, "lease_seconds": lease_seconds}
    if task_leases:
        params["task_leases"] = dict(task_leases)
    if queues is not None:
        params["queues"] = list(queues)
    if excluded:
        params["excluded"] = list(excluded)

    def claim_with(seen: claim_choice.LimitsSeen, room: int) -> tuple[list[ClaimedJob], float]:
        variant = claim_choice.claim_variant(
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
            wait = ex.rows(flow_sql.rate_wait(), {"looked_ago": looked_ago})[0][0]
            limits.rate_wait = None if wait is None else max(float(wait), 0.0)
    except Exception as exc:
        # A claim that committed on its own owns its jobs whatever happens to the connection
        # next: raising would leave them RUNNING under this worker's name, unseen, until their
        # leases expire (a retry takes them back only if the server answers before the worker
        # stops). The look at the controls is stale still, so the next claim looks again.
        if not (autocommit and jobs and is_connection_error(exc)):
            raise
    return jobs


def claim_atomic_controlled(
    db: SessionOrExecutor,
    *,
    worker_id: str,
    queues: Sequence[str] | None,
    lease_seconds: float,
    limits: claim_choice.LimitsSeen,
    excluded: Sequence[str] = (),
) -> list[ClaimedJob]:
    """Claim at most one atomic job of controlled work (a limited or rate-limited queue, a
    concurrency key) in a statement that commits by itself, its counters counted there like a
    leased claim's; nothing when ``limits`` saw no controls. The caller runs the job in a
    transaction that first takes its row (``lock_claimed``)."""
    if not (limits.exist or limits.flow):
        return []
    variant = claim_choice.claim_variant(
        atomic=True,
        queues=queues,
        limits_exist=limits.exist,
        task_leases=False,
        flow_exists=limits.flow,
        excluding=bool(excluded),
        atomic_controlled=True,
    )
    params: dict[str, Any] = {"limit": 1, "worker": worker_id, "lease_seconds": lease_seconds}
    if queues is not None:
        params["queues"] = list(queues)
    if excluded:
        params["excluded"] = list(excluded)
    rows, sent = executor_for(db).timed_rows(claim_sql.claim(variant), params)
    jobs = _claimed_jobs(rows)
    for job in jobs:
        if job.start_within is not None:
            job.start_by = sent + job.start_within
    return jobs


def lock_claimed(db: SessionOrExecutor, job: ClaimedJob) -> bool:
    """Lock the row of ``job`` (claimed by ``claim_atomic_controlled``) in the caller's
    transaction; False when its lease was lost."""
    params = {"job_id": job.id, "token": job.lease_token}
    return bool(executor_for(db).rows(claim_sql.lock_claimed(), params))


def _look_at_controls(ex: Executor, limits: claim_choice.LimitsSeen) -> None:
    """Record in ``limits`` which controls exist now."""
    exist, flow, rates = ex.rows(flow_sql.controls_exist())[0]
    limits.record(
        bool(exist),
        until=time.monotonic() + LIMITS_CHECK_SECONDS,
        flow=bool(flow),
        rates=bool(rates),
    )


def claim_listed(
    db: SessionOrExecutor,
    job_ids: Sequence[int],
    *,
    worker_id: str,
    lease_seconds: float,
    atomic: bool = False,
) -> list[ClaimedJob]:
    """Claim the listed jobs whose ticket is there to take, due or not
    (``sql.claim.claim_listed``); for running chosen jobs at once, as test helpers do."""
    params = {"job_ids": list(job_ids), "worker": worker_id, "lease_seconds": lease_seconds}
    return _claimed_jobs(executor_for(db).rows(claim_sql.claim_listed(atomic), params))


def claimed_by(
    db: SessionOrExecutor, *, worker_id: str, held: Iterable[int], within: float
) -> list[ClaimedJob]:
    """Jobs RUNNING under ``worker_id``, claimed in the last ``within`` seconds, that it does not
    hold (``sql.claim.claimed_by``)."""
    params = {"worker": worker_id, "held": sorted(held), "within": within}
    return _claimed_jobs(executor_for(db).rows(claim_sql.claimed_by(), params))


def _claimed_jobs(rows: Iterable[Sequence[Any]]) -> list[ClaimedJob]:
    """Rows of ``sql.common.CLAIMED_COLUMNS`` as jobs, each job's arguments decoded on its own.
    The claim has committed: a row that cannot be decoded must not take the others' answer
    with it, so it becomes a job whose ``problem`` says why (the executor fails it at once)."""
    load = validation.load_arguments
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
    db: SessionOrExecutor, queues: Sequence[str] | None, excluded: Sequence[str] = ()
) -> bool:
    """Whether any ticket of ``queues`` (None: all) is claimable now, other than those of the
    tasks in ``excluded``."""
    params: dict[str, Any] = {} if queues is None else {"queues": list(queues)}
    if excluded:
        params["excluded"] = list(excluded)
    statement = claim_sql.ready_ticket_exists(queues is not None, bool(excluded))
    return bool(executor_for(db).rows(statement, params)[0][0])


def any_queue_limit(db: SessionOrExecutor) -> bool:
    """Whether any queue has a concurrency limit."""
    return bool(executor_for(db).rows(claim_sql.any_queue_limit())[0][0])


# --- outcomes ---------------------------------------------------------------------------------

_OUTCOME_STATEMENTS = {
    OutcomeKind.COMPLETE: outcome_sql.complete,
    OutcomeKind.RETRY: outcome_sql.retry,
    OutcomeKind.FAIL: outcome_sql.fail,
    OutcomeKind.CANCELLED: outcome_sql.mark_cancelled,
    OutcomeKind.RELEASE: outcome_sql.release,
    OutcomeKind.SNOOZE: outcome_sql.snooze,
}
# Outcomes that end (or, a snooze past its maximum, may end) their job: its dependents are
# settled in the same transaction.
_ENDING_KINDS = frozenset(
    k for k in OutcomeKind if k.transition.target in FINAL_STATES or k is OutcomeKind.SNOOZE
)


def record_outcomes(
    db: SessionOrExecutor, outcomes: Iterable[Outcome], *, lock_wait_ms: int | None = None
) -> set[int]:
    """Write many outcomes, one statement per kind, and settle the dependents of the jobs they
    ended; return the ids whose lease was lost. Run in one transaction: an outcome and the
    settling of its dependents commit together. ``lock_wait_ms``: the transaction waits at
    most this long for each row lock (``lock_timeout``, set for this transaction only)."""
    ex = executor_for(db)
    if lock_wait_ms is not None:
        ex.rows(maintenance.set_lock_timeout(), {"ms": str(lock_wait_ms)})
    by_kind: dict[OutcomeKind, list[Outcome]] = {}
    for outcome in outcomes:
        by_kind.setdefault(outcome.kind, []).append(outcome)
    if len(by_kind) == 1:
        ids = sorted(o.job_id for batch in by_kind.values() for o in batch)
    else:
        ids = sorted({o.job_id for batch in by_kind.values() for o in batch})
    if len(ids) > 1:
        # One statement per kind would lock the rows in kind order; in a transaction that can
        # deadlock with a heartbeat of the same jobs. Take them all first, in id order.
        ex.rows(outcome_sql.lock_jobs(), {"ids": ids})
    lost: set[int] = set()
    ended: set[int] = set()
    for kind, batch in by_kind.items():
        statement = _OUTCOME_STATEMENTS.get(kind)
        if statement is None:  # pragma: no cover - Outcome kinds are produced by pgqueue only
            raise ValueError(f"unknown outcome kind {kind!r}")
        params = _outcome_params(kind, batch)
        with_progress = _add_progress(params, batch)
        keyed = any(o.keyed for o in batch)
        rows = ex.rows(statement(with_progress, keyed), params)
        if kind in _ENDING_KINDS:
            ended |= dependencies.ended_dependents(rows, 1)
        if len(rows) != len(batch):
            done = {row[0] for row in rows}
            lost.update(o.job_id for o in batch if o.job_id not in done)
    if ended:
        dependencies.settle(ex, ended)
    return lost


def record_atomic_run(db: SessionOrExecutor, job: ClaimedJob, worker_id: str) -> bool:
    """Record, on a connection other than the claim's and committed at once, that ``job``'s
    handler starts its attempt (``sql.atomic_runs.record_run``). False when a run of that
    attempt is already recorded: an earlier run's transaction was lost and must be counted
    before the handler may run again."""
    params = {"job_id": job.id, "attempt": job.attempt, "worker": worker_id}
    return bool(executor_for(db).rows(atomic_runs.record_run(), params))


def clear_atomic_runs(db: SessionOrExecutor, job_id: int) -> None:
    """Delete the job's run records, in the transaction that commits its attempt."""
    executor_for(db).rows(atomic_runs.clear_runs(), {"job_id": job_id})


def count_lost_attempt(
    db: SessionOrExecutor, job: ClaimedJob, *, delay: float, error: str
) -> JobState | None:
    """Count the recorded runs of atomic job ``job`` whose transaction was lost
    (``sql.atomic_runs.count_lost_runs``): retried after ``delay`` seconds, or failed for good
    with its dependents settled. None when nothing was lost (the claim had committed after
    all, or no run was recorded) or a claim of the job under way elsewhere counts them. Run in
    a transaction of its own."""
    ex = executor_for(db)
    params = {"job_id": job.id, "delay": delay, "error": error}
    rows = ex.rows(atomic_runs.count_lost_runs(), params)
    if not rows:
        return None
    ended = dependencies.ended_dependents(rows, 1)
    if ended:
        dependencies.settle(ex, ended)
    return JobState(rows[0][0])


def check_deferred_constraints(db: SessionOrExecutor) -> None:
    """Check the transaction's deferred constraints now (a violation raises here)."""
    executor_for(db).rows(outcome_sql.check_deferred_constraints())


def _outcome_params(kind: OutcomeKind, batch: Sequence[Outcome]) -> dict[str, Any]:
    """The bind parameters of the statement of ``kind`` for ``batch``."""
    params: dict[str, Any] = {
        "ids": [o.job_id for o in batch],
        "tokens": [o.lease_token for o in batch],
    }
    if kind == OutcomeKind.COMPLETE:
        params["results"] = [o.result_json for o in batch]
    elif kind == OutcomeKind.RETRY:
        params["delays"] = [o.delay for o in batch]
        params["errors"] = [o.error for o in batch]
    elif kind in (OutcomeKind.FAIL, OutcomeKind.CANCELLED):
        params["errors"] = [o.error for o in batch]
    elif kind == OutcomeKind.SNOOZE:
        params["delays"] = [o.delay for o in batch]
        params["max_snoozes"] = [o.max_snoozes for o in batch]
    return params


def _add_progress(params: dict[str, Any], batch: Sequence[Outcome]) -> bool:
    """Add the progress arrays of ``batch`` to ``params`` when any of its outcomes carries
    progress no heartbeat wrote (then the statement's ``with_progress`` form runs); whether
    it did."""
    if all(o.progress is None for o in batch):
        return False
    reported = [o.progress for o in batch]
    params["progress_values"] = [None if p is None else p[0] for p in reported]
    params["progress_messages"] = [None if p is None else p[1] for p in reported]
    return True


def heartbeat(
    db: SessionOrExecutor,
    leases: Sequence[tuple[int, uuid.UUID, float]],
    worker: WorkerEntry | None = None,
    progress: Mapping[int, Progress] | None = None,
) -> dict[int, bool]:
    """Extend leases ``(job id, token, seconds)``; return ``{id: cancel_requested}`` for those
    still held (ids missing from the result have lost their lease). With ``worker``, the same
    statement refreshes that worker's registry row (``worker_seen``); with ``progress`` (job
    id -> progress reported since the last write), it also writes that progress."""
    if not leases:
        return {}
    params: dict[str, Any] = {
        "ids": [job_id for job_id, _, _ in leases],
        "tokens": [token for _, token, _ in leases],
        "lease_seconds": [seconds for _, _, seconds in leases],
    }
    with_progress = bool(progress)
    if progress:
        reported = [progress.get(job_id) for job_id, _, _ in leases]
        params["progress_values"] = [None if p is None else p[0] for p in reported]
        params["progress_messages"] = [None if p is None else p[1] for p in reported]
    statement = outcome_sql.heartbeat(with_progress)
    if worker is not None:
        params.update(_worker_params(worker))
        statement = workers_sql.heartbeat_and_seen(with_progress)
    return {job_id: bool(flag) for job_id, flag in executor_for(db).rows(statement, params)}


# --- worker registry ------------------------------------------------------------------------


def _worker_params(worker: WorkerEntry) -> dict[str, Any]:
    return {
        "worker_id": worker.id,
        "worker_host": worker.host,
        "worker_pid": worker.pid,
        "worker_queues": list(worker.queues),
        "worker_concurrency": worker.concurrency,
        "worker_version": worker.version,
        "worker_started_at": worker.started_at,
        "worker_claim_error": worker.claim_error,
        "worker_tasks": list(worker.tasks),
    }


def worker_seen(db: SessionOrExecutor, worker: WorkerEntry) -> dt.datetime:
    """Write or refresh ``worker``'s registry row; its ``started_at``."""
    started_at = executor_for(db).rows(workers_sql.register(), _worker_params(worker))[0][0]
    assert isinstance(started_at, dt.datetime)
    return started_at


def unregister_worker(db: SessionOrExecutor, worker_id: str) -> None:
    """Delete ``worker_id``'s registry row."""
    executor_for(db).rows(workers_sql.unregister(), {"worker_id": worker_id})


def unregistered_ready(db: SessionOrExecutor, stale_seconds: float, cap: int) -> dict[str, int]:
    """Per queue, the ready jobs whose task no live worker serving the queue registers
    (``sql.workers.unregistered_ready``: at most ``cap`` tickets read)."""
    params = {"stale_seconds": stale_seconds, "cap": cap}
    return {
        queue: int(n)
        for queue, n in executor_for(db).rows(workers_sql.unregistered_ready(), params)
    }


def delete_stale_workers(db: SessionOrExecutor, stale_seconds: float) -> list[str]:
    """Delete the registry rows of workers not seen within ``stale_seconds``; their ids."""
    rows = executor_for(db).rows(workers_sql.delete_stale(), {"stale_seconds": stale_seconds})
    return [row[0] for row in rows]


def list_workers(
    db: SessionOrExecutor, stale_seconds: float, *, include_stale: bool = False
) -> Sequence[Any]:
    """Registry rows (``sql.workers.list_workers``), live ones first."""
    params = {"stale_seconds": stale_seconds, "include_stale": include_stale}
    return executor_for(db).rows(workers_sql.list_workers(), params)


def job_holder(db: SessionOrExecutor, job_id: int, stale_seconds: float) -> Any | None:
    """The worker holding RUNNING job ``job_id`` (``sql.workers.job_holder``), or None."""
    params = {"job_id": job_id, "stale_seconds": stale_seconds}
    rows = executor_for(db).rows(workers_sql.job_holder(), params)
    return rows[0] if rows else None


def elected_worker(db: SessionOrExecutor, worker_id: str, stale_seconds: float) -> bool:
    """Whether no live worker has an id below ``worker_id`` (the cluster's elected worker)."""
    params = {"worker_id": worker_id, "stale_seconds": stale_seconds}
    return bool(executor_for(db).rows(workers_sql.no_live_worker_before(), params)[0][0])


def settle_dependents(db: SessionOrExecutor, job_ids: Iterable[int]) -> dict[int, JobState]:
    """Queue or cancel WAITING jobs whose dependencies ended (``dependencies.settle``)."""
    return dependencies.settle(executor_for(db), job_ids)


# --- maintenance ------------------------------------------------------------------------------


def expired_lease_exists(db: SessionOrExecutor) -> bool:
    """Whether any RUNNING job's lease has expired."""
    return bool(executor_for(db).rows(maintenance.expired_lease_exists())[0][0])


def rescue_expired(
    db: SessionOrExecutor, *, lock_key: int, limit: int, error: str
) -> list[tuple[int, str]]:
    """Re-queue or end jobs whose lease expired and settle the dependents of those that ended;
    ``(id, new state)`` of each."""
    ex = executor_for(db)
    params = {"lock_key": lock_key, "limit": limit, "error": error}
    rows = ex.rows(maintenance.rescue_expired(), params)
    ended = {d for row in rows if row[1] != JobState.RETRYING.value for d in row[2] or ()}
    if ended:
        dependencies.settle(ex, ended)
    return [(row[0], row[1]) for row in rows]


def prune_finished(
    db: SessionOrExecutor, *, succeeded_before: float, failed_before: float, limit: int
) -> int:
    """Delete up to ``limit`` finished jobs past their retention; how many were deleted."""
    params = {"succeeded_before": succeeded_before, "failed_before": failed_before, "limit": limit}
    return int(executor_for(db).rows(maintenance.prune_finished(), params)[0][0])


def move_to_history(db: SessionOrExecutor, *, age: float, limit: int) -> int:
    """Move up to ``limit`` jobs finished more than ``age`` seconds ago into the partitioned
    history; how many were moved."""
    params = {"age": age, "limit": limit}
    return int(executor_for(db).rows(history_sql.move_finished(), params)[0][0])


def try_maintenance_lock(db: SessionOrExecutor, key: int) -> bool:
    """Take the transaction's advisory lock ``key`` if free."""
    return bool(executor_for(db).rows(maintenance.try_maintenance_lock(), {"key": key})[0][0])


def recount_running(db: SessionOrExecutor) -> dict[str, int]:
    """Correct drifted ``running`` counters of limited queues (call inside a transaction);
    returns ``{queue: corrected count}``. Queues a claim is using right now are skipped."""
    ex = executor_for(db)
    names = [row[0] for row in ex.rows(maintenance.lock_limited_queues())]
    if not names:
        return {}
    return {
        name: running for name, running in ex.rows(maintenance.recount_running(), {"names": names})
    }


# --- queue control and schedules ------------------------------------------------------------


def set_queue_control(
    db: SessionOrExecutor,
    name: str,
    *,
    paused: bool | None = None,
    concurrency_limit: int | bool | None = False,
) -> None:
    """Upsert a queue's switches; ``concurrency_limit=False`` leaves the limit as it is."""
    params: dict[str, Any] = {"name": name}
    if paused is not None:
        params["paused"] = paused
    set_limit = concurrency_limit is not False
    if set_limit:
        params["concurrency_limit"] = concurrency_limit
    statement = control.set_queue_control(paused=paused is not None, limit=set_limit)
    executor_for(db).rows(statement, params)


def set_key_limit(db: SessionOrExecutor, prefix: str, key_limit: int | None) -> None:
    """Set (None: remove) the per-key limit override of keys starting with ``prefix``."""
    ex = executor_for(db)
    ex.rows(flow_sql.set_key_override("key_limit"), {"prefix": prefix, "key_limit": key_limit})
    ex.rows(flow_sql.delete_empty_override(), {"prefix": prefix})


def set_key_rate(
    db: SessionOrExecutor, prefix: str, rate_limit: int | None, per: float | None
) -> None:
    """Set (None: remove) the per-key rate limit of keys starting with ``prefix``."""
    ex = executor_for(db)
    params = {"prefix": prefix, "rate_limit": rate_limit, "rate_per": per}
    ex.rows(flow_sql.set_key_override("rate"), params)
    ex.rows(flow_sql.delete_empty_override(), {"prefix": prefix})


def set_queue_rate(
    db: SessionOrExecutor, queue: str, rate_limit: int | None, per: float | None
) -> None:
    """Set (None: remove) the rate limit of ``queue``."""
    params = {"name": queue, "rate_limit": rate_limit, "rate_per": per}
    executor_for(db).rows(flow_sql.set_queue_rate(), params)


def key_overrides(db: SessionOrExecutor) -> list[Any]:
    """``(prefix, key_limit, rate_limit, rate_per)`` of every key override."""
    return list(executor_for(db).rows(flow_sql.key_overrides()))


def recount_keys(db: SessionOrExecutor) -> dict[str, int]:
    """Correct drifted ``running`` counters of concurrency keys (call inside a transaction);
    ``{key: corrected count}``. Keys a claim is using right now are skipped."""
    ex = executor_for(db)
    keys = [row[0] for row in ex.rows(flow_sql.lock_counted_keys())]
    if not keys:
        return {}
    return {key: running for key, running in ex.rows(flow_sql.recount_keys(), {"keys": keys})}


def delete_idle_keys(db: SessionOrExecutor, *, after: str, limit: int) -> tuple[str | None, int]:
    """Delete the idle rows among up to ``limit`` key rows after key ``after`` (call inside a
    transaction); ``(last key read, None when none was left; rows deleted)``."""
    ex = executor_for(db)
    last, keys = ex.rows(maintenance.lock_idle_keys(), {"after": after, "limit": limit})[0]
    if not keys:
        return last, 0
    return last, len(ex.rows(maintenance.delete_idle_keys(), {"keys": list(keys)}))


def queue_controls(session: Session) -> list[Any]:
    """All queue control rows (``QueueControl`` objects of ``session``)."""
    return list(session.scalars(control.queue_controls()))


def record_tick(db: SessionOrExecutor, schedule_name: str, scheduled_at: dt.datetime) -> bool:
    """True when this caller recorded the tick first (and so must enqueue its job); false too
    when a newer tick of the schedule is recorded already. Call inside a transaction: the
    schedule's lock is held until it ends."""
    params = {"tick_name": schedule_name, "tick_at": scheduled_at}
    ex = executor_for(db)
    ex.rows(control.lock_schedule(), {"tick_name": schedule_name})
    return bool(ex.rows(control.record_tick(), params))


def set_tick_job(
    db: SessionOrExecutor, schedule_name: str, scheduled_at: dt.datetime, job_id: int
) -> None:
    """Record the job enqueued for a tick."""
    params = {"tick_name": schedule_name, "tick_at": scheduled_at, "tick_job": job_id}
    executor_for(db).rows(control.set_tick_job(), params)


def last_ticks(db: SessionOrExecutor, names: Sequence[str]) -> dict[str, dt.datetime]:
    """Latest recorded tick per schedule name (schedules never ticked are absent)."""
    rows = executor_for(db).rows(control.last_ticks(), {"names": list(names)})
    return {name: at for name, at in rows}


def database_now(db: SessionOrExecutor) -> dt.datetime:
    """The database clock."""
    value = executor_for(db).rows(control.database_now())[0][0]
    assert isinstance(value, dt.datetime)
    return value


# --- admin: one job, counts, lists, manual actions ------------------------------------------


def get_job(session: Session, job_id: int) -> Job | None:
    """The job ``job_id`` (an ORM object of ``session``), or None."""
    return session.execute(admin.get_job(), {"job_id": job_id}).scalar_one_or_none()


def get_moved_job(session: Session, job_id: int) -> Job | None:
    """Job ``job_id`` from the partitioned history, as a ``Job`` of no session
    (``moved_job``), or None."""
    row = session.execute(admin.get_moved_job(), {"job_id": job_id}).scalar_one_or_none()
    return None if row is None else moved_job(row)


def moved_job(row: JobHistory) -> Job:
    """A moved job as a ``Job`` (transient, in no session), so readers get one type whichever
    table held it. Its ``steps`` are empty: steps are not moved."""
    return Job(**{name: getattr(row, name) for name in JOB_COLUMN_NAMES})


def mark_awaited(db: SessionOrExecutor, job_id: int) -> bool:
    """Mark job ``job_id`` as waited for (its end is then announced); False when it is
    finished, missing or already marked."""
    return bool(executor_for(db).rows(admin.mark_awaited(), {"job_id": job_id}))


def state_counts(db: SessionOrExecutor) -> dict[str, dict[JobState, int]]:
    """``{queue: {state: count}}`` over all jobs."""
    counts: dict[str, dict[JobState, int]] = {}
    for queue, state, count in executor_for(db).rows(admin.job_state_counts()):
        counts.setdefault(queue, {})[JobState(state)] = count
    return counts


def rerun(db: SessionOrExecutor, job_id: int) -> bool:
    """Queue a FAILED or CANCELLED job again; False when it is in no such state."""
    return bool(executor_for(db).rows(admin.rerun(), {"job_id": job_id}))


def cancel_waiting(db: SessionOrExecutor, job_id: int, reason: str) -> bool:
    """Cancel a job that waits (queued, retrying, or waiting on dependencies) and settle its
    dependents; False when it does not wait."""
    ex = executor_for(db)
    rows = ex.rows(admin.cancel_waiting(), {"job_id": job_id, "reason": reason})
    if rows and rows[0][1]:
        dependencies.settle(ex, rows[0][1])
    return bool(rows)


def request_cancel_running(db: SessionOrExecutor, job_id: int) -> bool:
    """Flag a RUNNING job for cancellation; False when it is not running."""
    return bool(executor_for(db).rows(admin.request_cancel_running(), {"job_id": job_id}))


def list_jobs(
    session: Session,
    *,
    queue: str | None = None,
    state: JobState | None = None,
    task_name: str | None = None,
    before: int | None = None,
    after: int | None = None,
    limit: int = 50,
    history: bool = False,
) -> list[Job]:
    """Up to ``limit`` jobs, newest first, matching the filters; ``before``/``after`` (a job id)
    page to older/newer jobs. Returns ORM objects of ``session``; with ``history``, the same
    page of the moved jobs, as ``Job`` objects of no session (``moved_job``)."""
    cursor = "before" if before is not None else "after" if after is not None else None
    params: dict[str, Any] = {"limit": limit}
    params["states"] = [s.value for s in JobState] if state is None else [state.value]
    if queue is not None:
        params["queue"] = queue
        params["queues"] = [queue]
    elif state is not None and task_name is None:
        params["queues"] = job_queues(session, history=history)
    if task_name is not None:
        params["task_name"] = task_name
    if cursor is not None:
        params["cursor"] = before if before is not None else after
    statement = admin.list_jobs(
        by_queue=queue is not None,
        by_state=state is not None,
        by_task=task_name is not None,
        cursor=cursor,
        history=history,
    )
    jobs = [moved_job(row) if history else row for row in session.scalars(statement, params)]
    return jobs[::-1] if cursor == "after" else jobs


def job_queues(db: SessionOrExecutor, *, history: bool = False) -> list[str]:
    """Names of the queues that have jobs, sorted (one index probe per queue); of the moved
    jobs with ``history``."""
    return [row[0] for row in executor_for(db).rows(admin.job_queues(history))]


def capped_state_counts(
    db: SessionOrExecutor, cap: int, *, history: bool = False
) -> dict[str, dict[JobState, int]]:
    """``{queue: {state: count}}`` for every queue with jobs, each count stopping at ``cap``
    (``cap`` means "``cap`` or more"); states without jobs count 0. Of the moved jobs with
    ``history``."""
    counts: dict[str, dict[JobState, int]] = {}
    params = {"states": [s.value for s in JobState], "cap": cap}
    for queue, state, count in executor_for(db).rows(admin.capped_state_counts(history), params):
        counts.setdefault(queue, {})[JobState(state)] = int(count)
    return counts


def oldest_waiting(db: SessionOrExecutor) -> dict[str, tuple[int, dt.datetime, float]]:
    """``{queue: (job_id, run_at, seconds waiting)}`` for the earliest ticket of each queue."""
    rows = executor_for(db).rows(admin.oldest_waiting_per_queue())
    return {row[0]: (row[1], row[2], float(row[3])) for row in rows}


def _series(rows: Iterable[Any], buckets: int) -> dict[str, dict[JobState, list[int]]]:
    """``{queue: {state: [count per bucket]}}`` from ``(queue, state, buckets_ago, count)``
    rows; rows outside ``0 .. buckets - 1`` are left out (the window's far edge by a fraction of
    a second, or a ``finished_at`` ahead of the database's clock)."""
    series: dict[str, dict[JobState, list[int]]] = {}
    for queue, state, buckets_ago, count in rows:
        if 0 <= buckets_ago < buckets:
            by_state = series.setdefault(queue, {})
            by_state.setdefault(JobState(state), [0] * buckets)[buckets_ago] += int(count)
    return series


def finished_per_minute(db: SessionOrExecutor) -> dict[str, dict[JobState, list[int]]]:
    """``{queue: {state: [count per minute]}}`` over the last hour; index 0 is the current
    minute, index 59 an hour ago. Only queues with finished jobs in that hour appear."""
    return _series(executor_for(db).rows(admin.finished_per_minute()), 60)


def finished_per_clock_minute(
    db: SessionOrExecutor, cap: int
) -> dict[str, dict[JobState, list[int]]]:
    """``{queue: {state: [count per minute]}}`` over the last 60 clock minutes, index 0 the
    current one, under the partitioned history: moved jobs from their per-minute counts, the
    live table's finished jobs read up to ``cap``. Only queues with finished jobs appear."""
    return _series(executor_for(db).rows(admin.finished_per_clock_minute(), {"cap": cap}), 60)


def finished_window_edge(
    db: SessionOrExecutor, window: float, cap: int, *, history: bool = False
) -> float | None:
    """Seconds since the ``cap``-th most recently finished job of the last ``window`` seconds
    finished; None when fewer than ``cap`` finished in that window. Of the moved jobs with
    ``history``."""
    params = {"window": float(window), "skip": cap - 1}
    rows = executor_for(db).rows(admin.finished_window_edge(history), params)
    return float(rows[0][0]) if rows else None


def finished_per_bucket(
    db: SessionOrExecutor, width: float, buckets: int, cap: int, *, history: bool = False
) -> dict[str, dict[JobState, list[int]]]:
    """``{queue: {state: [count per bucket]}}`` over the last ``buckets`` x ``width`` seconds,
    counting at most the ``cap`` most recent jobs; index 0 is the newest bucket. Only queues
    with finished jobs in that window appear. Of the moved jobs with ``history``."""
    params = {"window": float(width * buckets), "width": float(width), "cap": cap}
    return _series(executor_for(db).rows(admin.finished_per_bucket(history), params), buckets)


def delete_job(db: SessionOrExecutor, job_id: int) -> bool:
    """Delete a job that is not running (and its ticket), cancelling the jobs that waited on it
    (``dependencies.abandon_orphans``); False when nothing was deleted."""
    ex = executor_for(db)
    rows = ex.rows(admin.delete_job(), {"job_id": job_id})
    if not rows:
        return False
    dependencies.abandon_orphans(ex, [job_id], rows[0][1] or ())
    return True
