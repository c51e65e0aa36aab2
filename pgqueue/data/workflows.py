"""Workflows (``sql.workflows``): inserting one whole, reading it, cancelling it; over
``db.Executor``, never committing.

A workflow is inserted in three statements however many jobs it has: its ids are drawn, then
its jobs go in with their edges on both sides (``depends_on`` and ``dependents``), their
countdowns and roles, and tickets for those with no parent, then its row. A closing marker
(a job that never runs) depends on every member: it is settled when the last of them ended,
and closes the workflow in that transaction (``dependencies.settle``).

Members with a ``unique_key`` hold it from the enqueue on, while they wait too (the unique
index covers WAITING jobs). Such a workflow is inserted inside a savepoint, skipping keyed jobs
whose key is held (``ON CONFLICT DO NOTHING``): when one was skipped, everything since the
savepoint is rolled back and ``UniqueKeyHeld`` names the holder, so the workflow is enqueued
whole or not at all, and a caller's transaction stays usable. A concurrent enqueue of the same
key waits for this transaction and then finds the key held (or free, if it rolled back).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from pgqueue.data import copy_rows, dependencies, enqueue, queue_bounds
from pgqueue.data.history import JobTables
from pgqueue.data.insert_choice import COPY_THRESHOLD, BoundedQueuesSeen
from pgqueue.db import Executor, SessionOrExecutor, executor_for
from pgqueue.errors import QueueFull, UniqueKeyHeld, ValidationError
from pgqueue.jobs import InsertedWorkflow, NewJob, WorkflowPlan
from pgqueue.sql import workflow_inserts, workflows
from pgqueue.states import JobState, WorkflowRole

# The closing marker's task name: it never runs, so no task has this name.
CLOSING_TASK = "pgqueue.workflow"


@dataclass(frozen=True, slots=True)
class WorkflowRow:
    """A workflow's row and the rows of its jobs, as read in one snapshot."""

    id: int
    state: str
    created_at: Any
    finished_at: Any
    final_job_ids: list[int]
    closing_job_id: int
    on_failure_job_id: int | None
    job_count: int
    jobs: list[tuple[int, str, JobState, int | None, list[int] | None]]
    final_results: list[tuple[int, JobState, Any]]


def insert_workflow(
    db: SessionOrExecutor,
    plan: WorkflowPlan,
    *,
    may_copy: bool = False,
    trace_context: str | None = None,
) -> InsertedWorkflow:
    """Insert ``plan``'s jobs, its closing marker and its row (see the module). ``may_copy``:
    a large workflow whose jobs share their ``run_at``, and whose first jobs their queue,
    priority and atomic flag, and that has no concurrency key and no unique key, is written
    with ``COPY``. ``trace_context`` (JSON text): the enqueuing span's context, stored with
    every job. Raises ``UniqueKeyHeld`` (nothing written) when a member's key is held."""
    ex = executor_for(db)
    members = [i for i in range(len(plan.jobs)) if i != plan.on_failure]
    first = plan.jobs[0]
    jobs: list[NewJob] = [
        *plan.jobs,
        NewJob(CLOSING_TASK, first.queue, "[]", "{}", first.priority, 1, None, None, None, False),
    ]
    count = len(jobs)
    closing = count - 1
    parents: list[tuple[int, ...]] = [*plan.parents, tuple(members)]
    if plan.on_failure is not None:
        parents[plan.on_failure] = (closing,)
    roots = [i for i, p in enumerate(parents) if not p]
    copy = may_copy and count >= COPY_THRESHOLD and _copyable(jobs, roots)
    allocation = {
        "n": count,
        "queues": sorted({j.queue for j in jobs}),
        "run_at": first.run_at if copy else None,
        "delay": first.delay if copy else None,
    }
    ids, workflow_id, bounded, run_at = ex.rows(workflow_inserts.allocate_ids(), allocation)[0]
    if bounded:
        _reserve_room(ex, jobs)
    ids = sorted(ids)
    dependents = _dependents(ids, parents)
    roles = [*plan.roles, WorkflowRole.CLOSING.value]
    if copy:
        lines = copy_rows.workflow_lines(
            ids, jobs, parents, dependents, roles, run_at.isoformat(), workflow_id, trace_context
        )
        root_ids = [ids[i] for i in roots]
        _copy_jobs(ex, lines, run_at, root_ids, jobs[roots[0]], trace_context is not None)
    else:
        columns: dict[str, list[Any]] = {
            "ids": ids,
            "task_names": [j.task_name for j in jobs],
            "queues": [j.queue for j in jobs],
            "args": [j.args_json for j in jobs],
            "kwargs": [j.kwargs_json for j in jobs],
            "priorities": [j.priority for j in jobs],
            "max_attempts": [j.max_attempts for j in jobs],
            "atomics": [j.atomic for j in jobs],
            "states": [(JobState.WAITING if p else JobState.QUEUED).value for p in parents],
            "depends_ons": [
                dependencies.array_text([ids[i] for i in p]) if p else None for p in parents
            ],
            "dependents": dependents,
            "pendings": [len(p) if p else None for p in parents],
            "roles": roles,
        }
        _insert_jobs(ex, jobs, columns, workflow_id, trace_context, room_reserved=bool(bounded))
    ex.rows(
        workflow_inserts.insert_workflow(),
        {
            "id": workflow_id,
            "final_job_ids": [ids[i] for i in plan.final],
            "closing_job_id": ids[closing],
            "on_failure_job_id": None if plan.on_failure is None else ids[plan.on_failure],
            "job_count": len(members),
        },
    )
    return InsertedWorkflow(workflow_id, tuple(ids))


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


