"""Statements of the dashboard's job lists (``PgQueue.admin``, the CLIs, the Flask dashboard): the
queues that have jobs, each queue's jobs counted per state up to a cap, and one page of jobs
under a filter, newest first; for ``pgqueue_jobs`` or the moved jobs of the partitioned history.
Each reads a bounded part of an index however long the history: the ``(queue, state, id)`` and
``(task_name, state, id)`` indexes for jobs that are not running, the lease index for those
that are (``sql.common.listed_by_state``, ``running``).
"""

from __future__ import annotations

from functools import cache
from typing import Any, Final

from sqlalchemy import (
    BigInteger,
    ColumnElement,
    Integer,
    Select,
    Text,
    and_,
    bindparam,
    case,
    func,
    literal,
    literal_column,
    select,
    true,
    tuple_,
    union,
    union_all,
)

from pgqueue.models import Job, JobHistory
from pgqueue.sql.common import array_param, listed_by_state, running


def job_model(history: bool) -> Any:
    """``Job``, or ``JobHistory`` for the statements that read moved jobs (same columns). The
    statements that serve both bind it to a local ``Job``, so their text is the same for both
    and unchanged for ``pgqueue_jobs``."""
    return JobHistory if history else Job


_MAX_ID: Final = 2**63 - 1


def _one_state(value: ColumnElement[Any], state: Any = Job.state) -> ColumnElement[bool]:
    """``state = value``, written as a range of one value so the planner reads the newest ids of
    a ``(queue, state)`` or ``(task_name, state)`` pair off its index.

    Compared to a value it cannot see (an outer column of a lateral walk, or a generic plan's
    parameter), ``state = x`` is estimated at the average frequency of a state; the planner
    then walks the primary key backwards filtering rows, expecting a match every few rows, and
    for a rare pair reads the whole history. With a range, ``ORDER BY state, id`` is an order
    only the composite index gives, and any other plan must sort every match first."""
    return and_(state >= value, state <= value)


def _distinct_queues(history: bool = False, running_queues: Any = None) -> Any:  # a CTE
    """The queue names present in ``pgqueue_jobs``, by a loose index scan: one index probe per
    queue on the ``(queue, state, id)`` index (``min(queue) WHERE queue > previous``), never a
    pass over the history. That index leaves running jobs out, so the queues of the running
    jobs (read off the lease index: as many jobs as the workers' slots; or the ``queue`` column
    of ``running_queues``, a statement's own read of them) are added.
    ``history``: in ``pgqueue_job_history`` instead (its own ``(queue, state, id)`` index, and
    no running job)."""
    Job = job_model(history)
    listed = listed_by_state(Job)
    smallest = (
        select(func.min(Job.queue).label("queue"))
        .where(listed)
        .cte("history_queues" if history else "job_queues", recursive=True)
    )
    following = (
        select(
            select(func.min(Job.queue))
            .where(Job.queue > smallest.c.queue, listed)
            .scalar_subquery()
            .label("queue")
        )
        .select_from(smallest)
        .where(smallest.c.queue.is_not(None))
    )
    walked = smallest.union_all(following)
    if history:
        return walked
    of_running = (
        select(Job.queue).where(running())
        if running_queues is None
        else select(running_queues.c.queue)
    )
    with_running = union(select(walked.c.queue), of_running)
    return with_running.cte("queues_with_jobs")


@cache
def job_queues(history: bool = False) -> Select[str]:
    """Names of the queues that have jobs, sorted by code point (the dashboard's queue filter);
    of the moved jobs with ``history``."""
    queues = _distinct_queues(history)
    # By code point, as Python sorts the names the dashboard merges with these, whatever the
    # database's collation: under en_US.UTF-8, "[/x]" would sort after "bulk".
    by_code_point = queues.c.queue.collate("C")
    return select(queues.c.queue).where(queues.c.queue.is_not(None)).order_by(by_code_point)


@cache
def capped_state_counts(history: bool = False) -> Select[str, str, int]:
    """``(queue, state, count)`` for every queue with jobs and every state in ``states`` (an
    array), each count stopping at ``cap``: a count of ``cap`` means "at least ``cap``".

    Each count reads at most ``cap`` entries of the ``(queue, state, id)`` index, so the
    overview costs the same with a long history as with a short one. The state is bounded as
    a row range, ``(state, id)`` from ``(s, 0)`` to ``(s, max)``, and read in that order: the
    planner estimates such a range at a good share of the queue, so it stops a walk of the
    index at the cap instead of collecting every match of the pair (a bitmap scan) or sorting
    the primary key's walk (see ``_one_state`` for why plain equality does not do). Running
    jobs, which that index leaves out, are counted per queue off the lease index.
    ``history``: the same over ``pgqueue_job_history``."""
    Job = job_model(history)
    cap = bindparam("cap", type_=Integer)
    # Running jobs are not in that index: counted per queue in one pass over the lease index's
    # entries, read once (MATERIALIZED) though both the queue list and each queue's count use it.
    running_per_queue = (
        None
        if history
        else select(Job.queue, func.least(func.count(), cap).label("count"))
        .where(running(Job))
        .group_by(Job.queue)
        .cte("running_per_queue")
        .prefix_with("MATERIALIZED")
    )
    queues = _distinct_queues(history, running_per_queue)
    states = (
        func.unnest(array_param("states", Text)).table_valued("state").render_derived(name="states")
    )
    hits = (
        select(literal(1).label("hit"))
        .where(
            Job.queue == queues.c.queue,
            tuple_(Job.state, Job.id) >= tuple_(states.c.state, literal(0, BigInteger)),
            tuple_(Job.state, Job.id) <= tuple_(states.c.state, literal(_MAX_ID, BigInteger)),
            listed_by_state(Job),
        )
        .order_by(Job.state, Job.id)
        .limit(cap)
        .correlate(queues, states)
        .subquery("hits")
    )
    counted: ColumnElement[Any] = select(func.count()).select_from(hits).scalar_subquery()
    if running_per_queue is not None:
        running_count = (
            select(running_per_queue.c.count)
            .where(running_per_queue.c.queue == queues.c.queue)
            .correlate(queues)
            .scalar_subquery()
        )
        counted = case(
            (states.c.state == literal_column("'running'"), func.coalesce(running_count, 0)),
            else_=counted,
        )
    return (
        select(queues.c.queue, states.c.state, counted.label("count"))
        .select_from(queues)
        .join(states, true())
        .where(queues.c.queue.is_not(None))
    )


