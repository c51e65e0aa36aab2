"""Assertions on what a test enqueued: ``assert_enqueued(task, *args, **kwargs)``,
``assert_not_enqueued`` and ``enqueued_jobs``.

A job counts as enqueued while it is not finished: QUEUED, WAITING, RETRYING or RUNNING (a job
that ran to its end is in ``run_jobs``'s answer, or in ``ImmediateMode.runs``). Arguments match
by meaning, not by spelling: both the expected ones and each job's are bound to the task's
signature, so ``assert_enqueued(send_receipt, order_id=1)`` matches ``send_receipt.enqueue(1)``;
only the arguments given are compared, and expected values are checked as an enqueue checks
its arguments (JSON values only: a tuple or a datetime is refused, not silently unmatched). A
failure lists the jobs that are enqueued, so the message shows what the code did instead.
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping, Sequence
from typing import Any

from pgqueue import codec
from pgqueue.admin import MAX_PAGE_SIZE
from pgqueue.core import PgQueue
from pgqueue.errors import ValidationError
from pgqueue.states import FINAL_STATES
from pgqueue.tasks import Task
from pgqueue.testing.immediate_mode import queue_of
from pgqueue.testing.records import EnqueuedJob, call_text

# How many of the enqueued jobs a failure message lists.
LISTED_IN_FAILURES = 20


def enqueued_jobs(queue: Any, task: Any = None) -> list[EnqueuedJob]:
    """The unfinished jobs of ``queue`` (a ``PgQueue``, or the Flask extension in an app
    context), oldest first; only ``task``'s (a task or its name) when given."""
    pgq = queue_of(queue)
    name = None if task is None else task if isinstance(task, str) else core_task(task).name
    found: list[EnqueuedJob] = []
    before: int | None = None
    while True:
        page = pgq.admin.list_jobs(task_name=name, before=before, limit=MAX_PAGE_SIZE)
        found.extend(EnqueuedJob.of(job) for job in page.jobs if job.state not in FINAL_STATES)
        if page.older is None:
            return found[::-1]
        before = page.older


def assert_enqueued(task: Any, /, *args: Any, **kwargs: Any) -> EnqueuedJob:
    """Assert that a job of ``task`` with these arguments (all of them or some) is enqueued;
    returns it (the oldest, if several match)."""
    __tracebackhide__ = True  # pytest shows the test's line, not this module's
    core = core_task(task)
    matching = _matching(core, args, kwargs)
    if not matching:
        raise AssertionError(
            f"no job {call_text(core.name, args, kwargs)} is enqueued; "
            + _listing(enqueued_jobs(core.sink))
        )
    return matching[0]


def assert_not_enqueued(task: Any, /, *args: Any, **kwargs: Any) -> None:
    """Assert that no job of ``task`` with these arguments (no job at all when none are given)
    is enqueued."""
    __tracebackhide__ = True  # pytest shows the test's line, not this module's
    core = core_task(task)
    matching = _matching(core, args, kwargs)
    if matching:
        raise AssertionError(
            f"{len(matching)} job(s) {call_text(core.name, args, kwargs)} enqueued: "
            + ", ".join(str(job) for job in matching[:LISTED_IN_FAILURES])
        )


def core_task(task: Any) -> Task[Any, Any]:
    """The core ``Task`` of ``task``: itself, or the current app's task of a Flask extension's
    task (inside an app context)."""
    if isinstance(task, Task):
        if not isinstance(task.sink, PgQueue):
            raise ValidationError(f"task {task.name} is not registered on a pgqueue.PgQueue")
        return task
    task_for = getattr(task, "task_for", None)
    if callable(task_for):
        resolved = task_for()
        if isinstance(resolved, Task):
            return core_task(resolved)
    raise ValidationError(f"expected a pgqueue task, got {type(task).__name__}")


def _matching(
    task: Task[Any, Any], args: Sequence[Any], kwargs: Mapping[str, Any]
) -> list[EnqueuedJob]:
    expected = _bound(task, *_as_stored(task, args, kwargs), partial=True)
    if expected is None:
        raise ValidationError(
            f"{call_text(task.name, args, kwargs)} does not fit the signature of task {task.name}"
        )
    matching = []
    for job in enqueued_jobs(task.sink, task.name):
        actual = _bound(task, job.args, job.kwargs, partial=False)
        if actual is not None and all(
            name in actual and actual[name] == value for name, value in expected.items()
        ):
            matching.append(job)
    return matching


def _as_stored(
    task: Task[Any, Any], args: Sequence[Any], kwargs: Mapping[str, Any]
) -> tuple[Any, Any]:
    """The arguments as an enqueue stores them and a worker reads them back (JSON)."""
    settings = task.sink.settings
    args_json, kwargs_json = codec.encode_args(
        args, kwargs, max_bytes=settings.max_payload_bytes, max_depth=settings.max_json_depth
    )
    return codec.load_arguments(args_json, kwargs_json)


def _bound(
    task: Task[Any, Any], args: Sequence[Any], kwargs: Mapping[str, Any], *, partial: bool
) -> dict[str, Any] | None:
    """Arguments by parameter name (defaults filled in unless ``partial``), or None when they
    do not fit the task's signature."""
    signature = inspect.signature(task.fn)
    leading: tuple[Any, ...] = (None,) if task.pass_context else ()
    try:
        if partial:
            bound = signature.bind_partial(*leading, *args, **kwargs)
        else:
            bound = signature.bind(*leading, *args, **kwargs)
            bound.apply_defaults()
    except TypeError:
        return None
    arguments = dict(bound.arguments)
    if task.pass_context:
        arguments.pop(next(iter(signature.parameters)), None)
    return arguments


def _listing(jobs: Sequence[EnqueuedJob]) -> str:
    if not jobs:
        return "no job is enqueued at all"
    lines = [f"the {len(jobs)} enqueued job(s):"]
    lines += [f"  {job}" for job in jobs[:LISTED_IN_FAILURES]]
    if len(jobs) > LISTED_IN_FAILURES:
        lines.append(f"  ... and {len(jobs) - LISTED_IN_FAILURES} more")
    return "\n".join(lines)
