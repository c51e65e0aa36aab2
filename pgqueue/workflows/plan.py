"""A workflow construct as the rows to insert (``jobs.WorkflowPlan``): pure, no database.

Each construct lays itself out (``lay_out``) after its ``parents`` (the jobs whose results it
may receive) and says what comes out of it: the jobs whose results the next step receives, and
whether they are a group's (then the next step gets their results as one list) or one job's
(its result).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm import Session

from pgqueue.errors import ValidationError
from pgqueue.jobs import InsertedWorkflow, NewJob, WorkflowPlan
from pgqueue.states import WorkflowRole

# What comes out of a laid-out construct: its jobs' indexes, and whether they are a group's.
Outlet = tuple[tuple[int, ...], bool]


class WorkflowSink(Protocol):
    """Where a workflow is inserted (``enqueuer.Enqueuer``)."""

    def insert_workflow(self, session: Session | None, plan: WorkflowPlan) -> InsertedWorkflow: ...

    async def ainsert_workflow(
        self, session: AsyncSession | None, plan: WorkflowPlan
    ) -> InsertedWorkflow: ...


class QueueObject(Protocol):
    """What a workflow needs of its tasks' queue object (``PgQueue``): its enqueuer."""

    @property
    def enqueuer(self) -> WorkflowSink: ...


class JobBuilder(Protocol):
    """A task with enqueue options (``ConfiguredTask``): it builds validated jobs."""

    def job_builder(
        self, *, passed: int
    ) -> Callable[[Sequence[Any], Mapping[str, Any]], NewJob]: ...


class SignedTask(Protocol):
    """What a signature needs of its task (``Task``)."""

    @property
    def name(self) -> str: ...

    @property
    def sink(self) -> QueueObject: ...

    def with_options(self, options: Mapping[str, Any]) -> JobBuilder: ...


@dataclass
class Layout:
    """The jobs laid out so far, in insert order, and the sink their tasks enqueue to."""

    jobs: list[NewJob] = field(default_factory=list)
    parents: list[tuple[int, ...]] = field(default_factory=list)
    roles: list[int] = field(default_factory=list)
    sink: WorkflowSink | None = None
    # Job builders by (task, options, passed results): a group of 10,000 signatures of one task
    # and options merges the task's defaults with its options once, not 10,000 times.
    builders: dict[Any, Callable[[Sequence[Any], Mapping[str, Any]], NewJob]] = field(
        default_factory=dict
    )
    # The last job's task, options (the same object, as a group's signatures share theirs) and
    # role, with its builder: the next job of all three builds with no lookup.
    _last: (
        tuple[
            SignedTask,
            Mapping[str, Any],
            WorkflowRole,
            Callable[[Sequence[Any], Mapping[str, Any]], NewJob],
        ]
        | None
    ) = None

    def add(
        self,
        task: SignedTask,
        call: tuple[Sequence[Any], Mapping[str, Any], Mapping[str, Any]],
        parents: tuple[int, ...],
        role: WorkflowRole,
    ) -> int:
        """Lay out one job of ``task`` for ``call`` (args, kwargs, enqueue options) after
        ``parents``; its index."""
        args, kwargs, options = call
        builder = self._builder(task, options, role)
        self.jobs.append(builder(args, kwargs))
        self.parents.append(parents)
        self.roles.append(role.value)
        return len(self.jobs) - 1

    def add_signatures(
        self, signatures: Sequence[Any], parents: tuple[int, ...], grouped: bool
    ) -> range:
        """Lay out a group's ``signatures`` (``Signature``s), each after ``parents``; their
        indexes. ``add`` for each, in one loop: a group of 10,000 costs one call, not 10,000."""
        start = len(self.jobs)
        append_job, append_role = self.jobs.append, self.roles.append
        roles = {
            False: role_after(parents, grouped, False),
            True: role_after(parents, grouped, True),
        }
        for signature in signatures:
            role = roles[signature.immutable]
            task, options = signature.task, signature.options
            append_job(self._builder(task, options, role)(signature.args, signature.kwargs))
            append_role(role.value)
        self.parents.extend([parents] * (len(self.jobs) - start))
        return range(start, len(self.jobs))

    def _builder(
        self, task: SignedTask, options: Mapping[str, Any], role: WorkflowRole
    ) -> Callable[[Sequence[Any], Mapping[str, Any]], NewJob]:
        """The job builder of ``task`` with ``options`` for a job of ``role``; refused when the
        task belongs to another sink than the workflow's jobs so far."""
        last = self._last
        if last is not None and last[0] is task and last[1] is options and last[2] is role:
            return last[3]
        sink = task.sink.enqueuer
        if self.sink is None:
            self.sink = sink
        elif sink is not self.sink:
            raise ValidationError("a workflow's tasks must all belong to one PgQueue")
        passed = 0 if role is WorkflowRole.MEMBER else 1
        try:
            key: Any = (id(task), tuple(sorted(options.items())) if options else (), passed)
            hash(key)
        except TypeError:  # an option value that cannot be a key: built on its own
            key = None
        builder = self.builders.get(key) if key is not None else None
        if builder is None:
            builder = task.with_options(options).job_builder(passed=passed)
            if key is not None:
                self.builders[key] = builder
        self._last = (task, options, role, builder)
        return builder

    def plan(self, final: tuple[int, ...], on_failure: int | None) -> WorkflowPlan:
        """The laid-out jobs as a plan; refused when two of them have the same unique key (the
        second could never be enqueued while the first waits or runs)."""
        seen: set[str] = set()
        for job in self.jobs:
            key = job.unique_key
            if key is None:
                continue
            if key in seen:
                raise ValidationError(
                    f"two jobs of the workflow have unique_key {key!r}: a key is held by one job"
                )
            seen.add(key)
        return WorkflowPlan(self.jobs, self.parents, self.roles, final, on_failure)


def role_after(parents: tuple[int, ...], grouped: bool, immutable: bool) -> WorkflowRole:
    """The role of a signature laid out after ``parents`` (a group's when ``grouped``)."""
    if not parents or immutable:
        return WorkflowRole.MEMBER
    return WorkflowRole.TAKES_RESULTS if grouped else WorkflowRole.TAKES_RESULT
