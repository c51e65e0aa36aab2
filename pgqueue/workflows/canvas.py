"""The workflow constructs, named as Celery's canvas names them: a ``Signature`` (a task with its
arguments and enqueue options, not yet enqueued; ``task.s(...)``/``task.si(...)``), ``chain``
(each step after the previous one, given its result), ``group`` (members in parallel) and
``chord`` (a group, then a callback given the list of the members' results).

``enqueue()``/``aenqueue()`` validate every job before any SQL and insert the whole workflow
in one transaction: the caller's (``session=``, or ``configure(session=...)``) when given, so
a rollback leaves nothing, or one of its own. A workflow a member of which has a unique key
held by another job is not enqueued at all (``UniqueKeyHeld``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Any

from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm import Session

from pgqueue.aio import check_async_session
from pgqueue.errors import ValidationError
from pgqueue.jobs import InsertedWorkflow, WorkflowPlan
from pgqueue.states import WorkflowRole
from pgqueue.workflows.plan import Layout, Outlet, SignedTask, WorkflowSink, role_after

# The enqueue options a signature may carry (``Signature.set``): what ``task.configure``
# accepts, except what a workflow decides itself (the session, dependencies).
NO_OPTIONS: Mapping[str, Any] = MappingProxyType({})
SIGNATURE_OPTIONS = frozenset(
    {"queue", "priority", "max_attempts", "delay", "run_at", "concurrency_key", "unique_key"}
)


@dataclass(frozen=True, slots=True)
class EnqueuedWorkflow:
    """An enqueued workflow: its id (for ``pgq.get_workflow``, ``wait_for_workflow``,
    ``cancel_workflow``) and its jobs' ids (in the order the workflow lists them)."""

    id: int
    job_ids: tuple[int, ...]
    closing_job_id: int


class Canvas:
    """What ``Signature``, ``Chain``, ``Group`` and ``Chord`` share: the transaction to
    enqueue in, and the enqueue itself."""

    _session: Session | AsyncSession | None = None
    _on_failure: Signature | None = None

    def configure(self, *, session: Session | AsyncSession | None = None) -> Any:
        """This workflow, to be enqueued in ``session``'s transaction."""
        if session is not None and not isinstance(session, Session | AsyncSession):
            raise ValidationError(
                f"session must be a SQLAlchemy Session or AsyncSession, got {type(session).__name__}"
            )
        copy = self._copy()
        copy._session = session
        return copy

    def enqueue(self, session: Session | None = None) -> EnqueuedWorkflow:
        """Validate and insert the whole workflow in one transaction (``session``'s, or the
        configured one's, else its own)."""
        chosen = session if session is not None else self._session
        if isinstance(chosen, AsyncSession):
            raise ValidationError(
                "session is an AsyncSession: enqueue the workflow with await .aenqueue(...)"
            )
        sink, built = self._planned()
        return _enqueued(sink.insert_workflow(chosen, built))

    async def aenqueue(self, session: AsyncSession | None = None) -> EnqueuedWorkflow:
        """``enqueue`` for asyncio: in ``session``'s transaction (an ``AsyncSession``) or in
        one of its own."""
        chosen = check_async_session(session if session is not None else self._session)
        sink, built = self._planned()
        return _enqueued(await sink.ainsert_workflow(chosen, built))

    def _planned(self) -> tuple[WorkflowSink, WorkflowPlan]:
        """This workflow laid out, its ``on_failure`` job last; the sink to insert it in."""
        layout = Layout()
        final, _ = self.lay_out(layout, (), False)
        failure_index = None
        if self._on_failure is not None:
            if not isinstance(self._on_failure, Signature):
                raise ValidationError(f"on_failure must be a signature, got {self._on_failure!r}")
            on_failure = self._on_failure
            call = (on_failure.args, on_failure.kwargs, on_failure.options)
            failure_index = layout.add(on_failure.task, call, (), WorkflowRole.ON_FAILURE)
        if layout.sink is None:  # pragma: no cover - a construct holds at least one signature
            raise ValidationError("a workflow needs at least one signature")
        return layout.sink, layout.plan(final, failure_index)

    def lay_out(self, layout: Layout, parents: tuple[int, ...], grouped: bool) -> Outlet:
        """Add this construct's jobs to ``layout`` after ``parents`` (see ``plan``)."""
        raise NotImplementedError  # pragma: no cover - every construct defines it

    def _nested(self) -> None:
        if self._on_failure is not None:
            raise ValidationError("on_failure is for the outermost workflow only")

    def _copy(self) -> Any:
        raise NotImplementedError  # pragma: no cover - every construct defines it


