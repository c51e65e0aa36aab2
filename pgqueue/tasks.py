"""Tasks: the ``@task`` decorator, the registry, and the enqueue API.

A :class:`Task` wraps a function with its defaults (queue, priority, attempts, backoff, mode).
``task.enqueue(...)`` validates everything (names, JSON arguments against the function's
signature, size, delay) before any SQL runs, then inserts the job and its ticket in one
statement: in its own short transaction, or in the caller's session via
``task.configure(session=s)`` so the job commits or rolls back with the caller's own writes.
``await task.aenqueue(...)`` is the same for asyncio code, in its own transaction or in an
``AsyncSession``'s (``pgqueue.aio`` runs it); the validation is the same, before any SQL.
"""

from __future__ import annotations

import datetime as dt
import inspect
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Generic, ParamSpec, Protocol, TypedDict, TypeVar

from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm import Session

from pgqueue import backoff, codec, validation
from pgqueue.aio import check_async_session
from pgqueue.errors import UnknownTask, ValidationError
from pgqueue.jobs import NewJob
from pgqueue.workflows.canvas import Signature

if TYPE_CHECKING:
    from pgqueue.config import Settings
    from pgqueue.enqueuer import Enqueuer

P = ParamSpec("P")
R = TypeVar("R")


class JobSink(Protocol):
    """What a task needs of its queue object (``PgQueue``): the settings its jobs are checked
    against, and the enqueuer it hands them to."""

    @property
    def settings(self) -> Settings: ...

    @property
    def enqueuer(self) -> Enqueuer: ...


@dataclass(frozen=True, slots=True)
class EnqueueOptions:
    """Per-enqueue overrides of a task's defaults (all validated on creation)."""

    session: Session | AsyncSession | None = None
    queue: str | None = None
    priority: int | None = None
    max_attempts: int | None = None
    delay: float | None = None
    run_at: dt.datetime | None = None
    unique_key: str | None = None
    depends_on: tuple[int, ...] | None = None
    concurrency_key: str | None = None
    extra: Mapping[str, Any] = field(default_factory=dict)


class TaskOptions(TypedDict, total=False):
    """The options of ``@pgq.task(...)`` (and of the Flask extension's ``task``).

    ``queue`` ("default"), ``priority`` (0, lower first), ``max_attempts`` (3), ``retry`` (a
    backoff policy; exponential with jitter by default), ``atomic`` (run inside the claim
    transaction), ``pass_context`` (first argument is a ``JobContext``), ``lease_seconds``
    (this task's lease instead of the worker's), ``timeout`` (seconds; the attempt fails as
    retryable when exceeded; in the process pool its process is stopped), ``soft_timeout``
    (seconds, process pool only: ``SoftTimeout`` is raised inside the handler, before
    ``timeout``), ``unique_key`` (a function of the job's arguments returning the
    job's unique key, or None), ``concurrency_key`` (a function of the job's arguments
    returning its concurrency key, or a fixed key) and ``key_limit`` (at most this many jobs
    with one key run at once, across all workers).
    """

    queue: str
    priority: int
    max_attempts: int
    retry: backoff.BackoffPolicy | None
    atomic: bool
    pass_context: bool
    lease_seconds: float | None
    timeout: float | None
    soft_timeout: float | None
    unique_key: Callable[..., str | None] | None
    concurrency_key: Callable[..., str] | str | None
    key_limit: int | None


def task_name_for(function: Callable[..., Any], name: str | None) -> str:
    """``name``, or by default the function's module-qualified name (if it fits 63 bytes)."""
    if name is not None:
        return name
    default = f"{_importable_module(function)}.{function.__qualname__}"
    if len(default.encode()) > 63:
        raise ValidationError(f"default task name {default!r} is longer than 63 bytes; pass name=")
    return default


