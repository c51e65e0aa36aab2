"""The one writer of jobs (``write``) and the one-row insert (``insert_one_job``), over
``db.Executor``; never commits. The statements are ``sql.enqueue``'s.

Every enqueue of more than one row, with a dependency, with a key or into a bounded queue, and
every workflow, is a ``jobs.Plan``, written in the caller's transaction.

A plan with no parents, roles or dependencies on existing jobs (``enqueue_many``'s) is written
by one statement (``_write_plain``): the unnest ``INSERT`` of its rows and tickets, drawing the
ids; or, before its ``COPY``, the insert of its tickets, drawing the ids. That
statement writes nothing when a queue of the plan has a bound (its guard); the plan then takes
the steps below, as does a plan into a queue the ``BoundedQueuesSeen`` believe bounded. Every
other plan takes them at once:

1. ``allocate``: the plan's ids (and its workflow's), and whether a queue of it has a bound;
2. the bounded queues' room reserved (``_reserve``): their locks, then their depths, or
   ``QueueFull`` with nothing written;
3. the states of the existing jobs it depends on, read under a lock (``_dependency_states``);
4. its rows by one ``INSERT`` over unnested arrays with the tickets of its roots, or, when
   ``insert_choice.copyable``, by one ``COPY`` (``copy_rows``) and then the roots' tickets;
5. the edges to the existing jobs it depends on (``add_dependents``).

Unique keys are settled by one routine (``_insert_keyed``) in one of two modes: the jobs whose
key is held get the holder's id in their place (``enqueue_many``), or the plan is refused whole
(``UniqueKeyHeld``, inside a savepoint: a workflow).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from operator import attrgetter
from typing import Any, NamedTuple

from pgqueue.data import copy_rows, dependencies
from pgqueue.data.history import moved_states
from pgqueue.data.insert_choice import BoundedQueuesSeen, copyable
from pgqueue.db import Executor
from pgqueue.errors import (
    ConfigurationError,
    JobNotFound,
    QueueFull,
    UniqueKeyHeld,
    ValidationError,
)
from pgqueue.jobs import NEW_JOB_COLUMNS, NewJob, Plan
from pgqueue.sql import enqueue, queue_bounds
from pgqueue.states import JobState

_QUEUED, _WAITING = JobState.QUEUED.value, JobState.WAITING.value
_FIELDS = {column: attrgetter(field) for column, field in NEW_JOB_COLUMNS.items()}


class Written(NamedTuple):
    """What ``write`` wrote: the plan's job ids in its order (a held key's holder in place of
    its job), and its workflow's id (None for a plan that is no workflow)."""

    ids: list[int]
    workflow_id: int | None


def write(
    ex: Executor,
    plan: Plan,
    *,
    trace_context: str | None = None,
    refuse_held: bool = False,
    may_copy: bool = False,
    bounded: BoundedQueuesSeen | None = None,
) -> Written:
    """Write ``plan`` (see the module). ``trace_context`` (JSON text, ``pgqueue.tracing``) is
    stored with every job. ``refuse_held``: raise ``UniqueKeyHeld`` when a job's key is held
    (nothing written), instead of returning the holder's id. ``may_copy``: nothing watches the
    statements, so COPY may carry a large plan. ``bounded`` learns which queues are bounded.
    A dependency (``depends_on``) is looked for in ``pgqueue_jobs``, then, when ``ex.tables``
    include it, in the history: a moved job counts by the final state it was moved in."""
    jobs = plan.jobs
    if not jobs:
        return Written([], None)
    if any(j.unique_key is not None and j.depends_on for j in jobs):
        raise ValidationError("a job with depends_on cannot also have a unique_key")
    parents = plan.parents
    roots = [i for i, p in enumerate(parents) if not p] if parents is not None else None
    copy = may_copy and copyable(jobs, roots)
    depends = any(j.depends_on for j in jobs)
    plain = parents is None and plan.roles is None and not depends
    if plain and (bounded is None or not bounded.covers(jobs)):
        written = _write_plain(ex, plan, copy, trace_context, refuse_held)
        if written is not None:
            return Written(written, None)
    queues = sorted({j.queue for j in jobs})
    first = jobs[0]
    allocation = {
        "n": len(jobs),
        "queues": queues,
        "run_at": first.run_at if copy else None,
        "delay": first.delay if copy else None,
    }
    ids, workflow_id, any_bounded, run_at = ex.rows(
        enqueue.allocate(plan.roles is not None), allocation
    )[0]
    ids.sort()  # drawn ascending already: a linear check, unless the server reordered them
    if any_bounded:
        _reserve(ex, jobs, queues, bounded)
    elif bounded is not None and bounded.covers(jobs):
        bounded.record(queues, ())
    found = _dependency_states(ex, jobs) if depends else None
    edges = _edges(ids, plan, found)
    if copy:
        root_ids = ids if roots is None else [ids[i] for i in roots]
        copy_jobs(ex, ids, jobs, edges, plan.roles, workflow_id, run_at, trace_context)
        root = jobs[0 if roots is None else roots[0]]
        shared = {"queue": root.queue, "priority": root.priority, "atomic": root.atomic}
        ex.rows(enqueue.insert_tickets(), {"ids": root_ids, "run_at": run_at, **shared})
        return Written(ids, workflow_id)
    written = _insert(ex, ids, plan, edges, workflow_id, trace_context, refuse_held)
    assert written is not None  # the ids were drawn: no guard in the statement
    if found is not None:
        _add_dependents(ex, ids, jobs, edges, found)
    return Written(written, workflow_id)


