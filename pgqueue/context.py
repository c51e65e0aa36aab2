"""What a running handler gets and may raise: ``JobContext`` (its job, session, progress,
cancellation, durable steps, durable sleep and signals) and the exceptions that end an attempt
without being a fault of the code, ``Retry`` ("try again, counting an attempt") and ``Snooze``
("come back later", not counting one).

The worker's executor builds the context and turns these exceptions into the attempt's outcome;
handlers import them from ``pgqueue``.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import functools
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, ParamSpec

from sqlalchemy.orm import Session

from pgqueue import steps, suspension, validation
from pgqueue.errors import ValidationError
from pgqueue.jobs import Progress

if TYPE_CHECKING:
    from pgqueue.config import Settings

P = ParamSpec("P")


class Retry(Exception):
    """Raise from a handler to ask for another attempt after ``delay`` seconds.

    The attempt still counts towards ``max_attempts``; ``delay=None`` uses the task's backoff.
    The attempt's error is the message alone, ``retry requested: <reason>``, without a
    traceback: a retry asked for is not a fault, and the frames would be pgqueue's own.
    """

    def __init__(self, delay: float | None = None, reason: str | None = None) -> None:
        super().__init__("retry requested" if reason is None else f"retry requested: {reason}")
        self.delay = None if delay is None else validation.delay(delay)
        self.reason = reason


class SoftTimeout(Exception):
    """Raised inside a handler run by the process pool when its task's ``soft_timeout`` passes:
    the handler may catch it to clean up before its hard ``timeout`` stops its process. Not
    caught, it fails the attempt like any other exception (retried by the task's policy)."""


class Snooze(Exception):
    """Raise from a handler to run the job again ``delay`` seconds (or a ``timedelta``) from now
    without using an attempt: "come back later", not a failure.

    The job goes back to QUEUED with a ticket at ``now() + delay``; its ``attempts`` stay what
    they were before this run and no error is recorded; ``snoozes`` counts it. A job that already
    snoozed ``max_snoozes`` times (a setting, 100 by default) is written as a failed attempt
    instead, with an error saying so: retried after ``delay``, or failed for good on its last
    attempt. In an atomic task the handler's writes roll back and the snooze is recorded.
    A bad ``delay`` raises ``ValidationError`` (a ``ValueError``) where the ``Snooze`` is made.
    """

    def __init__(self, delay: float | dt.timedelta, reason: str | None = None) -> None:
        super().__init__("snoozed" if reason is None else f"snoozed: {reason}")
        if delay is None:
            raise ValidationError("Snooze needs a delay: seconds (a number) or a timedelta")
        try:
            checked = validation.delay(delay)
        except ValidationError as exc:
            raise ValidationError(f"Snooze {exc}") from None
        assert checked is not None
        self.delay: float = checked
        self.reason = reason


class JobContext:
    """What a ``pass_context=True`` handler receives as its first argument.

    ``session`` is a SQLAlchemy session: for atomic tasks, the very transaction that claimed the
    job (its writes commit together with the job's completion); for leased tasks a fresh session
    that pgqueue commits when the handler returns and rolls back when it raises. ``step`` runs
    a durable step (``pgqueue.steps``); ``step_key`` gives its idempotency key.
    """

    def __init__(
        self,
        *,
        job_id: int,
        attempt: int,
        max_attempts: int,
        queue: str,
        task_name: str,
        session_factory: Callable[[], Session],
        cancel_event: threading.Event,
        progress_sink: Callable[[Progress], None] | None = None,
        lease_token: str | None = None,
        atomic: bool = False,
        settings: Settings | None = None,
    ) -> None:
        self.job_id = job_id
        self.attempt = attempt
        self.max_attempts = max_attempts
        self.queue = queue
        self.task_name = task_name
        self._session_factory = session_factory
        self._session: Session | None = None
        self._cancel_event = cancel_event
        # Progress: the latest reported, and where the worker collects it for the heartbeat.
        self.last_progress: Progress | None = None
        self._progress_sink = progress_sink
        self._lease_token = lease_token
        self._atomic = atomic
        self._settings = settings
        self._steps: steps.AttemptSteps | None = None
        self._sleeps = 0  # ``ctx.sleep`` calls of this run: the n-th is step pgqueue:sleep:<n>

    @property
    def session(self) -> Session:
        if self._session is None:
            self._session = self._session_factory()
        return self._session

    @property
    def session_opened(self) -> bool:
        return self._session is not None

    @property
    def cancel_requested(self) -> bool:
        """True once ``cancel_job`` was called for this job (seen within one heartbeat), or once
        the task's ``timeout`` passed (the attempt has failed: return, nothing more counts)."""
        return self._cancel_event.is_set()

    # -- progress ------------------------------------------------------------------------------

    def progress(self, fraction: float, message: str | None = None) -> None:
        """Record how far the job got: ``fraction`` from 0 to 1, and a ``message`` (cut to
        ``validation.PROGRESS_MESSAGE_BYTES`` UTF-8 bytes).

        Only kept in memory: the job's next heartbeat writes the latest value (so at most one
        write per heartbeat interval, however often this is called), and the attempt's outcome
        writes it if no heartbeat did. ``get_job``, ``pgqueue show`` and the dashboard show it.
        Raises ``ValidationError`` (a ``ValueError``) for a fraction that is not a number from 0
        to 1 or a message that is not a string; nothing is recorded then.
        """
        self.last_progress = validation.progress(fraction, message)
        if self._progress_sink is not None:
            self._progress_sink(self.last_progress)

    # -- durable steps -----------------------------------------------------------------------

    def step(self, name: str, fn: Callable[P, Any], /, *args: P.args, **kwargs: P.kwargs) -> Any:
        """Run ``fn(*args, **kwargs)`` as the job's step ``name``, at most once per job once it
        completes: its return value (JSON) is saved, and every later call of this step in
        this job (a retry, a rescue after a crash) returns the saved value without calling
        ``fn``. Returns the value as saved (read back from its JSON).

        A name completes once per job: calling it again in the same attempt raises
        ``ValidationError``. A leased job saves in a transaction of its own right after ``fn``
        returns (``LeaseLost`` when this worker no longer holds the job); an atomic job saves in
        its claim transaction, so the step's writes and its result commit together. For
        ``async def`` steps use ``await ctx.astep(...)``.
        """
        return steps.run_step(self._attempt_steps(), name, functools.partial(fn, *args, **kwargs))

    async def astep(
        self, name: str, fn: Callable[P, Any], /, *args: P.args, **kwargs: P.kwargs
    ) -> Any:
        """``step`` for ``async def`` handlers: awaits ``fn``'s result when it is awaitable (a
        coroutine function's), and reads and saves off the event loop."""
        call = functools.partial(fn, *args, **kwargs)
        return await steps.arun_step(self._attempt_steps(), name, call)

    # -- durable sleep and signals ---------------------------------------------------------

    def sleep(self, seconds: float | dt.timedelta) -> None:
        """Suspend the job for ``seconds`` (a number or a ``timedelta``), durably: this run of
        the handler ends here, the job goes back to its queue (QUEUED, holding no worker slot
        and no lease, no attempt used) and runs again once the time has come, from the top.
        That run's ``ctx.sleep`` returns at once, and its ``ctx.step`` calls return their saved
        results: code before a sleep that must not run twice goes in ``ctx.step``.

        Sleeps are told apart by their order in the run (the n-th ``sleep`` call is the n-th
        sleep), so a handler must reach them in the same order every run. Leased tasks only
        (``ValidationError`` in an atomic one, or outside a worker). Writes made in
        ``ctx.session`` before it are rolled back, as for any run that does not return.
        ``seconds`` is at most ``validation.MAX_DELAY_SECONDS`` (3650 days): a longer, negative
        or non-finite one raises ``ValidationError`` here, before anything is stored.
        """
        checked = validation.bounded_seconds(seconds, "sleep")
        self._sleeps += 1
        suspension.sleep(self._suspendable("sleep"), self._sleeps, checked)

    def wait_for_signal(self, name: str, *, timeout: float | dt.timedelta) -> Any:
        """The payload of signal ``name`` sent to this job (``pgq.signal(job_id, name,
        payload)``), waiting for it durably: until it arrives the job is suspended as by
        ``sleep`` (no slot, no lease, no attempt), and the signal wakes it. A signal sent
        before the wait is returned at once; every later run of the handler gets the same
        payload back (each signal name is delivered once per job: wait for it once).

        Raises ``pgqueue.SignalTimeout`` when no signal ``name`` was stored within ``timeout``
        seconds (a number or a ``timedelta``, required, at most ``validation.MAX_DELAY_SECONDS``
        like ``sleep``'s) of the wait's start, database clock; the handler may catch it, and
        uncaught it fails the attempt like any exception.
        Leased tasks only (``ValidationError`` in an atomic one, or outside a worker).
        """
        checked_name = suspension.signal_name(name)
        checked = validation.bounded_seconds(timeout, "wait_for_signal timeout")
        return suspension.wait_for_signal(
            self._suspendable("wait_for_signal"), checked_name, checked
        )

    async def asleep(self, seconds: float | dt.timedelta) -> None:
        """``sleep`` for ``async def`` handlers: its database work runs in a thread, off the
        event loop, so other coroutines of the worker's loop go on meanwhile."""
        checked = validation.bounded_seconds(seconds, "sleep")
        self._sleeps += 1
        attempt_steps = self._suspendable("asleep")
        await asyncio.to_thread(suspension.sleep, attempt_steps, self._sleeps, checked)

    async def await_signal(self, name: str, *, timeout: float | dt.timedelta) -> Any:
        """``wait_for_signal`` for ``async def`` handlers: its database work runs in a thread,
        off the event loop."""
        checked_name = suspension.signal_name(name)
        checked = validation.bounded_seconds(timeout, "await_signal timeout")
        attempt_steps = self._suspendable("await_signal")
        return await asyncio.to_thread(
            suspension.wait_for_signal, attempt_steps, checked_name, checked
        )

    def _suspendable(self, call: str) -> steps.AttemptSteps:
        if self._atomic:
            raise ValidationError(
                f"ctx.{call} in atomic task {self.task_name!r}: an atomic job runs inside the "
                "transaction that claimed it, which cannot stay open across a suspension; make "
                "the task leased (atomic=False)"
            )
        return self._attempt_steps()

    def step_key(self, name: str) -> str:
        """The idempotency key of step ``name`` of this job, to pass to external APIs (e.g. as
        an ``Idempotency-Key`` header): a UUID, the same in every attempt and on every worker,
        different for another job or step."""
        return steps.step_key(self.job_id, name)

    def _attempt_steps(self) -> steps.AttemptSteps:
        attempt_steps = self._steps
        if attempt_steps is None:
            if self._lease_token is None or self._settings is None:
                raise ValidationError(
                    f"job {self.job_id} has no lease: durable steps run only in jobs run by a "
                    "pgqueue worker"
                )
            attempt_steps = self._steps = steps.AttemptSteps(
                job_id=self.job_id,
                lease_token=self._lease_token,
                atomic=self._atomic,
                session=lambda: self.session,
                max_bytes=self._settings.max_payload_bytes,
                max_depth=self._settings.max_json_depth,
            )
        return attempt_steps

    def __repr__(self) -> str:
        return f"JobContext(job_id={self.job_id}, attempt={self.attempt}, task={self.task_name!r})"