def _importable_module(function: Callable[..., Any]) -> str:
    """The name under which a worker imports ``function``'s module. A script run as
    ``python jobs.py`` or ``python -m jobs`` is ``__main__`` to itself but ``jobs`` to a worker
    given ``jobs:pgq``: a task named ``__main__.send`` would be enqueued under a name no worker
    has."""
    module = function.__module__
    if module != "__main__":
        return module
    main = sys.modules.get("__main__")
    spec = getattr(main, "__spec__", None)
    if spec is not None and spec.name:
        return str(spec.name)
    path = getattr(main, "__file__", None)
    if path:
        return Path(path).stem
    raise ValidationError(
        f"task {function.__qualname__!r} is defined in __main__ with no module a worker could "
        "import it from; pass name= (and define it where the worker imports it)"
    )


class Task(Generic[P, R]):
    """A function registered as a task. Calling it runs the function directly, in-process."""

    def __init__(
        self,
        fn: Callable[P, R],
        *,
        sink: JobSink,
        name: str,
        queue: str = "default",
        priority: int = 0,
        max_attempts: int = 3,
        retry: backoff.BackoffPolicy | None = None,
        atomic: bool = False,
        pass_context: bool = False,
        lease_seconds: float | None = None,
        timeout: float | None = None,
        soft_timeout: float | None = None,
        unique_key: Callable[..., str | None] | None = None,
        concurrency_key: Callable[..., str] | str | None = None,
        key_limit: int | None = None,
    ) -> None:
        self.fn = fn
        self.sink = sink
        self.name = validation.task_name(name)
        self.queue = validation.queue_name(queue)
        self.priority = validation.priority(priority)
        self.max_attempts = validation.max_attempts(max_attempts)
        if retry is not None and not callable(retry):
            raise ValidationError(f"retry must be a backoff policy (callable), got {retry!r}")
        self.retry_policy: backoff.BackoffPolicy = retry or backoff.default()
        self.atomic = bool(atomic)
        self.pass_context = bool(pass_context)
        if lease_seconds is not None:
            validation.positive_seconds(lease_seconds, "lease_seconds")
        self.lease_seconds = lease_seconds
        if timeout is not None:
            validation.positive_seconds(timeout, "timeout")
        self.timeout = timeout
        if soft_timeout is not None:
            validation.positive_seconds(soft_timeout, "soft_timeout")
            if timeout is not None and soft_timeout >= timeout:
                raise ValidationError(
                    f"soft_timeout ({soft_timeout}) must be shorter than timeout ({timeout}): "
                    "it warns the handler before its process is stopped"
                )
        self.soft_timeout = soft_timeout
        self.unique_key_fn = unique_key
        if concurrency_key is not None and not callable(concurrency_key):
            concurrency_key = validation.concurrency_key(concurrency_key)
        self.concurrency_key: Callable[..., str] | str | None = concurrency_key
        if key_limit is not None:
            key_limit = validation.limit_count(key_limit, what="key_limit")
            if concurrency_key is None:
                raise ValidationError("key_limit needs a concurrency_key (a function or a str)")
        self.key_limit = key_limit
        self.is_async = inspect.iscoroutinefunction(fn)
        self._signature = inspect.signature(fn)
        self._arguments = validation.ArgumentCheck(self._signature, context_first=pass_context)
        self.__doc__ = fn.__doc__
        self.__name__ = getattr(fn, "__name__", name)
        self.__wrapped__ = fn

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> R:
        return self.fn(*args, **kwargs)

    def __repr__(self) -> str:
        return f"<Task {self.name} queue={self.queue!r}>"

    def configure(
        self,
        *,
        session: Session | AsyncSession | None = None,
        queue: str | None = None,
        priority: int | None = None,
        max_attempts: int | None = None,
        delay: float | dt.timedelta | None = None,
        run_at: dt.datetime | None = None,
        unique_key: str | None = None,
        depends_on: Iterable[int] | None = None,
        concurrency_key: str | None = None,
    ) -> ConfiguredTask[P, R]:
        """Overrides for the next enqueue; ``session=`` joins the caller's transaction (a
        ``Session`` for ``enqueue``, an ``AsyncSession`` for ``aenqueue``); ``depends_on`` (job
        ids) holds the job until all of them SUCCEEDED; ``concurrency_key`` replaces the key
        the task would compute."""
        if delay is not None and run_at is not None:
            raise ValidationError("give either delay or run_at, not both")
        if session is not None and not isinstance(session, Session | AsyncSession):
            raise ValidationError(
                f"session must be a SQLAlchemy Session or AsyncSession, got {type(session).__name__}"
            )
        options = EnqueueOptions(
            session=session,
            queue=None if queue is None else validation.queue_name(queue),
            priority=None if priority is None else validation.priority(priority),
            max_attempts=None if max_attempts is None else validation.max_attempts(max_attempts),
            delay=validation.delay(delay),
            run_at=validation.run_at(run_at),
            unique_key=validation.unique_key(unique_key),
            depends_on=_job_ids(depends_on),
            concurrency_key=(
                None if concurrency_key is None else validation.concurrency_key(concurrency_key)
            ),
        )
        return ConfiguredTask(self, options)

    def enqueue(self, *args: P.args, **kwargs: P.kwargs) -> int:
        """Enqueue one job in its own committed transaction; returns the job id."""
        return ConfiguredTask(self, EnqueueOptions()).enqueue(*args, **kwargs)

    def enqueue_many(
        self, items: Iterable[Mapping[str, Any] | Sequence[Any]], *, session: Session | None = None
    ) -> list[int]:
        """Enqueue many jobs in one statement. Each item is a kwargs dict or an args list."""
        return ConfiguredTask(self, EnqueueOptions(session=session)).enqueue_many(items)

    async def aenqueue(self, *args: P.args, **kwargs: P.kwargs) -> int:
        """``enqueue`` for asyncio code: one job in its own committed transaction."""
        return await ConfiguredTask(self, EnqueueOptions()).aenqueue(*args, **kwargs)

    async def aenqueue_many(
        self,
        items: Iterable[Mapping[str, Any] | Sequence[Any]],
        *,
        session: AsyncSession | None = None,
    ) -> list[int]:
        """``enqueue_many`` for asyncio code (in ``session``'s transaction when given)."""
        return await ConfiguredTask(self, EnqueueOptions(session=session)).aenqueue_many(items)

    def with_options(self, options: Mapping[str, Any]) -> ConfiguredTask[P, R]:
        """``configure(**options)``, for callers holding the options as a mapping."""
        return self.configure(**options)

    def s(self, *args: Any, **kwargs: Any) -> Signature:
        """A signature of this task for a workflow (``chain``/``group``/``chord``): in a
        workflow, its parent's result (or its parents' results, as a list, after a group) is
        passed as the first positional argument, before ``args``."""
        return Signature(self, args, kwargs)  # ``*args``/``**kwargs`` are this call's own

    def si(self, *args: Any, **kwargs: Any) -> Signature:
        """An immutable signature: like ``s``, but it receives no parent's result."""
        return Signature(self, args, kwargs, immutable=True)

    # -- used by the worker ------------------------------------------------------------------

    def check_arguments(self, args: Sequence[Any], kwargs: Mapping[str, Any]) -> None:
        """Raise ValidationError if the arguments do not fit the function's signature."""
        # Decided from the arguments' shape by rules compiled from the signature once; only a
        # shape they leave open, or one that does not bind, is bound for real (for its message).
        if self._arguments.binds(len(args), kwargs.keys()):
            return
        bind_args: tuple[Any, ...] = (None, *args) if self.pass_context else tuple(args)
        try:
            self._signature.bind(*bind_args, **kwargs)
        except TypeError as exc:
            raise ValidationError(f"arguments do not match task {self.name}: {exc}") from None

    def backoff_delay(self, attempt: int) -> float:
        """Seconds before the retry after failed attempt ``attempt`` (``backoff.delay_after``)."""
        return backoff.delay_after(self.retry_policy, attempt)


