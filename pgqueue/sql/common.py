"""Fragments the statements of ``pgqueue.sql`` share: bind helpers, the guard on a transition's
source states, the ticket-and-wake-up CTEs, the announcement of ended jobs (for waiters), queue
and key slot release, and the columns a claim returns.

Statements moving jobs out of RUNNING give their queue and concurrency-key slots back in the
same statement (``free_slots``). Statements that end jobs return the ended jobs' ``dependents``; the
data layer settles those (``sql.dependencies.settle_dependents``) in a follow-up statement, not a
CTE: a dependent enqueued while the outcome statement waited for the dependency's row lock is
invisible to that statement's snapshot, but visible to the next statement's.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Final

from sqlalchemy import (
    JSON,
    BigInteger,
    ColumnElement,
    Integer,
    Select,
    Text,
    and_,
    bindparam,
    case,
    cast,
    func,
    insert,
    literal,
    literal_column,
    null,
    or_,
    select,
    update,
)
from sqlalchemy.dialects.postgresql import ARRAY, BIT

from pgqueue.models import ConcurrencyKey, Job, MessageQueue, QueueControl, Workflow
from pgqueue.states import JobState, Transition, WorkflowRole

NOTIFY_CHANNEL: Final = "pgqueue"
# Where the statements that end jobs announce them, for ``pgq.wait_for``; apart from
# ``NOTIFY_CHANNEL`` so that workers are never woken by jobs finishing.
FINISHED_CHANNEL: Final = "pgqueue_finished"
# A NOTIFY payload must be shorter than 8000 bytes: ended jobs whose ids do not fit in one
# (about 800 ids of seven digits) are announced as ``ALL_FINISHED``.
MAX_PAYLOAD_BYTES: Final = 7999
ALL_FINISHED: Final = "*"
# Written out: an interval constant has no SQLAlchemy construct that renders as a constant (a
# bound ``timedelta`` would be a parameter, and change the statements' text and plans).
_ONE_SECOND: ColumnElement[Any] = literal_column("interval '1 second'")


def seconds(value: ColumnElement[Any]) -> ColumnElement[Any]:
    """``value`` seconds as an interval."""
    return value * _ONE_SECOND


def not_a_closing_marker() -> ColumnElement[bool]:
    """The job is not a workflow's closing marker (``WorkflowRole.CLOSING``): a row that never
    runs and ends its workflow when the workflow's jobs end, so an operator's cancel, retry or
    delete of one job, or of the jobs a filter chooses, leaves it to its workflow."""
    return Job.workflow_role.is_distinct_from(literal(int(WorkflowRole.CLOSING)))


def retried_or_cancelled_by_hand() -> ColumnElement[bool]:
    """The job is one an operator may retry or cancel on its own: of no workflow, or the
    ``on_failure`` job of a workflow that ended. A workflow's members, callbacks and closing
    marker are settled by the workflow's countdown: one retried or cancelled by hand would
    close the workflow early or late, or leave its callback a result list without that
    member's, so the workflow is acted on whole instead (``cancel_workflow``)."""
    on_failure = Job.workflow_role == literal(int(WorkflowRole.ON_FAILURE))
    return or_(Job.workflow_id.is_(None), and_(on_failure, outside_running_workflows()))


def deleted_by_hand() -> ColumnElement[bool]:
    """The job is one an operator may delete on its own: not a closing marker, and of no
    workflow that still runs (its callback reads every member's result from the member's row
    when it is released; a member deleted before that could never be counted down)."""
    return and_(not_a_closing_marker(), outside_running_workflows())


# The moment an outcome is written (``finished_at``, ``updated_at``, a retry's ``run_at``): the
# statement's start, not ``now()``, the transaction's. An atomic job's outcome is written in the
# transaction that claimed it, where ``now()`` is the claim's time, so its ``finished_at`` would
# equal its ``started_at`` and its backoff would count from the claim. In the short transactions
# that write leased outcomes the two are the same moment.
OUTCOME_AT: Final[ColumnElement[Any]] = func.statement_timestamp()


