"""Durable steps: ``ctx.step(name, fn, ...)`` runs ``fn`` at most once per job once it completes.

A step's JSON result is saved when it completes; a later attempt of the same job (a retry, a
rescue after a crash) gets the saved result back without calling ``fn``. Where it is saved
depends on how the job runs:

- leased: in a short transaction of its own on the handlers' engine, right after ``fn``
  returns, fenced by the job's lease (``data.steps.save``): a worker that lost the lease
  saves nothing and gets ``LeaseLost``;
- atomic: in the job's own claim transaction, inside a savepoint around ``fn``, so the step's
  writes in ``ctx.session`` and its saved result commit together or roll back together.

An attempt reads its job's saved steps once, at its first step (``AttemptSteps``); a job that
never calls ``ctx.step`` costs nothing here. ``step_key`` is pure: the idempotency key of a
step, the same in every attempt on every worker.
"""

from __future__ import annotations

import asyncio
import inspect
import threading
import unicodedata
import uuid
from collections.abc import Callable
from typing import Any, Final, TypeVar

from sqlalchemy.orm import Session, SessionTransaction

from pgqueue import codec, uow
from pgqueue.data import steps as steps_data
from pgqueue.db import Executor, executor_for
from pgqueue.errors import ValidationError

STEP_NAME_MAX: Final = 200
# The names of the steps pgqueue saves itself (``pgqueue.suspension``) begin with it; a
# handler's own step names may not.
RESERVED_PREFIX: Final = "pgqueue:"
T = TypeVar("T")
# Fixed forever: step keys derive from it, and a key must never change for a saved step.
_KEY_NAMESPACE: Final = uuid.UUID("5b0f3c1e-8d2a-4f6e-9a47-3c8e2d1b7f60")


def checked_name(what: str, value: object, limit: int) -> str:
    """``value`` as the name of a step or a signal (``what``): a non-empty string of at most
    ``limit`` characters without control characters or lone surrogates."""
    if not isinstance(value, str):
        raise ValidationError(f"{what} name must be a string, got {type(value).__name__}")
    if not value:
        raise ValidationError(f"{what} name must not be empty")
    if len(value) > limit:
        raise ValidationError(f"{what} name {value[:40]!r}... is longer than {limit} characters")
    if any(unicodedata.category(c) in ("Cc", "Cs") for c in value):
        raise ValidationError(f"{what} name {value!r} has control characters or lone surrogates")
    return value


def step_name(value: object) -> str:
    """A step name: a non-empty string of at most ``STEP_NAME_MAX`` characters without control
    characters, outside the prefix pgqueue keeps for its own steps."""
    value = checked_name("step", value, STEP_NAME_MAX)
    if value.startswith(RESERVED_PREFIX):
        raise ValidationError(
            f"step name {value!r} starts with {RESERVED_PREFIX!r}, which pgqueue keeps for the "
            "steps of ctx.sleep and ctx.wait_for_signal"
        )
    return value


def step_key(job_id: int, name: object) -> str:
    """The idempotency key of step ``name`` of job ``job_id``: a UUID (36 characters, safe as
    an HTTP header value), the same in every attempt and on every worker, different for
    another job or another name."""
    return str(uuid.uuid5(_KEY_NAMESPACE, f"{job_id}/{step_name(name)}"))


# --- one attempt ------------------------------------------------------------------------------