class ConfiguredTask(Generic[P, R]):
    """A task with per-call options, returned by :meth:`Task.configure`."""

    def __init__(self, task: Task[P, R], options: EnqueueOptions) -> None:
        self.task = task
        self.options = options

    def configure(self, **changes: Any) -> ConfiguredTask[P, R]:
        merged = self.task.configure(**changes).options
        kept: dict[str, Any] = {
            k: v
            for k, v in (
                ("session", merged.session),
                ("queue", merged.queue),
                ("priority", merged.priority),
                ("max_attempts", merged.max_attempts),
                ("delay", merged.delay),
                ("run_at", merged.run_at),
                ("unique_key", merged.unique_key),
                ("depends_on", merged.depends_on),
                ("concurrency_key", merged.concurrency_key),
            )
            if v is not None
        }
        return ConfiguredTask(self.task, replace(self.options, **kept))

    def enqueue(self, *args: P.args, **kwargs: P.kwargs) -> int:
        session = self._session()
        job = self._build(args, kwargs)
        return self.task.sink.enqueuer.insert(session, [job])[0]

    def enqueue_many(self, items: Iterable[Mapping[str, Any] | Sequence[Any]]) -> list[int]:
        session = self._session()
        jobs = self._build_many(items)
        return self.task.sink.enqueuer.insert(session, jobs) if jobs else []

    async def aenqueue(self, *args: P.args, **kwargs: P.kwargs) -> int:
        session = check_async_session(self.options.session)
        job = self._build(args, kwargs)
        return (await self.task.sink.enqueuer.ainsert(session, [job]))[0]

    async def aenqueue_many(self, items: Iterable[Mapping[str, Any] | Sequence[Any]]) -> list[int]:
        session = check_async_session(self.options.session)
        jobs = self._build_many(items)
        return await self.task.sink.enqueuer.ainsert(session, jobs) if jobs else []

    def _session(self) -> Session | None:
        session = self.options.session
        if isinstance(session, AsyncSession):
            raise ValidationError(
                "session is an AsyncSession: enqueue in it with "
                "await task.configure(session=...).aenqueue(...)"
            )
        return session

    def _build_many(self, items: Iterable[Mapping[str, Any] | Sequence[Any]]) -> list[NewJob]:
        build = self._builder()
        jobs: list[NewJob] = []
        append = jobs.append
        for index, item in enumerate(items):
            if type(item) is dict or isinstance(item, Mapping):
                append(build((), item))
            elif isinstance(item, Sequence) and not isinstance(item, str | bytes):
                append(build(tuple(item), {}))
            else:
                raise ValidationError(
                    f"enqueue_many item {index} must be a kwargs dict or an args list, "
                    f"got {type(item).__name__}"
                )
        return jobs

    def _build(self, args: Sequence[Any], kwargs: Mapping[str, Any]) -> NewJob:
        return self._builder()(args, kwargs)

    def job_builder(self, *, passed: int) -> Callable[[Sequence[Any], Mapping[str, Any]], NewJob]:
        """Builds the validated job of each call's ``args`` and ``kwargs`` when ``passed`` more
        positional arguments are put before ``args`` when it runs (a workflow job's parents'
        results): checked against the function's signature with them, stored without. What
        the calls share is worked out once, here."""
        check, build = self.task.check_arguments, self._builder(check=False)
        padding = (None,) * passed

        def built(args: Sequence[Any], kwargs: Mapping[str, Any]) -> NewJob:
            check(padding + tuple(args), kwargs)
            return build(args, kwargs)

        return built

    def _builder(self, check: bool = True) -> Callable[[Sequence[Any], Mapping[str, Any]], NewJob]:
        """The job for one call's arguments; what every job of this enqueue shares (the task's
        defaults merged with the options, the limits) is worked out here, once per call."""
        task, opts = self.task, self.options
        settings = task.sink.settings
        max_bytes, max_depth = settings.max_payload_bytes, settings.max_json_depth
        check_arguments, encode_args = task.check_arguments, codec.encode_args
        name, queue, atomic, key_limit = (
            task.name,
            opts.queue or task.queue,
            task.atomic,
            task.key_limit,
        )
        priority = task.priority if opts.priority is None else opts.priority
        max_attempts = opts.max_attempts or task.max_attempts
        delay, run_at, depends_on = opts.delay, opts.run_at, opts.depends_on or ()
        fixed_unique_key = opts.unique_key
        unique_key_fn = task.unique_key_fn if fixed_unique_key is None else None
        concurrency_key = opts.concurrency_key or task.concurrency_key
        key_fn = (
            None if concurrency_key is None or isinstance(concurrency_key, str) else concurrency_key
        )
        fixed_key = concurrency_key if isinstance(concurrency_key, str) else None

        def build(args: Sequence[Any], kwargs: Mapping[str, Any]) -> NewJob:
            if check:
                check_arguments(args, kwargs)
            args_json, kwargs_json = encode_args(
                args, kwargs, max_bytes=max_bytes, max_depth=max_depth
            )
            unique_key = fixed_unique_key
            if unique_key_fn is not None:
                unique_key = validation.unique_key(unique_key_fn(*args, **kwargs))
            key = fixed_key if key_fn is None else _computed_key(task, key_fn, args, kwargs)
            return NewJob(
                name,
                queue,
                args_json,
                kwargs_json,
                priority,
                max_attempts,
                delay,
                run_at,
                unique_key,
                atomic,
                depends_on,
                key,
                key_limit,
            )

        return build