@dataclass(slots=True, eq=False)
class Signature(Canvas):
    """One job of a workflow: a task, its arguments and its enqueue options. Made by
    ``task.s(...)`` (it receives its parent's result as first argument) or ``task.si(...)``
    (``immutable``: it does not)."""

    task: SignedTask
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    immutable: bool = False
    # Shared and read-only: a group of 10,000 signatures allocates no options of its own.
    options: Mapping[str, Any] = field(default_factory=lambda: NO_OPTIONS)

    def set(self, **options: Any) -> Signature:
        """This signature with enqueue options (``queue``, ``priority``, ``max_attempts``,
        ``delay``, ``run_at``, ``concurrency_key``, ``unique_key``), validated now. A member's
        ``unique_key`` is held from the workflow's enqueue until the member ends; when it is
        held already, ``enqueue`` raises ``UniqueKeyHeld`` and writes nothing."""
        unknown = set(options) - SIGNATURE_OPTIONS
        if unknown:
            raise ValidationError(
                f"a signature takes the options {sorted(SIGNATURE_OPTIONS)}, not {sorted(unknown)}"
            )
        merged = {**self.options, **options}
        self.task.with_options(merged)  # validates them
        return replace(self, options=merged)

    def lay_out(self, layout: Layout, parents: tuple[int, ...], grouped: bool) -> Outlet:
        role = role_after(parents, grouped, self.immutable)
        index = layout.add(self.task, (self.args, self.kwargs, self.options), parents, role)
        return (index,), False

    def _copy(self) -> Signature:
        return replace(self)

    def __repr__(self) -> str:
        mark = "si" if self.immutable else "s"
        return f"<Signature {self.task.name}.{mark}()>"


class Chain(Canvas):
    """Steps run one after the other; each ``task.s`` step gets the previous one's result (or
    the list of a previous group's results) as first argument."""

    def __init__(self, steps: Iterable[Canvas], on_failure: Signature | None = None) -> None:
        self.steps: tuple[Canvas, ...] = _members(steps, "chain")
        self._on_failure = on_failure

    def lay_out(self, layout: Layout, parents: tuple[int, ...], grouped: bool) -> Outlet:
        outlet: Outlet = (parents, grouped)
        for step in self.steps:
            step._nested()
            outlet = step.lay_out(layout, *outlet)
        return outlet

    def _copy(self) -> Chain:
        copy = Chain(self.steps, self._on_failure)
        copy._session = self._session
        return copy


class Group(Canvas):
    """Members run in parallel; what follows a group gets the list of their results, in the
    group's order."""

    def __init__(self, members: Iterable[Canvas], on_failure: Signature | None = None) -> None:
        self.members: tuple[Canvas, ...] = _members(members, "group")
        self._on_failure = on_failure

    def lay_out(self, layout: Layout, parents: tuple[int, ...], grouped: bool) -> Outlet:
        ends: list[int] = []
        signatures: list[Signature] = []  # a run of plain signatures, laid out in one call
        for member in self.members:
            if type(member) is Signature:
                signatures.append(member)
                continue
            if signatures:
                ends.extend(layout.add_signatures(signatures, parents, grouped))
                signatures = []
            member._nested()
            member_ends, _ = member.lay_out(layout, parents, grouped)
            ends.extend(member_ends)
        if signatures:
            ends.extend(layout.add_signatures(signatures, parents, grouped))
        return tuple(ends), True

    def _copy(self) -> Group:
        copy = Group(self.members, self._on_failure)
        copy._session = self._session
        return copy


class Chord(Canvas):
    """A group (the header), then ``callback`` once with the list of the members' results in
    the header's order. ``on_failure`` runs once, after every member ended, if any failed."""

    def __init__(
        self, header: Iterable[Canvas], callback: Canvas, on_failure: Signature | None = None
    ) -> None:
        self.header = Group(header)
        if not isinstance(callback, Canvas):
            raise ValidationError(f"a chord's callback must be a signature, got {callback!r}")
        self.callback = callback
        self._on_failure = on_failure

    def lay_out(self, layout: Layout, parents: tuple[int, ...], grouped: bool) -> Outlet:
        self.callback._nested()
        header = self.header.lay_out(layout, parents, grouped)
        return self.callback.lay_out(layout, *header)

    def _copy(self) -> Chord:
        copy = Chord(self.header.members, self.callback, self._on_failure)
        copy._session = self._session
        return copy


def chain(*steps: Canvas, on_failure: Signature | None = None) -> Chain:
    """``chain(a.s(), b.s(), c.s())``: a, then b(a's result), then c(b's result)."""
    return Chain(steps, on_failure)


def group(*members: Canvas | Iterable[Canvas], on_failure: Signature | None = None) -> Group:
    """``group(a.s(1), a.s(2))`` or ``group(a.s(i) for i in range(n))``: in parallel."""
    if len(members) == 1 and not isinstance(members[0], Canvas):
        return Group(members[0], on_failure)
    return Group(members, on_failure)  # type: ignore[arg-type]


def chord(
    header: Iterable[Canvas], callback: Canvas, *, on_failure: Signature | None = None
) -> Chord:
    """``chord([a.s(i) for i in ...], merge.s())``: merge(list of results) once, after all."""
    return Chord(header, callback, on_failure)


def _members(items: Iterable[Any], what: str) -> tuple[Canvas, ...]:
    members = tuple(items)
    if not members:
        raise ValidationError(f"a {what} needs at least one signature")
    for item in members:
        if not isinstance(item, Canvas):
            raise ValidationError(
                f"a {what} takes signatures (task.s(...), task.si(...)) or workflows, "
                f"got {type(item).__name__}"
            )
    return members


def _enqueued(inserted: InsertedWorkflow) -> EnqueuedWorkflow:
    return EnqueuedWorkflow(inserted.id, inserted.job_ids[:-1], inserted.job_ids[-1])