def _write_plain(
    ex: Executor, plan: Plan, copy: bool, trace_context: str | None, refuse_held: bool
) -> list[int] | None:
    """Write a plan with no parents, roles or dependencies in one statement (and its ``COPY``
    when ``copy``), its ids drawn there; the ids. None when a queue of it has a bound: that
    statement's guard wrote nothing, and the plan goes the way of ``allocate``."""
    if not copy:
        return _insert(ex, None, plan, None, None, trace_context, refuse_held)
    jobs = plan.jobs
    first = jobs[0]
    allocation = {
        "n": len(jobs),
        "queue": first.queue,
        "priority": first.priority,
        "atomic": first.atomic,
        "run_at": first.run_at,
        "delay": first.delay,
    }
    ids, _, any_bounded, run_at = ex.rows(enqueue.allocate_with_tickets(), allocation)[0]
    if any_bounded:
        return None
    ids.sort()  # drawn ascending already: a linear check, unless the server reordered them
    copy_jobs(ex, ids, jobs, None, None, None, run_at, trace_context)
    return list(ids)


def copy_jobs(
    ex: Executor,
    ids: list[int],
    jobs: Sequence[NewJob],
    edges: dict[str, list[Any]] | None,
    roles: Sequence[int] | None,
    workflow_id: int | None,
    run_at: Any,
    trace_context: str | None,
) -> None:
    """Write the rows of a plan by one ``COPY`` (``copy_rows.lines``), due at ``run_at``."""
    columns, lines = copy_rows.lines(
        ids, jobs, edges, roles, workflow_id, run_at.isoformat(), trace_context
    )
    ex.copy(enqueue.copy_jobs(columns), copy_rows.chunks(lines))


def _insert(
    ex: Executor,
    ids: list[int] | None,
    plan: Plan,
    edges: dict[str, list[Any]] | None,
    workflow_id: int | None,
    trace_context: str | None,
    refuse_held: bool,
) -> list[int] | None:
    """Write the plan's rows and its roots' tickets by ``sql.enqueue.insert_rows``; the ids.
    ``ids`` None (a plan with no parents, roles or dependencies): the statement draws them
    (``drawn``), and None comes back when its guard found a bounded queue (nothing written)."""
    jobs = plan.jobs
    params: dict[str, Any] = {column: list(map(get, jobs)) for column, get in _FIELDS.items()}
    if ids is not None:
        params["id"] = ids
    params["delay"] = [j.delay for j in jobs]
    params["run_at"] = [None if j.run_at is None else j.run_at.isoformat() for j in jobs]
    unique = any(j.unique_key is not None for j in jobs)
    if unique:
        params["unique_key"] = [j.unique_key for j in jobs]
    if edges is not None:
        params.update(edges)
    if plan.roles is not None:
        params["workflow_role"] = list(plan.roles)
        params["workflow_id"] = workflow_id
    if trace_context is not None:
        params["trace_context"] = trace_context
    keyed = any(j.concurrency_key is not None for j in jobs)
    if keyed:
        params["concurrency_keys"] = [j.concurrency_key for j in jobs]
        params["key_limits"] = [j.key_limit for j in jobs]
    traced, workflow = trace_context is not None, plan.roles is not None
    columns = tuple(c for c in _ROW_COLUMNS if c in params)
    statement = enqueue.insert_rows(columns, traced, workflow, keyed, drawn=ids is None)
    if unique:
        # A retry of held keys whose holders ended reuses the ids drawn the first time.
        with_ids = tuple(c for c in _ROW_COLUMNS if c in params or c == "id")
        then = enqueue.insert_rows(with_ids, traced, workflow, keyed)
        return _insert_keyed(ex, statement, then, params, jobs, ids, refuse_held)
    if ids is not None:
        ex.rows(statement, params)
        return ids
    drawn: list[int] = ex.rows(statement, params)[0][0]
    if not drawn:
        return None
    drawn.sort()  # drawn ascending, in the plan's order: a linear check
    return drawn