def _computed_key(
    task: Task[Any, Any], key: Callable[..., str], args: Sequence[Any], kwargs: Mapping[str, Any]
) -> str:
    """The concurrency key the function ``key`` of ``task`` gives a job with these arguments."""
    try:
        value = key(*args, **kwargs)
    except Exception as exc:
        raise ValidationError(
            f"concurrency_key of task {task.name} raised {type(exc).__name__}: {exc}"
        ) from exc
    return validation.concurrency_key(value, what=f"concurrency_key of task {task.name}")


def _job_ids(values: Iterable[int] | None) -> tuple[int, ...] | None:
    if values is None:
        return None
    if isinstance(values, str | bytes) or not isinstance(values, Iterable):
        raise ValidationError(f"depends_on must be a list of job ids, got {values!r}")
    ids = tuple(dict.fromkeys(values))
    for value in ids:
        if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
            raise ValidationError(f"depends_on must hold positive job ids, got {value!r}")
    return ids or None


class TaskRegistry:
    """Tasks by name; the worker resolves each claimed job's task here."""

    def __init__(self) -> None:
        self._tasks: dict[str, Task[Any, Any]] = {}

    def add(self, task: Task[Any, Any]) -> None:
        existing = self._tasks.get(task.name)
        if existing is not None and existing.fn is not task.fn:
            raise ValidationError(
                f"task name {task.name!r} is already registered for {existing.fn!r}; "
                "pass name= to tell them apart"
            )
        self._tasks[task.name] = task

    def get(self, name: str) -> Task[Any, Any]:
        try:
            return self._tasks[name]
        except KeyError:
            raise UnknownTask(f"no task named {name!r} is registered in this worker") from None

    def find(self, name: str) -> Task[Any, Any] | None:
        return self._tasks.get(name)

    def __contains__(self, name: object) -> bool:
        return name in self._tasks

    def __iter__(self) -> Any:
        return iter(self._tasks.values())

    def __len__(self) -> int:
        return len(self._tasks)

    def names(self) -> list[str]:
        return sorted(self._tasks)

    def lease_overrides(self) -> dict[str, float]:
        return {t.name: float(t.lease_seconds) for t in self._tasks.values() if t.lease_seconds}

    @property
    def has_atomic(self) -> bool:
        return any(t.atomic for t in self._tasks.values())