_ONE_MINUTE: ColumnElement[Any] = literal_column("interval '1 minute'")
_EPOCH: ColumnElement[Any] = literal_column("TIMESTAMPTZ '1970-01-01 00:00:00+00'")


def trace_context_param() -> ColumnElement[Any]:
    """The bind ``trace_context`` (JSON text) as ``json``: the enqueuing span's context."""
    return cast(bindparam("trace_context", type_=Text), JSON)


def minute_of(moment: Any) -> ColumnElement[Any]:  # a column or an expression
    """The start of the minute ``moment`` falls in, counted in whole minutes since the Unix
    epoch (the same in every session time zone, which ``date_trunc`` is not)."""
    return func.date_bin(_ONE_MINUTE, moment, _EPOCH)


def array_param(name: str, item_type: Any) -> ColumnElement[Any]:
    """A bind parameter ``name`` holding an array of ``item_type``."""
    return bindparam(name, type_=ARRAY(item_type))


# The running state written out, not bound: the partial indexes' predicates name it, and a
# generic plan proves a predicate only from constants.
_RUNNING_STATE: ColumnElement[Any] = literal_column("'running'")


def listed_by_state(job: Any = Job) -> ColumnElement[bool]:
    """``job`` is not running: the predicate of the ``(queue, state, id)`` and
    ``(task_name, state, id)`` indexes (``models.LISTED_BY_STATE``), which a statement must name
    to read them whatever state it binds (a generic plan cannot prove it from a bound state).
    ``job``: ``Job``, or ``JobHistory``, whose indexes hold every row (it has no running job)."""
    listed: ColumnElement[bool] = job.state != _RUNNING_STATE
    return listed


def running(job: Any = Job) -> ColumnElement[bool]:
    """``job`` is running, written out so that every plan may read the lease index (partial on
    this predicate), which lists the running jobs: as many as the workers' slots."""
    is_running: ColumnElement[bool] = job.state == _RUNNING_STATE
    return is_running


def in_states(column: Any, states: Iterable[JobState]) -> ColumnElement[bool]:
    """``column = a OR column = b``: one plain bind per state, no expanding ``IN`` list (which
    SQLAlchemy renders per execution), so a statement's SQL text is final once compiled and
    the driver executor (``pgqueue.db``) can send it as compiled."""
    return or_(*(column == state.value for state in sorted(states)))


def source_states(transition: Transition) -> ColumnElement[bool]:
    """The guard of ``transition``: the job is in one of its source states."""
    return in_states(Job.state, transition.sources)


# Entries kept in a job's ``errors`` history: the latest attempts' (``last_error`` holds the
# latest one's too). With ``max_error_bytes`` per entry, a row stays bounded however many
# attempts a job is allowed.
ERROR_HISTORY: Final = 10
# Written out: SQLAlchemy has no ``jsonpath`` type to bind or cast a constant to.
_LAST_ENTRIES: Final[ColumnElement[Any]] = literal_column("'$[last - $keep + 1 to last]'::jsonpath")


def append_error(attempt: Any, error: ColumnElement[Any]) -> ColumnElement[Any]:
    """``errors || [{"attempt", "at", "error"}]``, cut to its last ``ERROR_HISTORY`` entries:
    the per-attempt error history. (A lax JSON path: a history edited by hand into something
    other than an array is wrapped, not refused, so the outcome is still written.)"""
    entry = func.jsonb_build_array(
        func.jsonb_build_object("attempt", attempt, "at", func.now(), "error", error)
    )
    return func.jsonb_path_query_array(
        Job.errors.op("||")(entry),
        _LAST_ENTRIES,
        func.jsonb_build_object("keep", literal(ERROR_HISTORY, Integer)),
    )


CLEAR_LEASE: Final[dict[str, Any]] = {
    "lease_owner": null(),
    "lease_token": null(),
    "lease_expires_at": null(),
}