def _reserve_room(ex: Executor, jobs: Sequence[NewJob]) -> None:
    """Take the locks of the workflow's bounded queues (as a checked enqueue does, to the end
    of the transaction) and raise ``QueueFull`` when one has no room for all the workflow's
    jobs it would hold: waiting members count toward a queue's depth like queued ones, and so
    does the closing marker, in the first job's queue."""
    locked = queue_bounds.lock(ex, jobs, BoundedQueuesSeen())
    asked = Counter(job.queue for job in jobs)
    for name, (max_depth, depth) in queue_bounds.depths(ex, locked).items():
        if depth + asked[name] > max_depth:
            raise QueueFull(name, max_depth, depth, asked[name])


def _copyable(jobs: Sequence[NewJob], roots: Sequence[int]) -> bool:
    """Whether ``jobs`` share their ``run_at``/``delay``, the ``roots`` their queue, priority
    and atomic flag, and none has a concurrency key or a unique key (``COPY`` has no ``ON
    CONFLICT``): then one ``COPY`` and one ticket insert of shared values write them."""
    first, root = jobs[0], jobs[roots[0]]
    queue, priority, atomic = root.queue, root.priority, root.atomic
    return all(
        j.concurrency_key is None
        and j.unique_key is None
        and j.delay == first.delay
        and j.run_at == first.run_at
        for j in jobs
    ) and all(
        j.queue == queue and j.priority == priority and j.atomic is atomic
        for j in map(jobs.__getitem__, roots)
    )


def _copy_jobs(
    ex: Executor,
    lines: Iterable[str],
    run_at: Any,
    root_ids: list[int],
    root: NewJob,
    traced: bool,
) -> None:
    """Write the jobs' COPY ``lines`` (``copy_rows.workflow_lines``), then the tickets of the
    ``root_ids``."""
    ex.copy(workflow_inserts.copy_jobs(traced), copy_rows.chunks(lines))
    ex.rows(
        workflow_inserts.insert_tickets(),
        {
            "ids": root_ids,
            "queue": root.queue,
            "priority": root.priority,
            "run_at": run_at,
            "atomic": root.atomic,
        },
    )


def _insert_jobs(
    ex: Executor,
    jobs: Sequence[NewJob],
    columns: dict[str, list[Any]],
    workflow_id: int,
    trace_context: str | None,
    *,
    room_reserved: bool,
) -> None:
    """Write the jobs and their first jobs' tickets in one ``INSERT`` over unnested arrays;
    with unique keys, inside a savepoint (see the module)."""
    params: dict[str, Any] = {
        **columns,
        "delays": [j.delay for j in jobs],
        "run_ats": [None if j.run_at is None else j.run_at.isoformat() for j in jobs],
        "workflow_id": workflow_id,
    }
    if trace_context is not None:
        params["trace_context"] = trace_context
    keyed = any(j.concurrency_key is not None for j in jobs)
    if keyed:
        params["concurrency_keys"] = [j.concurrency_key for j in jobs]
        params["key_limits"] = [j.key_limit for j in jobs]
    traced = trace_context is not None
    unique = any(j.unique_key is not None for j in jobs)
    statement = workflow_inserts.insert_jobs(keyed, room_reserved, traced, unique)
    if not unique:
        inserted = ex.rows(statement, params)
    else:
        params["unique_keys"] = [j.unique_key for j in jobs]
        inserted = _insert_keyed_jobs(ex, jobs, params, statement)
    if len(inserted) != len(jobs):  # pragma: no cover - a bound set since allocate_ids
        raise ValidationError(
            "a queue of the workflow got a max_depth while it was enqueued: enqueue it again"
        )


