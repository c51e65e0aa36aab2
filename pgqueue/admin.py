"""The public admin API: read and control jobs and queues, as the dashboard and both CLIs do.

``pgq.admin`` (an :class:`Admin`) answers the questions an operator asks (which jobs, how many,
how late, how fast) and carries out their actions (rerun, cancel, delete, pause, limit, and the
same three actions in bulk by filter, each with a dry run and an audit record). Each
method is one data-layer operation in one transaction: reads in a session of their own,
actions in the caller's session when one is given, else in an own transaction retried on
transient conflicts. Arguments are checked before any SQL runs; rows come back as the public
``Job`` model (detached snapshots) or as the small frozen data classes defined here.
"""

from __future__ import annotations

import datetime as dt
import getpass
import math
import os
import socket
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Final, TypeVar

from sqlalchemy.orm import Session, sessionmaker

from pgqueue import explain, uow, validation
from pgqueue.config import Settings
from pgqueue.data import admin as admin_data
from pgqueue.data import bulk as bulk_data
from pgqueue.data import control as control_data
from pgqueue.data import enqueue as enqueue_data
from pgqueue.data import flow as flow_data
from pgqueue.data import workers as workers_data
from pgqueue.errors import BulkCountChanged, InvalidStateTransition, JobNotFound, ValidationError
from pgqueue.job_filter import BulkAction, JobFilter
from pgqueue.models import Job
from pgqueue.states import JobState

__all__ = [
    "AUDIT_SOURCES",
    "DEFAULT_COUNT_CAP",
    "DEFAULT_PAGE_SIZE",
    "DEFAULT_THROUGHPUT_CAP",
    "MAX_JOB_ID",
    "MAX_PAGE_SIZE",
    "Admin",
    "BulkAction",
    "BulkResult",
    "JobFilter",
    "JobHolder",
    "JobPage",
    "KeyOverride",
    "ListArguments",
    "OldestWaiting",
    "QueueSettings",
    "Throughput",
    "WorkerInfo",
    "check_job_id",
    "default_actor",
    "job_snapshot",
    "list_arguments",
    "page_of",
]

T = TypeVar("T")

MAX_JOB_ID: Final = 2**63 - 1  # job ids are bigint
MAX_QUEUE_DEPTH: Final = 2**31 - 1  # a queue's bound is an integer column
DEFAULT_PAGE_SIZE: Final = 50
MAX_PAGE_SIZE: Final = 1000
# A capped count reads at most this many index entries per queue and state, so it costs the
# same however much history the jobs table holds.
DEFAULT_COUNT_CAP: Final = 1000
RERUNNABLE: Final = frozenset({JobState.FAILED, JobState.CANCELLED})
CANCELLABLE: Final = frozenset({JobState.QUEUED, JobState.RETRYING, JobState.RUNNING})
# Where a bulk action was taken, as its audit record says.
AUDIT_SOURCES: Final = ("api", "cli", "dashboard")
MAX_ACTOR_LENGTH: Final = 200
BULK_CANCEL_REASON: Final = "cancelled by a bulk action"


@dataclass(frozen=True, slots=True)
class BulkResult:
    """What a bulk action did, or with ``dry_run`` would do: ``count`` jobs changed (for a
    cancel, ``flagged_running`` of them are RUNNING jobs asked to stop), recorded as audit
    record ``audit_id`` (None for a dry run)."""

    action: BulkAction
    count: int
    dry_run: bool
    flagged_running: int = 0
    audit_id: int | None = None


# A throughput window reads at most this many finished jobs: past it, the window shrinks to the
# most recent jobs (at 10,000 jobs/s, the last few seconds) instead of reading the whole hour.
DEFAULT_THROUGHPUT_CAP: Final = 50_000
# ``throughput``'s bound on the live table's jobs read under the partitioned history: none (the
# largest int a LIMIT takes), since ``throughput`` counts every job of the hour.
UNCAPPED: Final = 2**31 - 1
THROUGHPUT_WINDOW: Final = 3600
# Bucket widths (seconds) a shrunken window is divided into, at most 60 buckets of them.
BUCKET_WIDTHS: Final = (1, 2, 5, 10, 15, 30, 60)


@dataclass(frozen=True, slots=True)
class JobPage:
    """One page of jobs, newest first, with the cursors of the pages beside it.

    ``newer`` is the ``after=`` and ``older`` the ``before=`` of the adjacent pages; None when
    there is no such page.
    """

    jobs: tuple[Job, ...]
    newer: int | None
    older: int | None