@cache
def list_jobs(
    *, by_queue: bool, by_state: bool, by_task: bool, cursor: str | None, history: bool = False
) -> Select[Any]:
    """One page of jobs, newest first, optionally filtered.

    Binds ``limit``; ``cursor`` (a job id) when ``cursor`` is ``"before"`` (older jobs:
    ``id < cursor``, newest first) or ``"after"`` (newer jobs: ``id > cursor``, oldest first so
    the page nearest the cursor comes back; the caller reverses it). Keyset paging walks an
    index in id order, so deep pages stay cheap.

    Unfiltered, the page walks the primary key. Filtered, it is the merge of one short walk per
    ``(queue, state)`` pair (``queues`` and ``states`` arrays: the chosen ones, or all of them)
    on the ``(queue, state, id)`` index, or per state on ``(task_name, state, id)`` when a task
    is chosen (binds ``task_name``, and ``queue`` with it). Each walk stops after ``limit`` ids,
    so a filter matching few of many finished jobs never scans the history for them. Those
    indexes leave running jobs out; when ``running`` is among the states, the running jobs
    that match come from the lease index.

    ``history``: the same page of ``pgqueue_job_history`` (its rows are ``JobHistory``).
    """
    Job = job_model(history)
    position = bindparam("cursor", type_=BigInteger)
    newer = cursor == "after"
    order = Job.id.asc() if newer else Job.id.desc()
    limit = bindparam("limit", type_=Integer)

    def paged(stmt: Select[Any], *keys: Any, ident: Any = Job.id) -> Select[Any]:
        if cursor == "before":
            stmt = stmt.where(ident < position)
        elif cursor == "after":
            stmt = stmt.where(ident > position)
        order_by = [k.asc() if newer else k.desc() for k in keys]
        return stmt.order_by(*order_by, ident.asc() if newer else ident.desc()).limit(limit)

    if not (by_queue or by_state or by_task):
        return paged(select(Job))
    states = (
        func.unnest(array_param("states", Text)).table_valued("state").render_derived(name="states")
    )
    if by_task:
        chosen = [Job.task_name == bindparam("task_name", type_=Text)]
        if by_queue:
            # ``queue || ''``: the same test, but not one the ``(queue, state, id)`` index can
            # serve, so a generic plan cannot walk a busy queue's whole index looking for a
            # rare task; it walks the task's index and checks the queue of each match.
            chosen.append(Job.queue.concat("") == bindparam("queue", type_=Text))
        walk = select(Job.id).where(
            *chosen, _one_state(states.c.state, Job.state), listed_by_state(Job)
        )
        ids = paged(walk, Job.state).lateral("walk")
        merged = select(ids.c.id).select_from(states).join(ids, true())
    else:
        queues = (
            func.unnest(array_param("queues", Text))
            .table_valued("queue")
            .render_derived(name="queues")
        )
        walk = select(Job.id).where(
            Job.queue == queues.c.queue,
            _one_state(states.c.state, Job.state),
            listed_by_state(Job),
        )
        ids = paged(walk, Job.state).lateral("walk")
        merged = select(ids.c.id).select_from(queues).join(states, true()).join(ids, true())
        chosen = [Job.queue == func.any(array_param("queues", Text))]
    if not history:
        # The running jobs, which the walked indexes leave out: all of those that match, off
        # the lease index (as many as the workers' slots), when the chosen states name them;
        # then paged. Materialized, so the page's order cannot be taken from the primary key:
        # a backward walk of it, filtering for a queue's running jobs where statistics promise
        # one every few hundred rows, reads the whole history when that queue has none.
        asked = literal_column("'running'") == func.any(array_param("states", Text))
        running_jobs = (
            select(Job.id.label("id"))
            .where(*chosen, running(), asked)
            .cte("running_jobs")
            .prefix_with("MATERIALIZED")
        )
        running_ids = paged(select(running_jobs.c.id), ident=running_jobs.c.id)
        both = union_all(merged, running_ids).subquery("merged")
    else:
        both = merged.subquery("merged")
    merged_order = both.c.id.asc() if cursor == "after" else both.c.id.desc()
    page = select(both.c.id).order_by(merged_order).limit(limit).subquery("page")
    return select(Job).join(page, Job.id == page.c.id).order_by(order)
