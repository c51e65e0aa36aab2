"""Runs one claimed job and turns what happened into exactly one outcome (one transition).

Leased jobs run outside any pgqueue transaction; the outcome is returned to the caller, and the
completer writes it in a batch. Atomic jobs run inside the transaction that claimed them: the
handler's writes (in a savepoint) and the outcome commit together, or the whole claim rolls
back. A job of a task the worker does not register is given back unrun
(``worker.unregistered``). What follows a failed attempt is decided by
``backoff.after_failure``. A handler that
raised ``Snooze`` gets a snooze outcome (its SQL decides whether the job may still snooze for
free); one that suspended itself (``ctx.sleep``, ``ctx.wait_for_signal``: ``Suspend``) gets a
suspend outcome. Progress the handler reported and no heartbeat wrote goes with the outcome.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import threading
import time
from collections.abc import Callable, Coroutine, Iterator
from typing import Any, NoReturn

from sqlalchemy.orm import Session

from pgqueue import backoff, codec
from pgqueue.config import Settings
from pgqueue.context import JobContext, Retry, Snooze
from pgqueue.data import outcomes as outcomes_data
from pgqueue.db import executor_for
from pgqueue.errors import (
    AtomicSessionMisuse,
    AtomicTransactionLost,
    UnknownTask,
    ValidationError,
    error_line,
    handler_error_text,
    hide_row_values,
    pgqueue_logger,
    storable_text,
)
from pgqueue.jobs import ClaimedJob, Outcome
from pgqueue.sqlstates import is_transaction_ended
from pgqueue.states import OutcomeKind
from pgqueue.suspension import Suspend
from pgqueue.tasks import Task, TaskRegistry
from pgqueue.tracing import RunSpan, tracing_for
from pgqueue.worker.execution import Execution
from pgqueue.worker.unregistered import UnregisteredTasks

log = pgqueue_logger("pgqueue.worker")


class _StartTooLate(Exception):
    """An async rate-limited handler's coroutine reached the event loop past its start-by time."""


async def _started_by(coroutine: Coroutine[Any, Any, Any], start_by: float) -> Any:
    """Run ``coroutine`` unless the loop got to it after ``start_by`` (monotonic)."""
    if time.monotonic() > start_by:
        coroutine.close()
        raise _StartTooLate
    return await coroutine


# The error of a cancelled attempt (short and ASCII: storable as it is).
CANCELLED_WHILE_RUNNING = "cancelled while running"
CANCELLED_BEFORE_START = "cancelled before its handler started"


class JobTimeout(Exception):
    """The handler ran past its task's ``timeout``."""


def _interrupts_caller(exc: BaseException) -> bool:
    """Whether ``exc``, raised in a handler run in its caller's thread, is the caller's to
    handle: an exception that is not an ``Exception``, other than pgqueue's own suspension and
    an async handler's cancellation."""
    return not isinstance(exc, Exception | Suspend | asyncio.CancelledError)