_ROW_COLUMNS = (*enqueue.JOB_COLUMNS, *enqueue.PLAN_COLUMNS)


def _insert_keyed(
    ex: Executor,
    statement: Any,
    then: Any,
    params: dict[str, Any],
    jobs: Sequence[NewJob],
    ids: list[int] | None,
    refuse_held: bool,
) -> list[int] | None:
    """Run the insert ``statement`` of rows some of which have a unique key; the ids, a held
    key's holder in place of its job. ``refuse_held``: inside a savepoint, rolled back when a
    key was held, and ``UniqueKeyHeld`` names the holder. A holder that ended between the
    insert and its lookup is no holder: its jobs are inserted again (the others went in once)
    by ``then``, which binds ``id``. ``ids`` None: ``statement`` draws them (``drawn``), and
    None comes back when its guard found a bounded queue (nothing written)."""
    result = [] if ids is None else list(ids)
    pending = list(range(len(jobs)))
    batch = params
    for _ in range(10):
        if refuse_held:
            ex.rows(enqueue.savepoint())
        rows = ex.rows(statement, batch)
        if ids is None:
            drawn, new = rows[0]
            if not drawn:
                if refuse_held:
                    ex.rows(enqueue.release_savepoint())
                return None
            ids = sorted(drawn)  # drawn ascending, in the plan's order
            result = list(ids)
            params = batch = {**params, "id": ids}
            statement = then
            inserted = set(new)
        else:
            inserted = {row[0] for row in rows}
        skipped = [i for i in pending if ids[i] not in inserted]
        if refuse_held:
            if skipped:
                ex.rows(enqueue.rollback_to_savepoint())
            ex.rows(enqueue.release_savepoint())
        if not skipped:
            return result
        keys = [jobs[i].unique_key or "" for i in skipped]
        holders = unique_key_holders(ex, keys)
        if refuse_held:
            for key in keys:
                if key in holders:
                    raise UniqueKeyHeld(key, *holders[key])
            continue  # every holder ended meanwhile: the whole plan again
        for index, key in zip(skipped, keys, strict=True):
            if key in holders:
                result[index] = holders[key][0]
        pending = [i for i, key in zip(skipped, keys, strict=True) if key not in holders]
        if not pending:
            return result
        batch = {
            name: [value[i] for i in pending] if isinstance(value, list) else value
            for name, value in params.items()
        }
    raise RuntimeError("enqueue did not settle after 10 tries")  # pragma: no cover


def unique_key_holders(db: Executor, keys: Sequence[str]) -> dict[str, tuple[int, int | None]]:
    """``{key: (job id, workflow id or None)}`` of the jobs holding the unique ``keys`` (the
    jobs not ended that have them)."""
    rows = db.rows(enqueue.active_job_ids_by_unique_key(), {"unique_keys": list(keys)})
    return {key: (job_id, workflow_id) for job_id, key, workflow_id in rows}


def _reserve(
    ex: Executor, jobs: Sequence[NewJob], queues: list[str], seen: BoundedQueuesSeen | None
) -> None:
    """Take the locks of the bounded ones of ``queues`` (held to the end of the transaction),
    then count their waiting jobs: ``QueueFull`` when one has no room for the plan's jobs of it
    (nothing written yet). Refuses REPEATABLE READ, whose snapshot would hide the jobs that the
    lock's previous holders committed."""
    rows = ex.rows(queue_bounds.lock_bounded_queues(), {"queues": queues})
    locked = [row[0] for row in rows]
    if seen is not None:
        seen.record(queues, locked)
    if not rows:
        return
    if rows[0][2] == "repeatable read":
        raise ConfigurationError(
            f"queue {locked[0]!r} is bounded: enqueue into it in a READ COMMITTED or "
            "SERIALIZABLE transaction (under REPEATABLE READ its depth cannot be counted exactly)"
        )
    asked = Counter(job.queue for job in jobs)
    for name, max_depth, depth in ex.rows(queue_bounds.queue_depths(), {"queues": locked}):
        if depth + asked[name] > max_depth:
            raise QueueFull(name, max_depth, depth, asked[name])


def _dependency_states(ex: Executor, jobs: Sequence[NewJob]) -> dict[int, JobState]:
    """The states of the existing jobs that ``jobs`` depend on, locked first (see
    ``sql.enqueue.lock_dependencies``). Those not in ``pgqueue_jobs`` are looked for in the
    history (under ``ex.tables``): a moved job has ended and never changes, so it needs no lock
    and takes no dependents."""
    wanted = sorted({d for j in jobs for d in j.depends_on})
    found = {
        job_id: JobState(state)
        for job_id, state in ex.rows(enqueue.lock_dependencies(), {"ids": wanted})
    }
    missing = [d for d in wanted if d not in found]
    if missing:
        found.update(moved_states(ex, missing))
        missing = [d for d in missing if d not in found]
    if missing:
        raise JobNotFound(f"depends_on names jobs that do not exist: {missing}")
    return found


