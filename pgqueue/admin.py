"""The public admin API: read and control jobs and queues, as the dashboard and both CLIs do.

``pgq.admin`` (an :class:`Admin`) answers the questions an operator asks (which jobs, how many,
how late, how fast) and carries out their actions (rerun, cancel, signal, delete, pause, limit,
prune, and the same three actions in bulk by filter, each with a dry run and an audit record).
It is the one door to these operations: ``PgQueue``'s job-control methods (``pgq.get_job``,
``pgq.retry_job`` ...) are aliases of its methods. Each method is one data-layer operation in
one transaction (``admin_runner``): reads in a session of their own, actions in the caller's
session when one is given, else in an own transaction retried on transient conflicts; the
``a``-prefixed methods run the same bodies in an event loop. Arguments are checked before any
SQL runs; rows come back as the public ``Job`` model (detached snapshots) or as the small
frozen data classes of ``pgqueue.admin_values`` and ``pgqueue.admin_records``, imported from
here. The queue switches are ``admin_queues``'; the job edits (reschedule, run now, priority)
and the audit log ``admin_edits``'; the schedule switches ``admin_schedules``'; a job's signals ``admin_job_details``'; the counts, throughput and
worker registry ``admin_figures``'. An action on one
job given an ``actor`` writes an audit record in its own transaction.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from typing import Any

from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm import Session

from pgqueue import admin_records, admin_values, explain
from pgqueue.admin_edits import JobEdits
from pgqueue.admin_figures import Figures
from pgqueue.admin_job_details import JobDetails, JobSignals, ReceivedSignal
from pgqueue.admin_queues import QueueControls
from pgqueue.admin_records import *  # noqa: F403  (the API's values, re-exported: see __all__)
from pgqueue.admin_runner import SessionWork, Work
from pgqueue.admin_schedules import ScheduleControls
from pgqueue.admin_values import *  # noqa: F403  (the API's values, re-exported: see __all__)
from pgqueue.admin_values import (
    BULK_CANCEL_REASON,
    DEFAULT_PAGE_SIZE,
    DEFAULT_SEARCH_SCAN,
    BulkResult,
    JobPage,
    JsonMatch,
    check_actor,
    check_job_id,
    default_actor,
    list_arguments,
    page_of,
)
from pgqueue.data import admin as admin_data
from pgqueue.data import bulk as bulk_data
from pgqueue.data import history as history_data
from pgqueue.data import maintenance as maintenance_data
from pgqueue.data import search as search_data
from pgqueue.data import signals as signals_data
from pgqueue.data import workflows as workflow_data
from pgqueue.db import ConnectionExecutor, Executor
from pgqueue.errors import ValidationError, WorkflowNotFound
from pgqueue.job_filter import BulkAction, JobFilter
from pgqueue.models import Job
from pgqueue.states import JobState
from pgqueue.suspension import checked_signal
from pgqueue.workflows.status import WorkflowStatus, status_of

__all__ = [
    "Admin",
    "BulkAction",
    "JobFilter",
    "JobSignals",
    "ReceivedSignal",
    *admin_values.__all__,
    *admin_records.__all__,
]


class Admin(JobEdits, JobDetails, ScheduleControls, QueueControls, Figures):
    """Reads and actions for operators; reach it as ``pgq.admin``.

    Made by ``PgQueue`` over its engines and settings (see ``admin_runner.AdminRunner``).
    """

    # -- jobs --------------------------------------------------------------------------------

    def get_job(self, job_id: int) -> Job:
        """A snapshot of one job (detached from any session). Raises JobNotFound."""
        return self._read_session(self._job(job_id))

    async def aget_job(self, job_id: int) -> Job:
        """``get_job`` for asyncio. Raises JobNotFound."""
        return await self._aread_session(self._job(job_id))

    def _job(self, job_id: int) -> SessionWork[Job]:
        job_id = check_job_id(job_id)
        return lambda s, ex: admin_data.job_snapshot(s, ex, job_id)

    def explain_job(self, job_id: int) -> explain.JobExplanation:
        """Why job ``job_id`` is not running (or is): its blockers in the order the claim
        applies them (see ``pgqueue.explain``). Raises JobNotFound."""
        job_id = check_job_id(job_id)
        stale_seconds = self._stale_seconds()
        return self._read(
            lambda session: explain.explain_job(session, job_id, stale_seconds=stale_seconds)
        )

    def list_jobs(
        self,
        *,
        queue: str | None = None,
        state: JobState | str | None = None,
        task_name: str | None = None,
        before: int | None = None,
        after: int | None = None,
        limit: int = DEFAULT_PAGE_SIZE,
        job_id: int | None = None,
        since: dt.datetime | None = None,
        until: dt.datetime | None = None,
        time_column: str = "created_at",
        error_contains: str | None = None,
        json_match: JsonMatch | None = None,
        scan: int = DEFAULT_SEARCH_SCAN,
    ) -> JobPage:
        """A page of jobs, newest first, filtered by queue, state and task name; ``before`` /
        ``after`` (a job id, see ``JobPage``) walk to older / newer pages.

        Searches (``pgqueue.job_search``): ``job_id`` gives that job alone when it matches
        the other filters; ``since`` (inclusive) and ``until`` (exclusive), timezone-aware,
        bound ``time_column`` (``created_at`` or ``finished_at``); ``error_contains`` is text
        found in ``last_error`` ignoring case; ``json_match`` a ``JsonMatch`` on the arguments
        or the result. Error and JSON searches need ``since``. A search with a window reads
        at most ``scan`` jobs of it per table, newest first, and says in the page's ``search``
        whether that bound cut it short (its ``older`` then continues it)."""
        checked = list_arguments(
            queue=queue,
            state=state,
            task_name=task_name,
            before=before,
            after=after,
            limit=limit,
            job_id=job_id,
            since=since,
            until=until,
            time_column=time_column,
            error_contains=error_contains,
            json_match=json_match,
            scan=scan,
        )
        if checked.searching or checked.job_id is not None:
            return self._read_session(lambda s, ex: search_data.search_page(s, ex, checked))
        # One more than the page: whether there is a next page.
        ahead = dataclasses.replace(checked, limit=checked.limit + 1)
        rows = self._read_session(lambda s, ex: admin_data.jobs_page(s, ex, ahead))
        return page_of(rows, limit=checked.limit, before=checked.before, after=checked.after)

    def delete_job(
        self,
        job_id: int,
        *,
        session: Session | None = None,
        actor: str | None = None,
        source: str = "api",
    ) -> bool:
        """Delete a job that is not running (with its ticket); False when nothing was
        deleted (it is running, or gone). A job of a running workflow is refused with
        InvalidStateTransition naming the workflow (its callback counts on every member's
        row). With ``actor``, a deletion writes an audit record (``source``: ``api``, ``cli``
        or ``dashboard``) in its transaction; so do ``retry_job``, ``cancel_job`` and
        ``signal``."""
        job_id = check_job_id(job_id)
        audit = self._audit_if(
            actor, source, "delete", lambda done: {"job_id": job_id} if done else None
        )
        return self._write_session(
            session, audit(lambda s, ex: admin_data.remove_job(s, ex, job_id))
        )

    def retry_job(
        self,
        job_id: int,
        *,
        session: Session | None = None,
        actor: str | None = None,
        source: str = "api",
    ) -> None:
        """Make a FAILED or CANCELLED job run again now, whatever its attempt count.

        The attempts it used stay counted; when none are left, ``max_attempts`` is raised to
        ``attempts + 1``, so the job gets one more attempt (retried no further if it fails) and
        its attempt count never exceeds its maximum. A workflow's job (but the ``on_failure``
        job of an ended workflow) is refused with InvalidStateTransition naming the workflow:
        its workflow settles it. Audited with ``actor`` (see ``delete_job``)."""
        self._write_session(session, self._retry(job_id, actor, source))

    async def aretry_job(
        self,
        job_id: int,
        *,
        session: AsyncSession | None = None,
        actor: str | None = None,
        source: str = "api",
    ) -> None:
        """``retry_job`` for asyncio (in ``session``'s transaction when given)."""
        await self._awrite_session(session, self._retry(job_id, actor, source))

    def _retry(self, job_id: int, actor: str | None, source: str) -> SessionWork[None]:
        job_id = check_job_id(job_id)
        audit = self._audit_if(actor, source, "retry", lambda _: {"job_id": job_id})
        return audit(lambda s, ex: admin_data.rerun_job(s, ex, job_id))

    def cancel_job(
        self,
        job_id: int,
        *,
        session: Session | None = None,
        actor: str | None = None,
        source: str = "api",
    ) -> JobState:
        """Cancel a waiting job (it never runs) or ask a running one to stop.

        Returns CANCELLED for a waiting job, RUNNING when the running job was flagged (its
        handler sees ``ctx.cancel_requested``; it ends CANCELLED, not retried). A workflow's
        job is refused as ``retry_job`` refuses it (``cancel_workflow`` stops the workflow).
        Audited with ``actor`` (see ``delete_job``).
        """
        return self._write_session(session, self._cancel(job_id, actor, source))

    async def acancel_job(
        self,
        job_id: int,
        *,
        session: AsyncSession | None = None,
        actor: str | None = None,
        source: str = "api",
    ) -> JobState:
        """``cancel_job`` for asyncio (in ``session``'s transaction when given)."""
        return await self._awrite_session(session, self._cancel(job_id, actor, source))

    def _cancel(self, job_id: int, actor: str | None, source: str) -> SessionWork[JobState]:
        job_id = check_job_id(job_id)
        audit = self._audit_if(
            actor, source, "cancel", lambda state: {"job_id": job_id, "state": state}
        )
        return audit(lambda s, ex: admin_data.cancel_job(s, ex, job_id, "cancelled by request"))

    def signal(
        self,
        job_id: int,
        name: str,
        payload: Any = None,
        *,
        session: Session | None = None,
        actor: str | None = None,
        source: str = "api",
    ) -> bool:
        """Send signal ``name`` with ``payload`` (JSON; None by default) to job ``job_id``: it
        is stored durably, and the job, if suspended in ``ctx.wait_for_signal(name)``, is woken
        (an idle worker picks it up at once). A signal sent before the job reaches that wait is
        kept, and the wait returns it at once.

        In ``session``'s transaction when given (a rollback sends nothing), else in one of its
        own. Returns True when stored, False when a signal of that name was stored for the
        job already: the first one is kept and the later one ignored. Raises JobNotFound when
        there is no such job, InvalidStateTransition when it has finished, and
        ValidationError (a ``ValueError``) for a bad job id or name or a payload that is not
        JSON or is larger than the ``max_payload_bytes`` setting, before anything is written.
        The job's row stays locked until the transaction ends, as for ``cancel_job``. A
        stored signal is audited with ``actor`` (see ``delete_job``; the record names the
        signal, not its payload).
        """
        return self._write_session(session, self._signal(job_id, name, payload, actor, source))

    async def asignal(
        self,
        job_id: int,
        name: str,
        payload: Any = None,
        *,
        session: AsyncSession | None = None,
        actor: str | None = None,
        source: str = "api",
    ) -> bool:
        """``signal`` for asyncio (in ``session``'s transaction when given)."""
        work = self._signal(job_id, name, payload, actor, source)
        return await self._awrite_session(session, work)

    def _signal(
        self, job_id: int, name: str, payload: Any, actor: str | None, source: str
    ) -> SessionWork[bool]:
        job_id, name, encoded = checked_signal(job_id, name, payload, self._settings())
        target = {"job_id": job_id, "signal": name}
        audit = self._audit_if(actor, source, "signal", lambda stored: target if stored else None)
        return audit(lambda _, ex: signals_data.signal_job(ex, job_id, name, encoded))

    # -- workflows ---------------------------------------------------------------------------

    def get_workflow(self, workflow_id: int) -> WorkflowStatus:
        """Workflow ``workflow_id``: its state, member jobs and result, as read in one
        snapshot. Raises WorkflowNotFound."""
        return self._read(self._workflow(workflow_id))

    async def aget_workflow(self, workflow_id: int) -> WorkflowStatus:
        """``get_workflow`` for asyncio. Raises WorkflowNotFound."""
        return await self._aread(self._workflow(workflow_id))

    def _workflow(self, workflow_id: int) -> Work[WorkflowStatus]:
        workflow_id = check_job_id(workflow_id, what="workflow id")

        def read(ex: Executor) -> WorkflowStatus:
            row = workflow_data.read_workflow(ex, workflow_id)
            if row is None:
                raise WorkflowNotFound(f"no workflow with id {workflow_id}")
            return status_of(row)

        return read

    def cancel_workflow(self, workflow_id: int, *, session: Session | None = None) -> bool:
        """Cancel workflow ``workflow_id``: its jobs that have not started are cancelled (its
        ``on_failure`` job too), its running ones are asked to stop (``ctx.cancel_requested``).
        False when it had already ended. Raises WorkflowNotFound."""
        workflow_id = check_job_id(workflow_id, what="workflow id")

        def cancel(ex: Executor) -> bool:
            if workflow_data.read_workflow(ex, workflow_id) is None:
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

    # -- retention ---------------------------------------------------------------------------

    def prune(self, *, batch_size: int = 10_000) -> int:
        """Delete finished jobs past their retention (``succeeded_retention`` and
        ``failed_retention`` of the settings), ``batch_size`` at a time, each batch in a
        transaction of its own; returns how many."""
        settings = self._settings()
        total = 0
        while True:
            deleted = self._write(
                None,
                lambda s: maintenance_data.prune_finished(
                    s,
                    succeeded_before=settings.succeeded_retention,
                    failed_before=settings.failed_retention,
                    limit=batch_size,
                ),
            )
            total += deleted
            if deleted < batch_size:
                return total

    def maintain_history(
        self, *, days_ahead: int = 7, retention_days: int | None = None
    ) -> history_data.HistoryMaintenance:
        """Keep the partitioned history's partitions (``history="partitioned"``): create the
        partitions of today and the next ``days_ahead`` days, drop the days older than
        ``retention_days`` (default ``Settings.history_retention_days``), and move the rows
        the DEFAULT partition caught into their day's partition. DDL: run it as the owner of
        pgqueue's tables (daily, e.g. from cron); raises ``NotSchemaOwner`` otherwise."""
        if retention_days is None:
            retention_days = self._settings().history_retention_days
        with self._engines.engine.begin() as connection:
            return history_data.maintain(
                ConnectionExecutor(connection), days_ahead=days_ahead, retention_days=retention_days
            )