def _insert_keyed_jobs(
    ex: Executor, jobs: Sequence[NewJob], params: dict[str, Any], statement: Any
) -> Sequence[Any]:
    """Run the insert ``statement`` of jobs some of which have a unique key inside a savepoint;
    its rows when every job went in (or none did: a bound). When a keyed job was skipped, roll
    back to the savepoint and raise ``UniqueKeyHeld`` naming its key's holder; when that holder
    ended in between, insert again."""
    for _ in range(10):
        ex.rows(workflow_inserts.savepoint())
        inserted = ex.rows(statement, params)
        if len(inserted) == len(jobs) or not inserted:
            ex.rows(workflow_inserts.release_savepoint())
            return inserted
        ex.rows(workflow_inserts.rollback_to_savepoint())
        ex.rows(workflow_inserts.release_savepoint())
        returned = {row[0] for row in inserted}
        skipped: list[str] = [
            j.unique_key
            for job_id, j in zip(params["ids"], jobs, strict=True)
            if job_id not in returned and j.unique_key is not None
        ]
        holders = enqueue.unique_key_holders(ex, skipped)
        for key in skipped:
            if key in holders:
                raise UniqueKeyHeld(key, *holders[key])
    raise RuntimeError("workflow enqueue did not settle after 10 tries")  # pragma: no cover


def read_workflow(db: SessionOrExecutor, workflow_id: int, tables: JobTables) -> WorkflowRow | None:
    """Workflow ``workflow_id`` with its jobs and the results of its final jobs, or None.
    Its final jobs are read from every table of ``tables``: once the workflow has ended they
    are moved like any other finished job, and its result is still theirs. Its jobs are listed
    from ``pgqueue_jobs`` alone (the history has no index on their workflow)."""
    ex = executor_for(db)
    rows = ex.rows(workflows.workflow_row(), {"workflow": workflow_id})
    if not rows:
        return None
    state, created, finished, final, closing, on_failure, job_count = rows[0]
    jobs = [
        (row[0], row[1], JobState(row[2]), row[3], row[4])
        for row in ex.rows(workflows.workflow_jobs(), {"workflow": workflow_id})
    ]
    by_id: dict[int, Any] = {}
    for moved in tables.reads:  # the live table first: a job moved in between is not missed
        missing = [job_id for job_id in final if job_id not in by_id]
        if missing:
            by_id.update(
                (row[0], row) for row in ex.rows(workflows.results_of(moved), {"ids": missing})
            )
    results = [
        (job_id, JobState(by_id[job_id][1]), by_id[job_id][2])
        for job_id in final
        if job_id in by_id
    ]
    return WorkflowRow(
        workflow_id,
        state,
        created,
        finished,
        list(final),
        closing,
        on_failure,
        job_count,
        jobs,
        results,
    )


def cancel_workflow(db: SessionOrExecutor, workflow_id: int) -> bool:
    """Cancel workflow ``workflow_id``: its row -> cancelled, its jobs that wait cancelled
    (what depends on them counted down and settled), its running jobs flagged. False when it
    was not running."""
    ex = executor_for(db)
    if not ex.rows(workflows.mark_cancelled(), {"workflow": workflow_id}):
        return False
    dependents = ex.rows(workflows.cancel_waiting_jobs(), {"workflow": workflow_id})[0][0]
    if dependents:
        dependencies.settle(ex, dependents)
    ex.rows(workflows.flag_running_jobs(), {"workflow": workflow_id})
    return True


WORKFLOW_STATES = ("running", "succeeded", "failed", "cancelled")


def state_counts(db: SessionOrExecutor, cap: int) -> dict[str, int]:
    """How many workflows are in each state, each count stopping at ``cap``."""
    rows = executor_for(db).rows(
        workflows.state_counts(), {"states": list(WORKFLOW_STATES), "cap": cap}
    )
    return {state: int(count) for state, count in rows}