def _edges(
    ids: Sequence[int], plan: Plan, found: dict[int, JobState] | None
) -> dict[str, list[Any]] | None:
    """The rows' ``state``, ``depends_on`` (array literals) and, as needed, ``last_error``
    (why a job is cancelled at once), ``dependents`` and ``pending_dependencies`` (the parents
    a workflow job counts down); None for a plan with no dependency. A job waits for its
    parents in the plan; on existing jobs, it follows ``dependencies.initial_state``."""
    parents = plan.parents
    if parents is None and found is None:
        return None
    jobs = plan.jobs
    states: list[str] = []
    depends_on: list[str | None] = []
    edges: dict[str, list[Any]] = {"state": states, "depends_on": depends_on}
    if found is not None:
        reasons: list[str | None] = edges.setdefault("last_error", [])
        for job in jobs:
            state, reason = dependencies.initial_state({d: found[d] for d in job.depends_on})
            states.append(state.value)
            reasons.append(reason)
            depends_on.append(dependencies.array_text(job.depends_on))
    if parents is None:
        return edges
    if found is None:
        states.extend(_WAITING if p else _QUEUED for p in parents)
        depends_on.extend(
            dependencies.array_text([ids[i] for i in p]) if p else None for p in parents
        )
    else:
        for index, its_parents in enumerate(parents):
            if its_parents:
                if states[index] == _QUEUED:
                    states[index] = _WAITING
                own = jobs[index].depends_on
                depends_on[index] = dependencies.array_text(
                    [*own, *map(ids.__getitem__, its_parents)]
                )
    edges["dependents"] = _dependents(ids, parents)
    if plan.roles is not None:
        edges["pending_dependencies"] = [len(p) if p else None for p in parents]
    return edges


def _dependents(ids: Sequence[int], parents: Sequence[tuple[int, ...]]) -> list[str | None]:
    """Each job's ``dependents`` (array literal, or None): the ids of the jobs it is a parent
    of. Most jobs of a large workflow have one child (a group's members: the closing marker),
    so one is kept as an int and a list made only for a second; a group of 10,000 allocates
    no list per member."""
    first: list[int | None] = [None] * len(ids)
    more: dict[int, list[int]] = {}
    for child, its_parents in enumerate(parents):
        child_id = ids[child]
        for parent in its_parents:
            if first[parent] is None:
                first[parent] = child_id
            elif parent in more:
                more[parent].append(child_id)
            else:
                more[parent] = [child_id]
    # A group's members all have the one child: its text is made once.
    single: dict[int, str] = {}
    return [
        None
        if only is None
        else dependencies.array_text([only, *more[index]])
        if index in more
        else single.get(only) or single.setdefault(only, "{" + str(only) + "}")
        for index, only in enumerate(first)
    ]


def _add_dependents(
    ex: Executor,
    ids: Sequence[int],
    jobs: Sequence[NewJob],
    edges: dict[str, list[Any]] | None,
    found: dict[int, JobState],
) -> None:
    """Append the plan's waiting jobs to the ``dependents`` of the existing jobs they wait for
    (those not SUCCEEDED yet), so that those jobs' outcomes settle them."""
    states = edges["state"] if edges is not None else ()
    pairs = [
        (dependency, job_id)
        for job_id, job, state in zip(ids, jobs, states, strict=True)
        if state == _WAITING
        for dependency in job.depends_on
        if found[dependency] is not JobState.SUCCEEDED
    ]
    if pairs:
        ex.rows(
            enqueue.add_dependents(),
            {"dependency_ids": [d for d, _ in pairs], "dependent_ids": [j for _, j in pairs]},
        )


def one_job_params(job: NewJob) -> dict[str, Any]:
    """The parameters of ``sql.enqueue.insert_one_job`` for ``job`` (without a trace context)."""
    params = {column: get(job) for column, get in _FIELDS.items()}
    params["delay"] = job.delay
    params["run_at"] = job.run_at
    return params


def insert_one_job(db: Executor, job: NewJob, trace_context: str | None = None) -> int | None:
    """Insert one job without key or dependencies, and its ticket; return its id. None when its
    queue has a bound: nothing was written, and the job goes in as a plan (in a transaction,
    which the queue's lock needs)."""
    params = one_job_params(job)
    if trace_context is not None:
        params["trace_context"] = trace_context
    rows = db.rows(enqueue.insert_one_job(trace_context is not None), params)
    return int(rows[0][0]) if rows else None


def set_queue_max_depth(db: Executor, name: str, max_depth: int | None) -> None:
    """Set (or, with None, remove) queue ``name``'s bound."""
    db.rows(queue_bounds.set_max_depth(), {"name": name, "max_depth": max_depth})