@dataclass(frozen=True, slots=True)
class OldestWaiting:
    """The earliest ticket of a queue: its job, when it may run, and for how long it has been
    able to (negative: it is scheduled that many seconds in the future)."""

    job_id: int
    run_at: dt.datetime
    seconds_waiting: float


@dataclass(frozen=True, slots=True)
class QueueSettings:
    """A queue's switches and the number of its jobs running now (counted for limited
    queues); ``max_depth`` is its bound (``set_queue_max_depth``), None when unbounded;
    ``rate_limit`` starts in any window of ``rate_per`` seconds is its rate limit
    (``set_rate_limit``), both None when it has none."""

    name: str
    paused: bool
    concurrency_limit: int | None
    running: int
    max_depth: int | None = None
    rate_limit: int | None = None
    rate_per: float | None = None


@dataclass(frozen=True, slots=True)
class KeyOverride:
    """The limits set at run time for the concurrency keys starting with ``prefix``: at most
    ``key_limit`` of each such key running at once (``set_key_limit``; None: the task's own
    ``key_limit`` applies), and at most ``rate_limit`` starts of each in any window of
    ``rate_per`` seconds (``set_rate_limit(key=...)``; both None when it has no rate)."""

    prefix: str
    key_limit: int | None
    rate_limit: int | None
    rate_per: float | None


@dataclass(frozen=True, slots=True)
class Throughput:
    """Jobs finished per bucket of ``width`` seconds over the last ``window`` seconds:
    ``series[queue][state][0]`` is the newest bucket. ``shortened`` says the window is shorter
    than asked because more jobs finished than the read may count."""

    window: int
    width: int
    series: dict[str, dict[JobState, list[int]]]
    shortened: bool

    @property
    def buckets(self) -> int:
        return self.window // self.width


@dataclass(frozen=True, slots=True)
class WorkerInfo:
    """One worker process in the worker registry.

    ``queues`` is empty for a worker serving all queues. ``seconds_since_seen`` counts from
    its latest heartbeat (database clock); ``live`` is false once that exceeds the stale
    interval (``Settings.worker_stale_seconds``). ``running`` is the number of RUNNING jobs
    it holds. ``claim_error`` is the error of its latest claim while its claims fail (it is
    alive but takes no work), and ``seconds_failing`` how long they have failed; both None
    while its claims work. ``tasks`` names the tasks it registers, the only ones it claims
    (None for a worker of a version that did not record them).
    """

    id: str
    host: str
    pid: int
    queues: tuple[str, ...]
    concurrency: int
    version: str
    started_at: dt.datetime
    last_seen_at: dt.datetime
    seconds_since_seen: float
    live: bool
    running: int
    claim_error: str | None = None
    seconds_failing: float | None = None
    tasks: tuple[str, ...] | None = None

    @property
    def healthy(self) -> bool:
        """Live, and its claims work."""
        return self.live and self.claim_error is None


@dataclass(frozen=True, slots=True)
class JobHolder:
    """The worker holding a RUNNING job: its id (the job's ``lease_owner``) and what the
    registry says of it. ``host``, ``pid`` and ``last_seen_at`` are None when it has no row
    (it stopped, or was removed as stale): ``registered`` is then false."""

    worker_id: str
    host: str | None
    pid: int | None
    last_seen_at: dt.datetime | None
    seconds_since_seen: float | None
    live: bool

    @property
    def registered(self) -> bool:
        return self.host is not None


@dataclass(frozen=True, slots=True)
class ListArguments:
    """The checked filters and cursor of a job listing."""

    queue: str | None
    state: JobState | None
    task_name: str | None
    before: int | None
    after: int | None
    limit: int


def check_job_id(value: object) -> int:
    """``value`` as a job id; ValidationError unless it is a positive int."""
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise ValidationError(f"job id must be a positive int, got {value!r}")
    return value


def default_actor() -> str:
    """``user@host`` of this process: the actor of a bulk action when none is given."""
    try:
        user = getpass.getuser()
    except (KeyError, OSError):  # no name for the uid (a container without a passwd entry)
        user = str(os.getuid())
    return f"{user}@{socket.gethostname()}"


def _check_actor(actor: object, source: object) -> tuple[str, str]:
    if not isinstance(actor, str) or not actor.strip() or "\x00" in actor:
        raise ValidationError(f"actor must be a non-empty str without NUL, got {actor!r:.80}")
    if len(actor) > MAX_ACTOR_LENGTH:
        raise ValidationError(f"actor must be at most {MAX_ACTOR_LENGTH} characters")
    if source not in AUDIT_SOURCES:
        raise ValidationError(f"source must be one of {', '.join(AUDIT_SOURCES)}, got {source!r}")
    return actor, str(source)