class Executor:
    """Resolves tasks, calls handlers, and maps results and exceptions to outcomes."""

    def __init__(
        self,
        registry: TaskRegistry,
        settings: Settings,
        session_factory: Callable[[], Session],
        loop: Callable[[], asyncio.AbstractEventLoop],
        unregistered: UnregisteredTasks | None = None,
        *,
        interrupts_propagate: bool = False,
        settle_by_handler: Callable[[Execution], bool] | None = None,
    ) -> None:
        self.registry = registry
        # A worker's ``Slots.settle_by_handler``: whether a returned handler still owns its
        # attempt (its timeout did not end it first). Without it (immediate mode) it always does.
        self._settle_by_handler = settle_by_handler
        # Immediate mode runs handlers in its caller's thread, where a KeyboardInterrupt may be
        # a real Ctrl-C, and the other exceptions that are not ``Exception``s (pytest's fail or
        # skip, a test's timeout) are the caller's: there they propagate instead of failing the
        # attempt. A worker's pool threads receive no signals: whatever a handler raises there
        # is its attempt's failure.
        self.interrupts_propagate = interrupts_propagate
        # A worker's: jobs of tasks not registered here go back to their queue. Without it (one
        # process runs everything, as in immediate mode) such a job fails, as nobody else would
        # run it.
        self.unregistered = unregistered
        self.settings = settings
        self.session_factory = session_factory
        self._loop = loop
        # None when tracing is off: each run then tests this once and nothing more.
        self.tracing = tracing_for(settings)

    # -- leased ------------------------------------------------------------------------------

    def run_leased(self, execution: Execution) -> Outcome:
        tracing = self.tracing
        if tracing is None:
            return self._run_leased(execution, None)
        with tracing.run(execution.job) as span:
            outcome = self._run_leased(execution, span)
            return span.finish(outcome, timed_out=execution.timed_out)

    def _run_leased(self, execution: Execution, span: RunSpan | None) -> Outcome:
        job = execution.job
        if execution.past_start_by():
            return self._not_started(job)
        # Claimed ahead, or taken back after a lost claim answer, and cancelled since: the job
        # is RUNNING to the database, but its handler has not started, so it never does.
        if execution.cancelled:
            return Outcome.cancelled(job, CANCELLED_BEFORE_START)
        if self.unregistered is not None and self.unregistered.gives_back(job):
            return Outcome.release(job)
        try:
            task = self._resolve(job)
        except (UnknownTask, ValidationError) as exc:
            return Outcome.fail(job, self._storable(self._describe(exc)))
        context = self._context(job, task, execution, self.session_factory)
        try:
            result = self._call(task, job, context, execution)
            if context is not None and context.session_opened:
                settle = self._settle_by_handler
                if settle is None or settle(execution):
                    context.session.commit()
                else:
                    # The attempt ended at its timeout while the handler ran on: its writes
                    # must not outlive it (its outcome was written then; this one is dropped).
                    context.session.rollback()
            outcome = self._success(job, result, execution)
        except _StartTooLate:
            outcome = self._not_started(job)
        except BaseException as exc:
            if span is not None and not isinstance(exc, Suspend):
                span.failed(exc)
            if context is not None and context.session_opened:
                _discard(context.session.rollback, job.id)
            if self.interrupts_propagate and _interrupts_caller(exc):
                raise
            outcome = self._failure(job, task, exc, execution)
        finally:
            if context is not None and context.session_opened:
                _discard(context.session.close, job.id)
        if context is not None:  # only a handler with a context reports progress
            outcome.progress = execution.unwritten_progress()
        return outcome

    # -- atomic ------------------------------------------------------------------------------

    def run_atomic(
        self, session: Session, job: ClaimedJob, cancel_event: threading.Event
    ) -> Outcome:
        """Run an atomic job in ``session``'s open transaction (which holds the job's row) and
        write its outcome there.

        The handler runs in a savepoint, and a success is written inside it: on failure (the
        handler raised, its result cannot be stored, or it was cancelled) the handler's writes
        are rolled back while the retry/failure record still commits. An outcome the database
        refuses is replaced by a failed attempt (``unrecorded``) with the handler's writes
        rolled back; only a failure to write that too fails the transaction, and the caller
        then records the failed attempt apart (``lost_attempt``). The caller commits.
        """
        tracing = self.tracing
        if tracing is None:
            return self._run_atomic(session, job, cancel_event, None)
        with tracing.run(job) as span:
            return span.finish(self._run_atomic(session, job, cancel_event, span))

    def _run_atomic(
        self,
        session: Session,
        job: ClaimedJob,
        cancel_event: threading.Event,
        span: RunSpan | None,
    ) -> Outcome:
        execution = Execution(
            job, 0.0, None, time.monotonic(), start_by=job.start_by, _event=cancel_event
        )
        if execution.past_start_by():
            return self._record_atomic(session, job, self._not_started(job))
        try:
            task = self._resolve(job)
        except (UnknownTask, ValidationError) as exc:
            failed = Outcome.fail(job, self._storable(self._describe(exc)))
            return self._record_atomic(session, job, failed)
        context = self._context(job, task, execution, lambda: session)
        outcome: Outcome | None = None
        savepoint = session.begin_nested()
        try:
            with transaction_kept(session, job.task_name):
                result = self._call(task, job, context, execution)
            session.flush()  # the handler's pending writes: their errors are the handler's
            # Deferred constraints are checked now, in the handler's savepoint, not at the
            # commit, where a violation would undo the claim along with the handler's writes.
            outcomes_data.check_deferred_constraints(executor_for(session))
            outcome = self._success(job, result, execution)
            if context is not None:
                outcome.progress = execution.unwritten_progress()
            if outcome.kind is not OutcomeKind.COMPLETE:
                # A result that cannot be stored, or a cancel seen as it returned: the
                # handler's writes commit with a completion only, never beside a failure.
                savepoint.rollback()
                return self._record_atomic(session, job, outcome)
            outcomes_data.record_outcomes(executor_for(session), [outcome])
            savepoint.commit()
            return outcome
        except BaseException as exc:
            if span is not None:
                span.failed(exc)
            if self.interrupts_propagate and _interrupts_caller(exc):
                raise  # the caller's transaction rolls back the claim with the handler's writes
            if is_transaction_ended(exc):
                # The attempt's transaction is gone: nothing written from here on would be
                # part of it. The caller rolls back and records the failed attempt apart.
                raise AtomicTransactionLost(
                    f"atomic task {job.task_name!r}: the attempt's transaction ended while the "
                    "handler ran (a ROLLBACK or COMMIT sent through its session)"
                ) from exc
            if savepoint.is_active:
                savepoint.rollback()
            if outcome is None and isinstance(exc, _StartTooLate):
                outcome = self._not_started(job)
            elif outcome is None:
                outcome = self._failure(job, task, exc, execution)
                if context is not None:
                    outcome.progress = execution.unwritten_progress()
            else:
                outcome = self.unrecorded(job, outcome, exc)
        return self._record_atomic(session, job, outcome)

    def _record_atomic(self, session: Session, job: ClaimedJob, outcome: Outcome) -> Outcome:
        """Write an atomic job's failure (in a savepoint); if the database refuses it, write
        ``unrecorded``'s failed attempt instead."""
        savepoint = session.begin_nested()
        try:
            outcomes_data.record_outcomes(executor_for(session), [outcome])
            savepoint.commit()
            return outcome
        except Exception as exc:
            if savepoint.is_active:
                savepoint.rollback()
            substitute = self.unrecorded(job, outcome, exc)
        outcomes_data.record_outcomes(executor_for(session), [substitute])
        return substitute

    # -- shared ------------------------------------------------------------------------------

    def _resolve(self, job: ClaimedJob) -> Task[Any, Any]:
        if job.problem is not None:
            raise ValidationError(job.problem)
        task = self.registry.get(job.task_name)
        if not isinstance(job.args, list) or not isinstance(job.kwargs, dict):
            raise ValidationError(
                f"job {job.id} has malformed arguments (args must be a JSON array and kwargs "
                f"an object; got {type(job.args).__name__} and {type(job.kwargs).__name__})"
            )
        task.check_arguments(job.args, job.kwargs)
        return task

    def _context(
        self,
        job: ClaimedJob,
        task: Task[Any, Any],
        execution: Execution,
        session_factory: Callable[[], Session],
    ) -> JobContext | None:
        if not task.pass_context:
            return None
        return JobContext(
            job_id=job.id,
            attempt=job.attempt,
            max_attempts=job.max_attempts,
            queue=job.queue,
            task_name=job.task_name,
            session_factory=session_factory,
            cancel_event=execution.cancel_event(),
            progress_sink=execution.report_progress,
            lease_token=job.lease_token,
            atomic=job.atomic,
            settings=self.settings,
        )

    def _call(
        self,
        task: Task[Any, Any],
        job: ClaimedJob,
        context: JobContext | None,
        execution: Execution,
    ) -> Any:
        if not task.is_async:
            if context is None:
                return task.fn(*job.args, **job.kwargs)
            return task.fn(context, *job.args, **job.kwargs)
        args = [context, *job.args] if context is not None else list(job.args)
        coroutine: Coroutine[Any, Any, Any] = task.fn(*args, **job.kwargs)
        if execution.start_by is not None:
            coroutine = _started_by(coroutine, execution.start_by)
        if task.timeout is not None:
            coroutine = asyncio.wait_for(coroutine, task.timeout)
        future = asyncio.run_coroutine_threadsafe(coroutine, self._loop())
        execution.async_future = future
        try:
            return future.result()
        except concurrent.futures.CancelledError:
            raise asyncio.CancelledError("cancelled") from None
        except TimeoutError:
            raise JobTimeout(f"timed out after {task.timeout}s") from None

    @staticmethod
    def _not_started(job: ClaimedJob) -> Outcome:
        """The outcome of a rate-limited job whose handler could not start by its start-by
        time: given back unstarted, the attempt not counted. Starting it late could put more
        starts in some window than the rate allows; its start stays counted in the window,
        which only ever lowers the rate."""
        late = time.monotonic() - job.start_by if job.start_by is not None else 0.0
        log.info(
            "job %d (%s): its handler could not start within the rate limit's margin after"
            " the claim (%.0f ms late); given back to its queue unstarted",
            job.id,
            job.task_name,
            late * 1000,
        )
        return Outcome.release(job)

    def _success(self, job: ClaimedJob, result: Any, execution: Execution) -> Outcome:
        if execution.cancelled or self._event_set(execution):
            return Outcome.cancelled(job, CANCELLED_WHILE_RUNNING)
        if result is None:  # most handlers return nothing: skip the JSON checks
            return Outcome.complete(job)
        try:
            encoded = codec.encode_result(
                result,
                max_bytes=self.settings.max_payload_bytes,
                max_depth=self.settings.max_json_depth,
            )
        except ValidationError as exc:
            return Outcome.fail(job, self._storable(f"result could not be stored: {exc}"))
        return Outcome.complete(job, encoded)

    def _failure(
        self, job: ClaimedJob, task: Task[Any, Any], exc: BaseException, execution: Execution
    ) -> Outcome:
        if execution.cancelled or self._event_set(execution):
            return Outcome.cancelled(job, CANCELLED_WHILE_RUNNING)
        if isinstance(exc, Snooze):
            return self._snoozed(job, exc)
        if isinstance(exc, Suspend):
            return Outcome.suspend(job, exc.wake_at, exc.signal)
        delay = exc.delay if isinstance(exc, Retry) else None
        return self._after_failure(job, self._error_text(exc), task=task, delay=delay)

    def _snoozed(self, job: ClaimedJob, snooze: Snooze) -> Outcome:
        """The outcome of ``raise Snooze``, with the ``max_snoozes`` setting the statement
        checks the job's count against."""
        return Outcome.snooze(job, snooze.delay, self.settings.max_snoozes)

    @staticmethod
    def _event_set(execution: Execution) -> bool:
        # Atomic jobs are cancelled through the event given to ``run_atomic``.
        event = execution._event
        return event is not None and event.is_set()

    def timed_out(self, execution: Execution) -> Outcome:
        """The outcome for a handler still running past its timeout (retryable failure)."""
        error = f"JobTimeout: still running after the task's timeout of {execution.timeout}s"
        outcome = self._after_failure(execution.job, error)
        outcome.progress = execution.unwritten_progress()
        return outcome

    def failed_attempt(self, job: ClaimedJob, error: str) -> Outcome:
        """A failed attempt with ``error``, retried or failed for good by the task's policy."""
        return self._after_failure(job, error)

    def lost_attempt(self, job: ClaimedJob, exc: BaseException) -> Outcome:
        """The failed attempt that replaces an atomic attempt whose transaction was lost
        (``exc``: the error that ended it, ``AtomicTransactionLost`` when the handler's session
        ended it), retried or failed for good like any other."""
        if isinstance(exc, AtomicTransactionLost):
            why = (
                "the handler's session ended the attempt's transaction (a ROLLBACK or COMMIT "
                "sent through it), which undid the handler's writes"
            )
        else:
            why = (
                f"the attempt's transaction failed ({error_line(exc)}), which undid the "
                "handler's writes"
            )
        error = f"AtomicTransactionLost: {why}; the attempt counts as failed"
        return self._after_failure(job, self._storable(error))

    def unrecorded(self, job: ClaimedJob, outcome: Outcome, exc: BaseException) -> Outcome:
        """What to write instead of ``outcome`` when the database refused it (``exc``): a failed
        attempt, retried or failed for good like any other, whose error says what was refused
        and why. ASCII only: the one text that must be storable whatever the database."""
        kind = str(outcome.kind)
        error = (
            f"OutcomeNotRecorded: this attempt's {kind!r} outcome could not be written "
            f"({error_line(exc)}); the attempt counts as failed"
        )
        return self._after_failure(job, error.encode("ascii", "backslashreplace").decode())

    def _after_failure(
        self,
        job: ClaimedJob,
        error: str,
        *,
        task: Task[Any, Any] | None = None,
        delay: float | None = None,
    ) -> Outcome:
        """The outcome of a failed attempt, as ``backoff.after_failure`` decides it (``delay``:
        asked for by ``Retry``; else the task's backoff)."""
        if task is None:
            task = self.registry.find(job.task_name)
        decision = backoff.after_failure(
            job.attempt,
            job.max_attempts,
            delay=delay,
            schedule=None if task is None else task.backoff_delay,
        )
        error = self._storable(error + decision.note)
        if decision.kind is OutcomeKind.FAIL:
            return Outcome.fail(job, error)
        return Outcome.retry(job, error, decision.delay)

    def _storable(self, error: str) -> str:
        return storable_text(error, self.settings.max_error_bytes)

    def _error_text(self, exc: BaseException) -> str:
        if isinstance(exc, Retry):
            return str(exc)
        return handler_error_text(exc)

    def _describe(self, exc: BaseException) -> str:
        """One line for errors pgqueue itself raises about a job (no traceback); capped like
        every error: a hand-edited row can carry a huge task or argument name."""
        return hide_row_values(f"{type(exc).__name__}: {exc}", exc)