# Columns a worker needs to run a claimed job. The arguments come back as their JSON text
# (free for ``json``, stored as text): the data layer decodes each job's on its own, so a row
# Python cannot decode fails alone instead of the claim's whole answer. The trace context too,
# decoded only by a worker that traces; returned whether or not it does, so the claim has one
# form: for the usual null the column costs a null in the answer. The lease token as its text:
# the worker only sends it back (outcomes, heartbeats, steps), so a ``uuid.UUID`` built per job
# on reading, and turned back into text for every batch, would be work for nothing. ``keyed``
# lets the outcome statements of jobs without a concurrency key skip the key counters.
CLAIMED_COLUMNS: Final[tuple[Any, ...]] = (
    Job.id,
    Job.task_name,
    Job.queue,
    cast(Job.args, Text).label("args"),
    cast(Job.kwargs, Text).label("kwargs"),
    Job.attempts,
    Job.max_attempts,
    Job.priority,
    cast(Job.lease_token, Text).label("lease_token"),
    Job.atomic,
    Job.cancel_requested,
    cast(Job.trace_context, Text).label("trace_context"),
    Job.concurrency_key.is_not(None).label("keyed"),
)


# What a statement that moves jobs out of RUNNING either back to waiting or to a final state
# (a snooze, a rescue) returns of them: the new state, what a new ticket needs
# (``tickets_for``), the queue and key whose slots it frees (``free_slots``), the dependents to
# settle and whether anyone waits for the job (``announced``).
REQUEUED_OR_ENDED_COLUMNS: Final[tuple[Any, ...]] = (
    Job.id,
    Job.state,
    Job.queue,
    Job.priority,
    Job.run_at,
    Job.atomic,
    Job.concurrency_key,
    Job.dependents,
    Job.awaited,
)


COPY_TICKET_COLUMNS: Final = ("job_id", "queue", "priority", "run_at", "atomic")


def among(column: Any, ids: Any) -> ColumnElement[bool]:
    """``column = ANY(ARRAY(SELECT ids))``: matches a CTE's ids by index probes whatever the
    planner believes about the CTE's size. A join (``USING``/``FROM`` the CTE) is planned from
    the ``LIMIT``'s estimate, and for a large ``LIMIT`` or a generic plan (where ``LIMIT $n``
    counts as 10 % of the table) that becomes a hash join over a sequential scan of the whole
    table, an order of magnitude slower than the probes for a few hundred tickets among tens of
    thousands."""
    matched: ColumnElement[bool] = column == func.any(func.array(select(ids).scalar_subquery()))
    return matched


def key_hash(key: Any) -> ColumnElement[Any]:
    """A concurrency key's 32-bit hash as tickets store it (null for null): the first 32 bits of
    its MD5, which no server version changes (``hashtext`` may). Constants, not bound values:
    over a key row's ``key`` it must equal the expression of the index on key rows
    (``models.KEY_HASH_OF_KEY``), which a generic plan matches only with constants."""
    hexdigits = literal_column("'x'", Text).op("||")(
        func.substr(func.md5(key), literal_column("1"), literal_column("8"))
    )
    hashed: ColumnElement[Any] = cast(cast(hexdigits, BIT(32)), Integer)
    return hashed


def tickets_for(jobs: Any, name: str, *where: ColumnElement[bool]) -> Any:
    """CTE named ``name``: a ticket for each row of ``jobs`` (a CTE returning the jobs' id,
    queue, priority, run_at and atomic, and their ``concurrency_key`` where jobs may have one)
    that matches ``where``. The statement must also include ``woken`` of it, which sends the
    wake-up."""
    columns = [jobs.c.id, jobs.c.queue, jobs.c.priority, jobs.c.run_at, jobs.c.atomic]
    names = list(COPY_TICKET_COLUMNS)
    if "concurrency_key" in jobs.c:
        columns += [key_hash(jobs.c.concurrency_key), jobs.c.concurrency_key.is_not(None)]
        names += ["key_hash", "keyed"]
    return (
        insert(MessageQueue)
        .from_select(names, select(*columns).where(*where))
        .returning(MessageQueue.queue, MessageQueue.run_at)
        .cte(name)
    )