def list_arguments(
    *,
    queue: str | None,
    state: JobState | str | None,
    task_name: str | None,
    before: int | None,
    after: int | None,
    limit: int,
) -> ListArguments:
    """Check a job listing's arguments (ValidationError on the first bad one)."""
    for label, text in (("queue", queue), ("task_name", task_name)):
        if text is not None and (not isinstance(text, str) or "\x00" in text):
            raise ValidationError(f"{label} must be a str without NUL characters, got {text!r}")
    if state is not None and not isinstance(state, JobState):
        try:
            state = JobState(state)
        except ValueError:
            raise ValidationError(f"unknown state {state!r}") from None
    for label, cursor in (("before", before), ("after", after)):
        if cursor is not None and (
            not isinstance(cursor, int) or isinstance(cursor, bool) or not 0 <= cursor <= MAX_JOB_ID
        ):
            raise ValidationError(
                f"{label} must be a job id from 0 to {MAX_JOB_ID}, got {cursor!r}"
            )
    if before is not None and after is not None:
        raise ValidationError("give before= or after=, not both")
    if not isinstance(limit, int) or isinstance(limit, bool) or not 1 <= limit <= MAX_PAGE_SIZE:
        raise ValidationError(f"limit must be an int from 1 to {MAX_PAGE_SIZE}, got {limit!r}")
    return ListArguments(queue, state, task_name, before, after, limit)


def page_of(rows: Sequence[Job], *, limit: int, before: int | None, after: int | None) -> JobPage:
    """The page in ``rows``: up to ``limit + 1`` jobs, newest first, read from the cursor on.

    The row beyond ``limit`` tells whether another page lies in the direction walked; the
    direction came from says the other one does whenever a cursor was given.
    """
    if after is not None:
        has_newer, has_older = len(rows) > limit, True
        jobs = tuple(rows[-limit:])
    else:
        has_newer, has_older = before is not None, len(rows) > limit
        jobs = tuple(rows[:limit])
    return JobPage(
        jobs=jobs,
        newer=jobs[0].id if has_newer and jobs else None,
        older=jobs[-1].id if has_older and jobs else None,
    )


