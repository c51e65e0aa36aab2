"""The public admin API: read and control jobs and queues, as the dashboard and both CLIs do.

``pgq.admin`` (an :class:`Admin`) answers the questions an operator asks (which jobs, how many,
how late, how fast) and carries out their actions (rerun, cancel, delete, pause, limit, and the
same three actions in bulk by filter, each with a dry run and an audit record). Each
method is one data-layer operation in one transaction: reads in a session of their own,
actions in the caller's session when one is given, else in an own transaction retried on
transient conflicts. Arguments are checked before any SQL runs; rows come back as the public
``Job`` model (detached snapshots) or as the small frozen data classes of
``pgqueue.admin_values``, imported from here.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import TypeVar

from sqlalchemy.orm import Session, sessionmaker

from pgqueue import admin_values, explain, uow, validation
from pgqueue.admin_values import *  # noqa: F403  (the API's values, re-exported: see __all__)
from pgqueue.admin_values import (
    BULK_CANCEL_REASON,
    DEFAULT_COUNT_CAP,
    DEFAULT_PAGE_SIZE,
    DEFAULT_THROUGHPUT_CAP,
    MAX_QUEUE_DEPTH,
    BulkResult,
    JobHolder,
    JobPage,
    KeyOverride,
    OldestWaiting,
    QueueSettings,
    Throughput,
    WorkerInfo,
    check_actor,
    check_job_id,
    default_actor,
    list_arguments,
    page_of,
)
from pgqueue.config import Settings
from pgqueue.data import admin as admin_data
from pgqueue.data import bulk as bulk_data
from pgqueue.data import control as control_data
from pgqueue.data import enqueue as enqueue_data
from pgqueue.data import flow as flow_data
from pgqueue.data import workers as workers_data
from pgqueue.data import workflows as workflow_data
from pgqueue.data.history import JobTables
from pgqueue.data.insert_choice import BoundedQueuesSeen
from pgqueue.db import Executor, executor_for
from pgqueue.errors import ValidationError, WorkflowNotFound
from pgqueue.job_filter import BulkAction, JobFilter
from pgqueue.models import Job
from pgqueue.states import JobState
from pgqueue.workflows.status import WorkflowStatus, status_of

__all__ = ["Admin", "BulkAction", "JobFilter", *admin_values.__all__]

T = TypeVar("T")


class Admin:
    """Reads and actions for operators; reach it as ``pgq.admin``.

    ``sessions`` returns the session factory of pgqueue's own engine (called per operation, so
    an engine recreated after ``dispose`` is used). ``bounded_queues`` is the belief of the
    enqueues of the same queue object, told of each bound set here.
    """

    def __init__(
        self,
        sessions: Callable[[], sessionmaker[Session]],
        *,
        stale_seconds: Callable[[], float] = lambda: Settings().worker_stale_seconds,
        partitioned_history: Callable[[], bool] = lambda: False,
        bounded_queues: BoundedQueuesSeen | None = None,
    ) -> None:
        self._sessions = sessions
        self._stale_seconds = stale_seconds
        self._partitioned_history = partitioned_history
        self._bounded_queues = bounded_queues if bounded_queues is not None else BoundedQueuesSeen()

    # -- jobs --------------------------------------------------------------------------------

    def get_job(self, job_id: int) -> Job:
        """A snapshot of one job (detached from any session). Raises JobNotFound."""
        job_id = check_job_id(job_id)
        tables = self._tables()
        return self._read_session(lambda s: admin_data.job_snapshot(s, job_id, tables))

    def explain_job(self, job_id: int) -> explain.JobExplanation:
        """Why job ``job_id`` is not running (or is): its blockers in the order the claim
        applies them (see ``pgqueue.explain``). Raises JobNotFound."""
        job_id = check_job_id(job_id)
        stale_seconds = self._stale_seconds()
        return self._read(lambda ex: explain.explain_job(ex, job_id, stale_seconds=stale_seconds))

    def list_jobs(
        self,
        *,
        queue: str | None = None,
        state: JobState | str | None = None,
        task_name: str | None = None,
        before: int | None = None,
        after: int | None = None,
        limit: int = DEFAULT_PAGE_SIZE,
    ) -> JobPage:
        """A page of jobs, newest first, filtered by queue, state and task name; ``before`` /
        ``after`` (a job id, see ``JobPage``) walk to older / newer pages."""
        checked = list_arguments(
            queue=queue, state=state, task_name=task_name, before=before, after=after, limit=limit
        )
        tables = self._tables()
        # One more than the page: whether there is a next page.
        ahead = dataclasses.replace(checked, limit=checked.limit + 1)
        rows = self._read_session(lambda s: admin_data.jobs_page(s, tables, ahead))
        return page_of(rows, limit=checked.limit, before=checked.before, after=checked.after)

    def delete_job(self, job_id: int, *, session: Session | None = None) -> bool:
        """Delete a job that is not running (with its ticket); False when nothing was
        deleted (it is running, or gone). A job of a running workflow is refused with
        InvalidStateTransition naming the workflow (its callback counts on every member's
        row)."""
        job_id = check_job_id(job_id)
        return self._write_session(session, lambda s: admin_data.remove_job(s, job_id))

    def retry_job(self, job_id: int, *, session: Session | None = None) -> None:
        """Make a FAILED or CANCELLED job run again now, whatever its attempt count.

        The attempts it used stay counted; when none are left, ``max_attempts`` is raised to
        ``attempts + 1``, so the job gets one more attempt (retried no further if it fails) and
        its attempt count never exceeds its maximum. A workflow's job (but the ``on_failure``
        job of an ended workflow) is refused with InvalidStateTransition naming the workflow:
        its workflow settles it."""
        job_id = check_job_id(job_id)
        tables = self._tables()
        self._write_session(session, lambda s: admin_data.rerun_job(s, job_id, tables))

    def cancel_job(self, job_id: int, *, session: Session | None = None) -> JobState:
        """Cancel a waiting job (it never runs) or ask a running one to stop.

        Returns CANCELLED for a waiting job, RUNNING when the running job was flagged (its
        handler sees ``ctx.cancel_requested``; it ends CANCELLED, not retried). A workflow's
        job is refused as ``retry_job`` refuses it (``cancel_workflow`` stops the workflow).
        """
        job_id = check_job_id(job_id)
        tables = self._tables()
        return self._write_session(
            session, lambda s: admin_data.cancel_job(s, job_id, "cancelled by request", tables)
        )

    # -- workflows ---------------------------------------------------------------------------

    def get_workflow(self, workflow_id: int) -> WorkflowStatus:
        """Workflow ``workflow_id`` as read in one snapshot. Raises WorkflowNotFound."""
        return self._read(lambda ex: self._workflow(ex, workflow_id))

    def workflow_in(self, session: Session, workflow_id: int) -> WorkflowStatus:
        """``get_workflow`` in ``session``."""
        return self._workflow(executor_for(session), workflow_id)

    def _workflow(self, ex: Executor, workflow_id: int) -> WorkflowStatus:
        row = workflow_data.read_workflow(
            ex, check_job_id(workflow_id, what="workflow id"), self._tables()
        )
        if row is None:
            raise WorkflowNotFound(f"no workflow with id {workflow_id}")
        return status_of(row)

    def cancel_workflow(self, workflow_id: int, *, session: Session | None = None) -> bool:
        """Cancel workflow ``workflow_id`` (see ``PgQueue.cancel_workflow``)."""
        workflow_id = check_job_id(workflow_id, what="workflow id")

        tables = self._tables()

        def cancel(ex: Executor) -> bool:
            if workflow_data.read_workflow(ex, workflow_id, tables) is None:
                raise WorkflowNotFound(f"no workflow with id {workflow_id}")
            return workflow_data.cancel_workflow(ex, workflow_id)

        return self._write(session, cancel)

    # -- bulk actions ------------------------------------------------------------------------

    def bulk_retry(
        self,
        job_filter: JobFilter,
        *,
        dry_run: bool = False,
        actor: str | None = None,
        source: str = "api",
        expected_count: int | None = None,
    ) -> BulkResult:
        """Retry every FAILED or CANCELLED job ``job_filter`` matches, as ``retry_job`` does one
        (a ticket for now, ``max_attempts`` raised where no attempt is left). See
        ``bulk_delete`` for the arguments."""
        return self._bulk(BulkAction.RETRY, job_filter, dry_run, actor, source, expected_count)

    def bulk_cancel(
        self,
        job_filter: JobFilter,
        *,
        dry_run: bool = False,
        actor: str | None = None,
        source: str = "api",
        expected_count: int | None = None,
    ) -> BulkResult:
        """Cancel every waiting job ``job_filter`` matches (QUEUED, RETRYING, WAITING; their
        waiting dependents are cancelled too) and ask every matching RUNNING job to stop, as
        ``cancel_job`` does one. See ``bulk_delete`` for the arguments."""
        return self._bulk(BulkAction.CANCEL, job_filter, dry_run, actor, source, expected_count)

    def bulk_delete(
        self,
        job_filter: JobFilter,
        *,
        dry_run: bool = False,
        actor: str | None = None,
        source: str = "api",
        expected_count: int | None = None,
    ) -> BulkResult:
        """Delete every job ``job_filter`` matches that is not RUNNING, with its ticket, as
        ``delete_job`` does one.

        ``dry_run`` only counts the jobs the action would change (the same condition, nothing
        written). Otherwise the action and its audit record (``actor``, default
        ``default_actor()``; ``source``: ``api``, ``cli`` or ``dashboard``; the filter; the
        count changed) commit in one transaction. With ``expected_count`` (the count a preview
        showed), an action that would change another number of jobs changes none and raises
        ``BulkCountChanged``. An empty filter, or one naming a state the action does not apply
        to, raises ``ValidationError``."""
        return self._bulk(BulkAction.DELETE, job_filter, dry_run, actor, source, expected_count)

    def _bulk(
        self,
        action: BulkAction,
        job_filter: JobFilter,
        dry_run: bool,
        actor: str | None,
        source: str,
        expected_count: int | None,
    ) -> BulkResult:
        if not isinstance(job_filter, JobFilter):
            raise ValidationError(f"filter must be a JobFilter, got {type(job_filter).__name__}")
        states = job_filter.states_for(action)
        who, where = check_actor(default_actor() if actor is None else actor, source)
        if expected_count is not None and (
            not isinstance(expected_count, int) or isinstance(expected_count, bool)
        ):
            raise ValidationError(f"expected_count must be an int, got {expected_count!r}")
        if dry_run:
            deleting = action is BulkAction.DELETE
            count = self._read(
                lambda s: bulk_data.count_matching(s, job_filter, states, deleting=deleting)
            )
            return BulkResult(action, count, dry_run=True)
        count, flagged, audit_id = self._write(
            None,
            lambda s: bulk_data.act_and_record(
                s,
                action,
                job_filter,
                states,
                actor=who,
                source=where,
                expected_count=expected_count,
                cancel_reason=BULK_CANCEL_REASON,
            ),
        )
        return BulkResult(action, count, False, flagged, audit_id)

    # -- figures -----------------------------------------------------------------------------

    def counts(self) -> dict[str, dict[JobState, int]]:
        """``{queue: {state: count}}`` over all jobs (exact: reads every job)."""
        return self._read(admin_data.state_counts)

    def capped_counts(self, cap: int = DEFAULT_COUNT_CAP) -> dict[str, dict[JobState, int]]:
        """``{queue: {state: count}}`` for every queue with jobs, each count stopping at
        ``cap`` (``cap`` means "``cap`` or more"); states without jobs count 0. Under the
        partitioned history, moved jobs count too (each table's count capped, the sum too)."""
        if not isinstance(cap, int) or isinstance(cap, bool) or cap < 1:
            raise ValidationError(f"cap must be a positive int, got {cap!r}")
        tables = self._tables()
        return self._read(lambda s: admin_data.capped_counts(s, cap, tables))

    def oldest_waiting(self) -> dict[str, OldestWaiting]:
        """The earliest ticket of each queue that has one."""
        rows = self._read(admin_data.oldest_waiting)
        return {queue: OldestWaiting(*row) for queue, row in rows.items()}

    def throughput(self) -> dict[str, dict[JobState, list[int]]]:
        """Jobs finished per minute over the last hour: ``{queue: {state: [count, ...]}}``,
        index 0 the current minute, index 59 an hour ago; only queues with finished jobs in
        that hour appear. Under the partitioned history the minutes are clock minutes, and moved
        jobs are counted from the per-minute counts their move wrote."""
        tables = self._tables()
        return self._read(lambda s: admin_data.throughput(s, tables))

    def recent_throughput(self, cap: int = DEFAULT_THROUGHPUT_CAP) -> Throughput:
        """Jobs finished per minute over the last hour, or, when more than ``cap`` finished in
        that hour, over the shorter window holding the ``cap`` most recent ones, in buckets of
        1 to 60 seconds (at most 60 of them). Reads at most about ``cap`` index entries twice,
        so the cost is bounded however busy the queues are. Under the partitioned history the
        moved jobs of a whole hour come from their per-minute counts (clock minutes), whose
        rows do not grow with the jobs; the window shrinks only when more than ``cap`` jobs
        still in ``pgqueue_jobs`` finished within the hour."""
        if not isinstance(cap, int) or isinstance(cap, bool) or cap < 1:
            raise ValidationError(f"cap must be a positive int, got {cap!r}")
        tables = self._tables()
        return Throughput(*self._read(lambda s: admin_data.recent_throughput(s, cap, tables)))

    def queue_names(self) -> list[str]:
        """The queues that have jobs, sorted (moved jobs' too under the partitioned history)."""
        tables = self._tables()
        return self._read(lambda s: admin_data.queue_names(s, tables))

    # -- queues ------------------------------------------------------------------------------

    def pause_queue(self, queue: str) -> None:
        """Stop all workers from claiming ``queue``'s jobs (within one poll interval); running
        jobs finish. Tickets stay, so ``resume_queue`` picks up where it left off."""
        name = validation.queue_name(queue)
        self._write(None, lambda s: control_data.set_queue_control(s, name, paused=True))

    def resume_queue(self, queue: str) -> None:
        """Let workers claim ``queue``'s jobs again."""
        name = validation.queue_name(queue)
        self._write(None, lambda s: control_data.set_queue_control(s, name, paused=False))

    def set_queue_limit(self, queue: str, limit: int | None) -> None:
        """At most ``limit`` jobs of ``queue`` RUNNING at once across all workers and hosts
        (enforced in the claim); ``None`` removes the limit."""
        if limit is not None and (
            not isinstance(limit, int) or isinstance(limit, bool) or limit < 1
        ):
            raise ValidationError(f"queue limit must be a positive int or None, got {limit!r}")
        if limit is not None and limit > MAX_QUEUE_DEPTH:  # the same integer column's range
            raise ValidationError(f"queue limit must be at most {MAX_QUEUE_DEPTH}, got {limit}")
        name = validation.queue_name(queue)
        self._write(
            None, lambda s: control_data.set_queue_control(s, name, concurrency_limit=limit)
        )

    def set_queue_max_depth(
        self, queue: str, max_depth: int | None, *, on_full: str = "reject"
    ) -> None:
        """Bound ``queue``: an enqueue that would take it above ``max_depth`` waiting jobs
        (queued, retrying, or waiting on dependencies; scheduled ones included) raises
        ``QueueFull`` in the enqueuing caller, and writes none of its jobs. ``None`` removes the
        bound. ``on_full`` says what a full queue does to an enqueue; ``"reject"`` is the only
        mode. A bound never holds back a job already waiting."""
        if max_depth is not None and (
            not isinstance(max_depth, int) or isinstance(max_depth, bool) or max_depth < 1
        ):
            raise ValidationError(f"max_depth must be a positive int or None, got {max_depth!r}")
        if max_depth is not None and max_depth > MAX_QUEUE_DEPTH:
            raise ValidationError(f"max_depth must be at most {MAX_QUEUE_DEPTH}, got {max_depth}")
        if on_full != "reject":
            raise ValidationError(f"on_full must be 'reject' (the only mode), got {on_full!r}")
        name = validation.queue_name(queue)
        self._write(None, lambda ex: enqueue_data.set_queue_max_depth(ex, name, max_depth))
        # This queue object's enqueues go straight to the checked insert of a bounded queue.
        self._bounded_queues.record([name], [] if max_depth is None else [name])

    def set_key_limit(self, key_or_prefix: str, limit: int | None) -> None:
        """At most ``limit`` jobs RUNNING at once for each concurrency key starting with
        ``key_or_prefix`` (an exact key is its own longest prefix), across all workers;
        the longest matching prefix wins over the task's ``key_limit``. ``None`` removes it."""
        prefix = validation.concurrency_key(key_or_prefix, what="key_or_prefix")
        if limit is not None:
            limit = validation.limit_count(limit, what="key limit")
        self._write(None, lambda s: flow_data.set_key_limit(s, prefix, limit))

    def set_rate_limit(
        self,
        queue: str | None = None,
        limit: int | None = None,
        *,
        per: float | None = None,
        key: str | None = None,
    ) -> None:
        """At most ``limit`` jobs of ``queue`` (or, with ``key=``, of each concurrency key
        starting with ``key``) start in any window of ``per`` seconds, across all workers;
        jobs over the rate wait. ``limit=None`` removes the rate limit."""
        if (queue is None) == (key is None):
            raise ValidationError("set_rate_limit needs either a queue or key=, not both")
        if limit is None:
            if per is not None:
                raise ValidationError("per without a limit: pass limit=None alone to remove")
            rate, window = None, None
        else:
            rate = validation.limit_count(limit, what="rate limit")
            if per is None:
                raise ValidationError("a rate limit needs per= (its window in seconds)")
            window = validation.rate_period(per)
        if key is not None:
            prefix = validation.concurrency_key(key, what="key")
            self._write(None, lambda s: flow_data.set_key_rate(s, prefix, rate, window))
            return
        name = validation.queue_name(queue)
        self._write(None, lambda s: flow_data.set_queue_rate(s, name, rate, window))

    def queue_settings(self) -> dict[str, QueueSettings]:
        """The switches of every queue that has any, by queue name."""
        rows = self._read_session(control_data.queue_controls)
        return {
            row.name: QueueSettings(
                row.name,
                row.paused,
                row.concurrency_limit,
                row.running,
                row.max_depth,
                row.rate_limit,
                row.rate_per,
            )
            for row in rows
        }

    def key_overrides(self) -> list[KeyOverride]:
        """Every run-time override of the concurrency keys' limits, by prefix."""
        rows = self._read(flow_data.key_overrides)
        return [KeyOverride(*row) for row in rows]

    # -- workers -----------------------------------------------------------------------------

    def list_workers(self, *, include_stale: bool = False) -> list[WorkerInfo]:
        """The live workers of the registry by id, each with the RUNNING jobs it holds; with
        ``include_stale``, also the rows of workers gone stale (``live`` false), after them."""
        if not isinstance(include_stale, bool):
            raise ValidationError(f"include_stale must be a bool, got {include_stale!r}")
        stale_seconds = self._stale_seconds()
        rows = self._read(
            lambda s: workers_data.list_workers(s, stale_seconds, include_stale=include_stale)
        )
        return [
            WorkerInfo(
                id=row[0],
                host=row[1],
                pid=row[2],
                queues=tuple(row[3]),
                concurrency=row[4],
                version=row[5],
                started_at=row[6],
                last_seen_at=row[7],
                seconds_since_seen=float(row[8]),
                live=bool(row[9]),
                running=int(row[10]),
                claim_error=row[11],
                seconds_failing=None if row[12] is None else float(row[12]),
                tasks=None if row[13] is None else tuple(row[13]),
            )
            for row in rows
        ]

    def job_holder(self, job_id: int) -> JobHolder | None:
        """The worker holding job ``job_id`` while it is RUNNING, else None."""
        job_id = check_job_id(job_id)
        stale_seconds = self._stale_seconds()
        row = self._read(lambda s: workers_data.job_holder(s, job_id, stale_seconds))
        if row is None:
            return None
        seen = None if row[4] is None else float(row[4])
        return JobHolder(row[0], row[1], row[2], row[3], seen, bool(row[5]))

    # -- transactions ------------------------------------------------------------------------

    def _tables(self) -> JobTables:
        return JobTables(partitioned=self._partitioned_history())

    def _read(self, work: Callable[[Executor], T]) -> T:
        return self._read_session(lambda session: work(executor_for(session)))

    def _write(self, session: Session | None, work: Callable[[Executor], T]) -> T:
        return self._write_session(session, lambda s: work(executor_for(s)))

    # Sessions only where the operation reads ORM objects or takes a savepoint.

    def _read_session(self, work: Callable[[Session], T]) -> T:
        with self._sessions()() as session:
            return work(session)

    def _write_session(self, session: Session | None, work: Callable[[Session], T]) -> T:
        return uow.in_caller_or_own_transaction(session, self._sessions(), work)
