"""The job edits of ``pgq.admin``: give a job that has not started a new ``run_at``
(``reschedule``, ``run_now``) or a new priority (``set_priority``), each audited; the audit
records of the actions on one job; and the audit log's pages.

Each action is one data-layer operation and its audit record in one transaction
(``admin_runner``): the record exists exactly when the action took effect. Arguments are
checked before any SQL runs. ``admin.Admin`` holds these methods with the rest of the admin API.

A workflow's member may be rescheduled or given another priority like any job: these edits
change when and in what order it runs, never whether or with what result, so its workflow's
countdown is unaffected (unlike a retry, cancel or delete, which ``cancel_workflow`` does
whole). Its closing marker, which never runs, is refused.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from typing import Any, TypeVar

from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm import Session

from pgqueue import validation
from pgqueue.admin_records import (
    DEFAULT_AUDIT_PAGE,
    AuditEntry,
    AuditPage,
    audit_page_arguments,
    audit_source,
    checked_actor,
    reschedule_time,
)
from pgqueue.admin_runner import AdminRunner, SessionWork
from pgqueue.admin_values import check_job_id
from pgqueue.data import audit as audit_data
from pgqueue.data import job_edits as edits_data
from pgqueue.db import Executor

T = TypeVar("T")


def audited(
    work: SessionWork[T],
    *,
    actor: str,
    source: str,
    action: str,
    target: Callable[[T], dict[str, Any] | None],
) -> SessionWork[T]:
    """``work``, then, in the same transaction, the audit record of ``action`` on ``target(its
    result)``; no record when ``target`` gives None (the action changed nothing)."""

    def run(session: Session, ex: Executor) -> T:
        result = work(session, ex)
        acted_on = target(result)
        if acted_on is not None:
            audit_data.record(ex, actor=actor, source=source, action=action, target=acted_on)
        return result

    return run


class JobEdits(AdminRunner):
    """The job edits and the audit log of ``pgq.admin`` (see the module)."""

    def reschedule(
        self,
        job_id: int,
        run_at: dt.datetime,
        *,
        actor: str | None = None,
        source: str = "api",
        session: Session | None = None,
    ) -> dt.datetime:
        """Run job ``job_id`` at ``run_at`` (aware; within ten years of now, a past time meaning
        now) instead of when it was to run: its row and its ticket, with an audit record
        (``actor``, default ``default_actor()``; ``source``: ``api``, ``cli`` or
        ``dashboard``), in one transaction (``session``'s when given). Returns the ``run_at``
        written.

        Only a job that has not started: QUEUED, RETRYING (its attempt count is kept), or
        WAITING on dependencies (its ticket takes ``run_at`` when they succeed). A RUNNING or
        finished job, a suspended one (``ctx.sleep``, ``ctx.wait_for_signal``: send its signal
        instead) and a workflow's closing marker are refused with InvalidStateTransition
        naming why; JobNotFound when there is no such job. Nothing is written then."""
        work = self._reschedule(job_id, reschedule_time(run_at), actor, source)
        return self._write_session(session, work)

    async def areschedule(
        self,
        job_id: int,
        run_at: dt.datetime,
        *,
        actor: str | None = None,
        source: str = "api",
        session: AsyncSession | None = None,
    ) -> dt.datetime:
        """``reschedule`` for asyncio (in ``session``'s transaction when given)."""
        work = self._reschedule(job_id, reschedule_time(run_at), actor, source)
        return await self._awrite_session(session, work)

    def run_now(
        self,
        job_id: int,
        *,
        actor: str | None = None,
        source: str = "api",
        session: Session | None = None,
    ) -> dt.datetime:
        """``reschedule`` to the database's ``now()``: an idle worker of its queue claims it at
        once (unless something else holds it back: ``explain_job`` says what). Returns the
        ``run_at`` written."""
        return self._write_session(session, self._reschedule(job_id, None, actor, source))

    async def arun_now(
        self,
        job_id: int,
        *,
        actor: str | None = None,
        source: str = "api",
        session: AsyncSession | None = None,
    ) -> dt.datetime:
        """``run_now`` for asyncio (in ``session``'s transaction when given)."""
        return await self._awrite_session(session, self._reschedule(job_id, None, actor, source))

    def _reschedule(
        self, job_id: int, run_at: dt.datetime | None, actor: str | None, source: str
    ) -> SessionWork[dt.datetime]:
        """The work of ``reschedule`` to ``run_at`` (checked), or of ``run_now`` (None)."""
        job_id = check_job_id(job_id)
        who, where = checked_actor(actor, source)
        return audited(
            lambda _, ex: edits_data.reschedule(ex, job_id, run_at),
            actor=who,
            source=where,
            action="reschedule" if run_at is not None else "run_now",
            target=lambda written: {"job_id": job_id, "run_at": written.isoformat()},
        )

    def set_priority(
        self,
        job_id: int,
        priority: int,
        *,
        actor: str | None = None,
        source: str = "api",
        session: Session | None = None,
    ) -> None:
        """Give job ``job_id`` ``priority`` (as enqueue takes it: lower runs first, -32768 to
        32767) on its row and its ticket, audited as ``reschedule`` is. Only a job that has
        not started (QUEUED, RETRYING, WAITING; a suspended one too); others are refused as
        ``reschedule`` refuses them."""
        self._write_session(session, self._set_priority(job_id, priority, actor, source))

    async def aset_priority(
        self,
        job_id: int,
        priority: int,
        *,
        actor: str | None = None,
        source: str = "api",
        session: AsyncSession | None = None,
    ) -> None:
        """``set_priority`` for asyncio (in ``session``'s transaction when given)."""
        await self._awrite_session(session, self._set_priority(job_id, priority, actor, source))

    def _set_priority(
        self, job_id: int, priority: int, actor: str | None, source: str
    ) -> SessionWork[None]:
        job_id = check_job_id(job_id)
        value = validation.priority(priority)
        who, where = checked_actor(actor, source)
        return audited(
            lambda _, ex: edits_data.reprioritize(ex, job_id, value),
            actor=who,
            source=where,
            action="set_priority",
            target=lambda _: {"job_id": job_id, "priority": value},
        )

    def _audit_if(
        self,
        actor: str | None,
        source: str,
        action: str,
        target: Callable[[T], dict[str, Any] | None],
    ) -> Callable[[SessionWork[T]], SessionWork[T]]:
        """What makes the work of ``retry_job``, ``cancel_job``, ``delete_job`` or ``signal``
        ``audited`` when an ``actor`` is given, and leaves it as it is otherwise; the
        arguments checked either way."""
        if actor is None:
            audit_source(source)
            return lambda work: work
        who, where = checked_actor(actor, source)
        return lambda work: audited(work, actor=who, source=where, action=action, target=target)

    # -- the audit log -----------------------------------------------------------------------

    def audit_log(self, *, limit: int = DEFAULT_AUDIT_PAGE, before: int | None = None) -> AuditPage:
        """The audit log's newest ``limit`` records (bulk actions, and the audited actions on
        one job or schedule), newest first; ``before`` (``AuditPage.older``) pages back."""
        return self._read_session(self._audit_log(limit, before))

    async def aaudit_log(
        self, *, limit: int = DEFAULT_AUDIT_PAGE, before: int | None = None
    ) -> AuditPage:
        """``audit_log`` for asyncio."""
        return await self._aread_session(self._audit_log(limit, before))

    def _audit_log(self, limit: int, before: int | None) -> SessionWork[AuditPage]:
        limit, before = audit_page_arguments(limit, before)

        def read(_: Session, ex: Executor) -> AuditPage:
            rows = audit_data.page(ex, limit=limit + 1, before=before)
            entries = tuple(_entry(row) for row in rows)
            more = len(entries) > limit
            entries = entries[:limit]
            return AuditPage(entries, entries[-1].id if more else None)

        return read


def _entry(row: Any) -> AuditEntry:
    record_id, at, actor, source, action, target, count = row
    return AuditEntry(record_id, at, actor, source, action, dict(target or {}), int(count))