class Admin:
    """Reads and actions for operators; reach it as ``pgq.admin``.

    ``sessions`` returns the session factory of pgqueue's own engine (called per operation, so
    an engine recreated after ``dispose`` is used).
    """

    def __init__(
        self,
        sessions: Callable[[], sessionmaker[Session]],
        *,
        stale_seconds: Callable[[], float] = lambda: Settings().worker_stale_seconds,
        partitioned_history: Callable[[], bool] = lambda: False,
    ) -> None:
        self._sessions = sessions
        self._stale_seconds = stale_seconds
        # Under ``history="partitioned"`` the reads of jobs read the moved jobs too; otherwise
        # nothing here touches ``pgqueue_job_history`` (a role may hold no rights on it).
        self._partitioned_history = partitioned_history

    # -- jobs --------------------------------------------------------------------------------

    def get_job(self, job_id: int) -> Job:
        """A snapshot of one job (detached from any session). Raises JobNotFound."""
        job_id = check_job_id(job_id)
        history = self._partitioned_history()
        return self._read(lambda session: job_snapshot(session, job_id, history=history))

    def explain_job(self, job_id: int) -> explain.JobExplanation:
        """Why job ``job_id`` is not running (or is): its blockers in the order the claim
        applies them (see ``pgqueue.explain``). Raises JobNotFound."""
        job_id = check_job_id(job_id)
        if job_id > MAX_JOB_ID:  # beyond bigint: no such job, and not a database error
            raise JobNotFound(f"no job with id {job_id}")
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
    ) -> JobPage:
        """A page of jobs, newest first, filtered by queue, state and task name; ``before`` /
        ``after`` (a job id, see ``JobPage``) walk to older / newer pages."""
        checked = list_arguments(
            queue=queue, state=state, task_name=task_name, before=before, after=after, limit=limit
        )
        history = self._partitioned_history()
        with self._sessions()() as session:
            pages = [
                admin_data.list_jobs(
                    session,
                    queue=checked.queue,
                    state=checked.state,
                    task_name=checked.task_name,
                    before=checked.before,
                    after=checked.after,
                    limit=checked.limit + 1,
                    history=moved,
                )
                # The live table first: a job moved between the two reads is then seen twice
                # (kept once) rather than missed.
                for moved in ((False, True) if history else (False,))
            ]
            session.expunge_all()
        rows = (
            pages[0] if len(pages) == 1 else _merged_pages(pages, checked.limit + 1, checked.after)
        )
        return page_of(rows, limit=checked.limit, before=checked.before, after=checked.after)

    def delete_job(self, job_id: int, *, session: Session | None = None) -> bool:
        """Delete a job that is not running (with its ticket); False when nothing was
        deleted (it is running, or gone)."""
        job_id = check_job_id(job_id)
        return self._write(session, lambda s: admin_data.delete_job(s, job_id))

    def retry_job(self, job_id: int, *, session: Session | None = None) -> None:
        """Make a FAILED or CANCELLED job run again now, whatever its attempt count.

        The attempts it used stay counted; when none are left, ``max_attempts`` is raised to
        ``attempts + 1``, so the job gets one more attempt (retried no further if it fails) and
        its attempt count never exceeds its maximum."""
        job_id = check_job_id(job_id)

        history = self._partitioned_history()

        def work(s: Session) -> None:
            if not admin_data.rerun(s, job_id):
                _raise_for_state(s, job_id, "retry", RERUNNABLE, history=history)

        self._write(session, work)

    def cancel_job(self, job_id: int, *, session: Session | None = None) -> JobState:
        """Cancel a waiting job (it never runs) or ask a running one to stop.

        Returns CANCELLED for a waiting job, RUNNING when the running job was flagged (its
        handler sees ``ctx.cancel_requested``; it ends CANCELLED, not retried).
        """
        job_id = check_job_id(job_id)
        history = self._partitioned_history()

        def work(s: Session) -> JobState:
            if admin_data.cancel_waiting(s, job_id, "cancelled by request"):
                return JobState.CANCELLED
            if admin_data.request_cancel_running(s, job_id):
                return JobState.RUNNING
            _raise_for_state(s, job_id, "cancel", CANCELLABLE, history=history)
            raise AssertionError("unreachable")  # pragma: no cover

        return self._write(session, work)

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
        who, where = _check_actor(default_actor() if actor is None else actor, source)
        if expected_count is not None and (
            not isinstance(expected_count, int) or isinstance(expected_count, bool)
        ):
            raise ValidationError(f"expected_count must be an int, got {expected_count!r}")
        if dry_run:
            count = self._read(lambda s: bulk_data.count_matching(s, job_filter, states))
            return BulkResult(action, count, dry_run=True)

        def work(s: Session) -> BulkResult:
            flagged = 0
            if action is BulkAction.RETRY:
                count = bulk_data.retry_matching(s, job_filter, states)
            elif action is BulkAction.CANCEL:
                cancelled, flagged = bulk_data.cancel_matching(
                    s, job_filter, states, BULK_CANCEL_REASON
                )
                count = cancelled + flagged
            else:
                count = bulk_data.delete_matching(s, job_filter, states)
            if expected_count is not None and count != expected_count:
                # Raised inside the transaction, which rolls back: nothing was changed.
                raise BulkCountChanged(
                    f"{action.value} would now change {count} jobs, not the {expected_count} "
                    "previewed; nothing was changed (preview again)"
                )
            audit_id = bulk_data.record_action(
                s, actor=who, source=where, action=action, job_filter=job_filter, count=count
            )
            return BulkResult(action, count, False, flagged, audit_id)

        return self._write(None, work)

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
        if not self._partitioned_history():
            return self._read(lambda s: admin_data.capped_state_counts(s, cap))

        def both(s: Session) -> dict[str, dict[JobState, int]]:
            counts = admin_data.capped_state_counts(s, cap)
            for queue, moved in admin_data.capped_state_counts(s, cap, history=True).items():
                live = counts.setdefault(queue, dict.fromkeys(JobState, 0))
                for state, count in moved.items():
                    live[state] = min(cap, live.get(state, 0) + count)
            return counts

        return self._read(both)

    def oldest_waiting(self) -> dict[str, OldestWaiting]:
        """The earliest ticket of each queue that has one."""
        rows = self._read(admin_data.oldest_waiting)
        return {queue: OldestWaiting(*row) for queue, row in rows.items()}

    def throughput(self) -> dict[str, dict[JobState, list[int]]]:
        """Jobs finished per minute over the last hour: ``{queue: {state: [count, ...]}}``,
        index 0 the current minute, index 59 an hour ago; only queues with finished jobs in
        that hour appear. Under the partitioned history the minutes are clock minutes, and moved
        jobs are counted from the per-minute counts their move wrote."""
        if self._partitioned_history():
            return self._read(lambda s: admin_data.finished_per_clock_minute(s, UNCAPPED))
        return self._read(admin_data.finished_per_minute)

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

        partitioned = self._partitioned_history()
        sources = (False, True) if partitioned else (False,)

        def work(s: Session) -> Throughput:
            live_edge = admin_data.finished_window_edge(s, THROUGHPUT_WINDOW, cap)
            edges = [] if live_edge is None else [live_edge]
            if partitioned:
                if live_edge is None:
                    # The whole hour: the live table's few minutes of finished jobs, and the
                    # moved ones from their per-minute counts (never the history's rows).
                    hour = admin_data.finished_per_clock_minute(s, cap)
                    return Throughput(THROUGHPUT_WINDOW, 60, hour, shortened=False)
                # The window is no longer than the live table's: the history is read within it
                # only, to ``cap`` as well, so at most about twice ``cap`` jobs are read.
                moved_edge = admin_data.finished_window_edge(s, live_edge, cap, history=True)
                if moved_edge is not None:
                    edges.append(moved_edge)
            edge = min(edges) if edges else None
            if edge is None:
                width, window = 60, THROUGHPUT_WINDOW
            else:
                width = next((w for w in BUCKET_WIDTHS if w * 60 >= edge), BUCKET_WIDTHS[-1])
                # Rounded up to whole buckets: the window must reach the cap-th newest job, or a
                # burst that finished within one bucket, some seconds ago, falls outside it.
                window = max(1, math.ceil(edge / width)) * width
            series: dict[str, dict[JobState, list[int]]] = {}
            for moved in sources:
                part = admin_data.finished_per_bucket(s, width, window // width, cap, history=moved)
                for queue, by_state in part.items():
                    for state, counts in by_state.items():
                        into = series.setdefault(queue, {}).setdefault(state, [0] * len(counts))
                        for i, count in enumerate(counts):
                            into[i] += count
            return Throughput(window, width, series, shortened=edge is not None)

        return self._read(work)

    def queue_names(self) -> list[str]:
        """The queues that have jobs, sorted (moved jobs' too under the partitioned history)."""
        if not self._partitioned_history():
            return self._read(admin_data.job_queues)
        return self._read(
            lambda s: sorted({*admin_data.job_queues(s), *admin_data.job_queues(s, history=True)})
        )

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
        self._write(None, lambda s: enqueue_data.set_queue_max_depth(s, name, max_depth))

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
        rows = self._read(control_data.queue_controls)
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

    def _read(self, work: Callable[[Session], T]) -> T:
        with self._sessions()() as session:
            return work(session)

    def _write(self, session: Session | None, work: Callable[[Session], T]) -> T:
        return uow.in_caller_or_own_transaction(session, self._sessions(), work)


def job_snapshot(session: Session, job_id: int, *, history: bool = False) -> Job:
    """Job ``job_id`` read in ``session`` and detached from it; with ``history``, found in the
    partitioned history when it is no longer in ``pgqueue_jobs`` (a ``Job`` of no session,
    without steps). Raises JobNotFound."""
    job = admin_data.get_job(session, job_id)
    if job is None:
        # Read after the live table: a job moved in between is found here, never missed.
        moved = admin_data.get_moved_job(session, job_id) if history else None
        if moved is None:
            raise JobNotFound(f"no job with id {job_id}")
        return moved
    session.expunge(job)
    return job


def _merged_pages(pages: list[list[Job]], limit: int, after: int | None) -> list[Job]:
    """One page from a page of each table: each job once (the live table's row first), the
    ``limit`` nearest the cursor, newest first."""
    by_id: dict[int, Job] = {}
    for page in pages:
        for job in page:
            by_id.setdefault(job.id, job)
    ids = sorted(by_id)
    nearest = ids[:limit] if after is not None else ids[-limit:]
    return [by_id[i] for i in reversed(nearest)]


def _raise_for_state(
    session: Session,
    job_id: int,
    action: str,
    allowed: frozenset[JobState],
    *,
    history: bool = False,
) -> None:
    job = admin_data.get_job(session, job_id)
    if job is None:
        moved = admin_data.get_moved_job(session, job_id) if history else None
        if moved is not None:
            raise InvalidStateTransition(
                f"cannot {action} job {job_id}: it finished ({moved.state.value}) and was moved "
                "to the history (history=partitioned), where jobs are read-only; enqueue a new "
                "job with its arguments instead"
            )
        raise JobNotFound(f"no job with id {job_id}")
    names = ", ".join(sorted(s.value for s in allowed))
    raise InvalidStateTransition(
        f"cannot {action} job {job_id}: it is {job.state.value} (allowed from: {names})"
    )