class AttemptSteps:
    """The steps of one attempt of one job: the saved results (read at the first step), the
    names this attempt completed, and the step running now.

    ``session`` gives the handler's session: for an atomic job the claim transaction, which
    every read and save joins; for a leased job only its engine is used, for transactions of
    their own. Steps of one attempt run one after another: a step started while another runs
    is refused, as is a name this attempt already completed.
    """

    def __init__(
        self,
        *,
        job_id: int,
        lease_token: str,
        atomic: bool,
        session: Callable[[], Session],
        max_bytes: int,
        max_depth: int,
    ) -> None:
        self.job_id = job_id
        self._token = lease_token
        self._atomic = atomic
        self._session = session
        self._max_bytes = max_bytes
        self._max_depth = max_depth
        self._lock = threading.Lock()
        self._saved: dict[str, str] | None = None
        self._completed: set[str] = set()
        self._running: str | None = None
        self._savepoint: SessionTransaction | None = None

    def start(self, name: object, *, internal: bool = False) -> tuple[bool, Any]:
        """Begin step ``name``: ``(True, saved result)`` when an earlier attempt completed it
        (nothing to run), else ``(False, None)``, and the caller runs the step and then calls
        ``finish`` (or ``abandon`` when it raised). ``internal``: a name pgqueue built (under
        ``RESERVED_PREFIX``, from checked parts), taken as it is."""
        name = str(name) if internal else step_name(name)
        with self._lock:
            if self._running is not None:
                raise ValidationError(
                    f"step {name!r} of job {self.job_id} started while step {self._running!r} "
                    "is still running: run a job's steps one after another"
                )
            if name in self._completed:
                raise ValidationError(
                    f"step {name!r} of job {self.job_id} already completed in this attempt: "
                    "step names must be unique per job"
                )
            self._running = name
        try:
            saved = self._saved
            if saved is None:
                saved = self._saved = self._load()
            if name in saved:
                self._done(name)
                return True, codec.load_json(saved[name])
            if self._atomic:
                self._savepoint = self._session().begin_nested()
        except BaseException:
            self._running = None
            raise
        return False, None

    def finish(self, name: str, value: Any) -> Any:
        """Save the running step's ``value`` (it must be JSON) and return it as saved, the
        value later attempts get (read back from its JSON, so every attempt gets a copy)."""
        try:
            try:
                encoded = codec.encode_result(
                    value, max_bytes=self._max_bytes, max_depth=self._max_depth
                )
            except ValidationError as exc:
                raise type(exc)(
                    f"step {name!r} of job {self.job_id} returned a value that cannot be "
                    f"saved: {exc}"
                ) from None
            self._save(name, encoded)
        except BaseException:
            self.abandon()
            raise
        self._done(name)
        return codec.load_json(encoded)

    def abandon(self) -> None:
        """The running step raised (or its result was refused): nothing is saved, and an atomic
        job's writes made in the step are rolled back. The name may be run again."""
        savepoint, self._savepoint = self._savepoint, None
        try:
            if savepoint is not None and savepoint.is_active:
                savepoint.rollback()
        finally:
            self._running = None

    def read(self, work: Callable[[Executor], T]) -> T:
        """``work(executor)`` where this attempt's steps read: in a short transaction apart
        from the handler's session (leased jobs only; see ``pgqueue.suspension``)."""
        return uow.apart_from(self._session(), work)

    def _done(self, name: str) -> None:
        self._completed.add(name)
        self._running = None

    def _load(self) -> dict[str, str]:
        if self._atomic:
            return steps_data.load_saved(executor_for(self._session()), self.job_id)
        return uow.apart_from(self._session(), lambda db: steps_data.load_saved(db, self.job_id))

    def _save(self, name: str, encoded: str) -> None:
        if self._atomic:
            steps_data.save(executor_for(self._session()), self.job_id, self._token, name, encoded)
            savepoint, self._savepoint = self._savepoint, None
            if savepoint is not None:
                savepoint.commit()
            return
        uow.apart_from(
            self._session(),
            lambda db: steps_data.save(db, self.job_id, self._token, name, encoded),
        )


def run_step(steps: AttemptSteps, name: object, call: Callable[[], Any]) -> Any:
    """``ctx.step``: the saved result of step ``name``, or ``call()``'s, saved."""
    if inspect.iscoroutinefunction(call):
        function = getattr(call, "func", call)
        raise ValidationError(
            f"step {name!r}: {getattr(function, '__qualname__', function)!s} is a coroutine "
            "function; use await ctx.astep(...)"
        )
    found, saved = steps.start(name)
    if found:
        return saved
    try:
        value = call()
    except BaseException:
        steps.abandon()
        raise
    if inspect.isawaitable(value):
        if inspect.iscoroutine(value):
            value.close()  # never started: nothing of it ran
        steps.abandon()
        raise ValidationError(
            f"step {name!r} returned an awaitable; use await ctx.astep(...) for async steps"
        )
    return steps.finish(str(name), value)


async def arun_step(steps: AttemptSteps, name: object, call: Callable[[], Any]) -> Any:
    """``await ctx.astep``: ``run_step`` for coroutine functions (plain functions too); the
    database work runs in a thread, off the event loop."""
    found, saved = await asyncio.to_thread(steps.start, name)
    if found:
        return saved
    try:
        value = call()
        if inspect.isawaitable(value):
            value = await value
    except BaseException:
        steps.abandon()
        raise
    return await asyncio.to_thread(steps.finish, str(name), value)