# What a handler may not call on an atomic job's session while it runs.
_TRANSACTION_ENDERS = ("commit", "rollback", "close")


@contextlib.contextmanager
def transaction_kept(session: Session, task_name: str) -> Iterator[None]:
    """While an atomic handler runs, its session refuses ``commit()``, ``rollback()`` and
    ``close()`` (``AtomicSessionMisuse``): its transaction holds the job's row and will hold
    its outcome, which must commit or roll back with the handler's writes, never apart. Set on the session
    itself (not a wrapper), so the handler still gets a real ``Session``."""

    def refusal(name: str) -> Callable[..., NoReturn]:
        def refuse(*args: Any, **kwargs: Any) -> NoReturn:
            raise AtomicSessionMisuse(
                f"{name}() on the session of atomic task {task_name!r}: its transaction holds "
                "the job and commits its outcome with the handler's writes when the handler "
                "returns; raise an exception to roll the attempt back instead"
            )

        return refuse

    for name in _TRANSACTION_ENDERS:
        setattr(session, name, refusal(name))
    try:
        yield
    finally:
        for name in _TRANSACTION_ENDERS:
            session.__dict__.pop(name, None)


def _discard(end: Callable[[], None], job_id: int) -> None:
    """Roll back or close a leased handler's session, whose transaction the attempt does not
    keep. A connection that broke (the server restarted, a pooler dropped it) makes the
    rollback itself fail; its transaction is gone with it, and the attempt's outcome, not the
    worker thread, must carry on."""
    try:
        end()
    except Exception as exc:
        log.warning(
            "job %d: its handler's session could not be rolled back: %s", job_id, error_line(exc)
        )