def wake_payload(queue: Any, first_run_at: Any) -> ColumnElement[str]:
    """What an idle worker is told: the queue, plus the epoch of the earliest new ticket when
    that is in the future (so it knows when to wake for a delayed job). Compared with the
    statement's time: an outcome sets a ticket's ``run_at`` from it (``OUTCOME_AT``), which is
    later than the transaction's ``now()``."""
    epoch = cast(func.extract("epoch", first_run_at), Text)
    ready = first_run_at <= func.statement_timestamp()
    return case((ready, queue), else_=queue + literal(" ") + epoch)


def woken(tickets: Any) -> ColumnElement[bool]:
    """An always-true condition for the statement that inserts ``tickets`` (a ``tickets_for``
    CTE): evaluating it sends one NOTIFY per queue of the new tickets (none when there are
    none), delivered at commit. In the statement and not a trigger on the ticket table: a
    statement-level trigger with a transition table costs more server time than the insert it
    follows. A condition because a CTE nothing reads is never evaluated; uncorrelated, it runs
    once."""
    first = (
        select(tickets.c.queue, func.min(tickets.c.run_at).label("first_run_at"))
        .group_by(tickets.c.queue)
        .subquery(f"{tickets.name}_queues")
    )
    sent = select(
        func.count(
            func.pg_notify(NOTIFY_CHANNEL, wake_payload(first.c.queue, first.c.first_run_at))
        )
    ).scalar_subquery()
    return sent >= 0


def announced(ended: Any, *where: ColumnElement[bool]) -> ColumnElement[bool]:
    """An always-true condition that sends ONE NOTIFY on ``FINISHED_CHANNEL`` naming the jobs of
    ``ended`` (a CTE returning ``id`` and ``awaited``) that someone waits for and that match
    ``where``, as comma-separated ids, or ``ALL_FINISHED`` when those do not fit in a payload;
    none when there are none. Delivered at commit, like ``woken``'s, and a condition for the
    same reason. Only awaited jobs: a transaction that notifies takes a cluster-wide lock at
    commit, which jobs nobody waits for must not pay."""
    batch = (
        select(func.string_agg(cast(ended.c.id, Text), literal(",")).label("ids"))
        .select_from(ended)
        .where(ended.c.awaited, *where)
        .subquery(f"{ended.name}_announced")
    )
    fits = func.octet_length(batch.c.ids) <= MAX_PAYLOAD_BYTES
    payload = case((fits, batch.c.ids), else_=literal(ALL_FINISHED))
    # Over no rows the aggregate is one NULL: nothing ended, nothing to announce.
    sent = (
        select(func.count(func.pg_notify(FINISHED_CHANNEL, payload)))
        .where(batch.c.ids.is_not(None))
        .scalar_subquery()
    )
    return sent >= 0


def free_slots(exited: Any, keyed: bool = True) -> tuple[Any, ...]:
    """CTEs (add them all): subtract jobs that left RUNNING (``exited`` has ``queue`` and
    ``concurrency_key``) from limited queues and, with ``keyed`` (some of those jobs may have a
    concurrency key), from their keys' counters. Without ``keyed`` the statement leaves the key
    table alone: the outcome of a batch the worker knows holds no keyed job skips that probe."""
    if not keyed:
        return (_free_queue_slots(exited),)
    return _free_queue_slots(exited), _free_key_slots(exited)


