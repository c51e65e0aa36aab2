"""Enqueue: inserting jobs and their tickets (plain, keyed, dependent, bounded, or by
``COPY``), over ``db.Executor``; never commits. The statements are ``sql.enqueue``'s.

A job whose unique key is held returns the holder's id; the jobs of a bounded queue go in all or
none (``queue_bounds``); dependent jobs start WAITING or are cancelled (``dependencies``); large
uniform batches are written with ``COPY`` (``copy_rows``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pgqueue.data import copy_rows, dependencies, queue_bounds
from pgqueue.data.history import IN_PLACE, JobTables, moved_states
from pgqueue.data.insert_choice import BoundedQueuesSeen
from pgqueue.db import Executor, SessionOrExecutor, executor_for
from pgqueue.errors import JobNotFound, ValidationError
from pgqueue.jobs import NewJob
from pgqueue.sql import enqueue
from pgqueue.states import JobState


def insert_jobs(
    db: SessionOrExecutor,
    jobs: Sequence[NewJob],
    trace_context: str | None = None,
    bounded: BoundedQueuesSeen | None = None,
    tables: JobTables = IN_PLACE,
) -> list[int]:
    """Insert jobs and their tickets; return ids in input order. ``trace_context`` (JSON
    text, see ``pgqueue.tracing``) is stored with every job. A dependency (``depends_on``) is
    looked for in ``pgqueue_jobs``, then, when ``tables`` include it, in the history: a moved
    job counts by the final state it was moved in.

    A job whose unique key is already held by an active job is not inserted; the existing job's
    id is returned in its place (if that job ended meanwhile, that job alone is inserted again:
    the rest of the batch went in once).

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
    ids: list[int | None] = [None] * len(jobs)
    pending = list(range(len(jobs)))  # the jobs not yet inserted or matched to a holder
    for _ in range(10):
        batch = [jobs[i] for i in pending]
        rows = _insert_rows(
            ex, batch, trace_context, locked, with_keys, tables if with_dependencies else None
        )
        if queue_bounds.stopped_by_bound(ex, batch, rows, locked):
            locked = queue_bounds.lock(ex, batch, seen)
            continue
        if not with_keys:
            return [row[0] for row in rows]
        for index, job_id in zip(pending, _match_unique(ex, batch, rows), strict=True):
            ids[index] = job_id
        pending = [i for i in pending if ids[i] is None]
        if not pending:
            return [job_id for job_id in ids if job_id is not None]
        if with_dependencies:  # pragma: no cover - a key's holder is never a dependent job
            raise RuntimeError("unique-key enqueue with dependencies did not settle")
    raise RuntimeError("enqueue did not settle after 10 tries")  # pragma: no cover


def _insert_rows(
    ex: Executor,
    jobs: Sequence[NewJob],
    trace_context: str | None,
    locked: list[str] | None,
    with_keys: bool,
    dependencies_in: JobTables | None,
) -> Sequence[Any]:
    """One run of ``sql.enqueue.insert_jobs``: plain, or checked against the bounds of the
    ``locked`` queues; its rows (none when a bound stopped it). ``dependencies_in``: where the
    jobs' dependencies are looked for, None when no job has any."""
    params = _insert_params(jobs, trace_context)
    if locked is not None:
        params["locked_queues"] = locked
    keyed = _add_concurrency_keys(jobs, params)
    statement = enqueue.insert_jobs(
        with_keys,
        with_dependencies=dependencies_in is not None,
        traced=trace_context is not None,
        bounded=locked is not None,
        with_concurrency_keys=keyed,
    )
    if dependencies_in is not None:
        return _insert_dependent_jobs(ex, jobs, params, statement, dependencies_in)
    return ex.rows(statement, params)


def one_job_params(job: NewJob) -> dict[str, Any]:
    """The parameters of ``sql.enqueue.insert_one_job`` for ``job`` (without a trace context)."""
    return {
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


def insert_one_job(db: Executor, job: NewJob, trace_context: str | None = None) -> int | None:
    """Insert one job without unique key or dependencies, and its ticket; return its id. None
    when its queue has a bound: nothing was written, and ``insert_jobs`` inserts it (in a
    transaction, which the queue's lock needs)."""
    params = one_job_params(job)
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


def unique_key_holders(db: Executor, keys: Sequence[str]) -> dict[str, tuple[int, int | None]]:
    """``{key: (job id, workflow id or None)}`` of the jobs holding the unique ``keys`` (the
    jobs not ended that have them)."""
    rows = db.rows(enqueue.active_job_ids_by_unique_key(), {"unique_keys": list(keys)})
    return {key: (job_id, workflow_id) for job_id, key, workflow_id in rows}


def _match_unique(ex: Executor, jobs: Sequence[NewJob], rows: Sequence[Any]) -> list[int | None]:
    """Map inserted rows back to inputs, and keys that conflicted to their holders' ids; None
    for a job whose key's holder ended between the insert and the lookup (neither inserted nor
    held: to insert again)."""
    inserted_plain = iter(sorted(row[0] for row in rows if row[1] is None))
    by_key: dict[str, int] = {row[1]: row[0] for row in rows if row[1] is not None}
    missing = [
        j.unique_key for j in jobs if j.unique_key is not None and j.unique_key not in by_key
    ]
    if missing:
        found = ex.rows(enqueue.active_job_ids_by_unique_key(), {"unique_keys": missing})
        by_key.update({key: job_id for job_id, key, _ in found if key is not None})
    return [
        next(inserted_plain) if j.unique_key is None else by_key.get(j.unique_key) for j in jobs
    ]


def _insert_dependent_jobs(
    ex: Executor,
    jobs: Sequence[NewJob],
    params: dict[str, Any],
    statement: Any,
    tables: JobTables,
) -> Sequence[Any]:
    """Insert jobs some of which depend on others (``NewJob.depends_on``) with ``statement``
    (``sql.enqueue.insert_jobs`` with dependencies) and the jobs' ``params``; the insert's rows
    (none when a bound stopped it: see ``insert_jobs``).

    The dependencies are locked first (see ``sql.enqueue.lock_dependencies``) and their states
    read after the lock; each job's state follows ``dependencies.initial_state``, and the
    waiting ones are appended to their unfinished dependencies' ``dependents``. Those not in
    ``pgqueue_jobs`` are looked for in the history (under ``tables``): a moved job has ended
    and never changes, so it needs no lock and takes no dependents. Unique keys are not
    combined with dependencies (the waiting job would hold no key).
    """
    wanted = sorted({d for j in jobs for d in j.depends_on})
    found = {
        job_id: JobState(state)
        for job_id, state in ex.rows(enqueue.lock_dependencies(), {"ids": wanted})
    }
    missing = [d for d in wanted if d not in found]
    if missing:
        found.update(moved_states(ex, missing, tables))
        missing = [d for d in missing if d not in found]
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