def _free_key_slots(exited: Any) -> Any:
    """CTE: subtract the keyed jobs of ``exited`` from their keys' ``running``. The key rows are
    found by an index scan over the sorted array of keys, so they are locked in key order and
    two statements freeing the same keys never deadlock; jobs without a key probe nothing (an
    empty array)."""
    keys = select(exited.c.concurrency_key).where(exited.c.concurrency_key.is_not(None))
    gone = (
        select(func.count())
        .select_from(exited)
        .where(exited.c.concurrency_key == ConcurrencyKey.key)
        .scalar_subquery()
    )
    return (
        update(ConcurrencyKey)
        .where(ConcurrencyKey.key == func.any(func.array(keys.scalar_subquery())))
        .values(running=func.greatest(ConcurrencyKey.running - gone, 0))
        .cte(f"key_slots_{exited.name}")
    )


def _free_queue_slots(exited: Any) -> Any:
    """CTE: subtract jobs that left RUNNING (``exited`` has ``queue``) from limited queues."""
    gone = (
        select(exited.c.queue, func.count().label("n"))
        .group_by(exited.c.queue)
        .subquery("exited_per_queue")
    )
    return (
        update(QueueControl)
        .where(QueueControl.name == gone.c.queue, QueueControl.concurrency_limit.is_not(None))
        .values(running=func.greatest(QueueControl.running - gone.c.n, 0))
        .cte(f"slots_{exited.name}")
    )


def recounted(key: Any, running: Any, job_key: Any, names: str) -> Any:
    """UPDATE (returning ``(key, running)``) of the counter rows whose ``key`` is in the array
    bind ``names``: their ``running`` counter set to their RUNNING jobs (``job_key`` equal to
    ``key``), where it drifted. For the maintenance recounts of queues and keys."""
    running_jobs = (
        select(func.count())
        .select_from(Job)
        .where(job_key == key, Job.state == JobState.RUNNING.value)
        .scalar_subquery()
    )
    return (
        update(key.table)
        .where(key == func.any(array_param(names, Text)), running != running_jobs)
        .values({running: running_jobs})
        .returning(key, running)
    )


def ids_with_new_tickets(updated: Any) -> Select[int]:
    """The ids of ``updated`` (a CTE of jobs moved to a waiting state), each given a ticket."""
    tickets = tickets_for(updated, "requeued")
    return select(updated.c.id).add_cte(tickets).where(woken(tickets))


def locked_in_id_order(*where: ColumnElement[bool]) -> Select[int]:
    """Rows of jobs ``ids`` (array), locked in id order.

    The writers that wait for the row locks of several RUNNING jobs (a heartbeat, a batch of
    outcomes written in one transaction: ``lock_jobs``) all take them in this one order, so two
    of them can never deadlock (a heartbeat covers attempts whose outcome is being written).
    """
    return (
        select(Job.id)
        .where(Job.id == func.any(array_param("ids", BigInteger)), *where)
        .order_by(Job.id)
        .with_for_update()
    )


def outside_running_workflows() -> ColumnElement[bool]:
    """True for a job of no workflow that still runs. A running workflow's finished members
    stay in ``pgqueue_jobs`` whatever their age: a chord's callback reads their results from
    their rows when it is released, and ``get_workflow`` lists them."""
    running = (
        select(literal(1))
        .where(Workflow.id == Job.workflow_id, Workflow.state == "running")
        .exists()
    )
    return or_(Job.workflow_id.is_(None), ~running)


def cancel_flags(matching: ColumnElement[bool]) -> Select[int]:
    """Flag the RUNNING jobs ``matching`` selects for cancellation (their handlers see it and
    stop, cooperatively); returns how many. The rows are locked in id order first, the order in
    which heartbeats and outcome writers lock several running jobs, so none of them deadlocks
    with this."""
    locked = (
        select(Job.id).where(matching, running()).order_by(Job.id).with_for_update().cte("locked")
    )
    flagged = (
        update(Job)
        .where(Job.id.in_(select(locked.c.id)), Job.state == JobState.RUNNING.value)
        .values(cancel_requested=True, updated_at=func.now())
        .returning(Job.id)
        .cte("flagged")
    )
    return select(func.count()).select_from(flagged)
