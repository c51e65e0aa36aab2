"""The values that cross between layers: a job to insert, a worker's claim and the attempts it
claimed, an attempt's outcome, a worker's entry in the worker registry, and which tables hold
jobs (``JobTables``, carried by every ``db.Executor``).

Plain data classes with no behaviour and no database access, so the task API, the data layer,
the executors and the worker can all name them without importing each other.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

from pgqueue.states import OutcomeKind

if TYPE_CHECKING:
    from pgqueue.config import Settings

# Bound once: the constructors below run once per job, and an enum member looked up on its
# class costs a lookup each time.
_COMPLETE, _RETRY, _FAIL, _CANCELLED, _RELEASE, _SNOOZE, _SUSPEND = (
    OutcomeKind.COMPLETE,
    OutcomeKind.RETRY,
    OutcomeKind.FAIL,
    OutcomeKind.CANCELLED,
    OutcomeKind.RELEASE,
    OutcomeKind.SNOOZE,
    OutcomeKind.SUSPEND,
)

# What a handler reported with ``JobContext.progress``: the fraction done and a message.
Progress = tuple[float, str | None]
# A held attempt's lease to extend: (job id, lease token, lease seconds).
Lease = tuple[int, str, float]


@dataclass(slots=True)  # not frozen: a frozen dataclass is slower to build, once per job
class NewJob:
    """One validated job ready to insert (arguments already encoded as JSON text)."""

    task_name: str
    queue: str
    args_json: str
    kwargs_json: str
    priority: int
    max_attempts: int
    delay: float | None
    run_at: dt.datetime | None
    unique_key: str | None
    atomic: bool
    depends_on: tuple[int, ...] = ()
    concurrency_key: str | None = None
    key_limit: int | None = None  # the task's limit for its key (null: none declared)


# The ``pgqueue_jobs`` column each ``NewJob`` field is written to as it is, by every insert
# (``sql.enqueue.JOB_COLUMNS`` gives each its bound type); the writer adds the id, run_at, state
# and edges of each row.
NEW_JOB_COLUMNS: Final = {
    "task_name": "task_name",
    "queue": "queue",
    "args": "args_json",
    "kwargs": "kwargs_json",
    "priority": "priority",
    "max_attempts": "max_attempts",
    "atomic": "atomic",
}


@dataclass(frozen=True, slots=True)
class Plan:
    """Jobs written together by one writer (``data.enqueue.write``): ``jobs``, each one's
    ``parents`` among them (indexes into ``jobs``; None when none has any) and the
    ``WorkflowRole`` values of a workflow's jobs (None for a plan that is no workflow). A job's
    dependencies on existing jobs are its ``depends_on``."""

    jobs: Sequence[NewJob]
    parents: Sequence[tuple[int, ...]] | None = None
    roles: Sequence[int] | None = None


@dataclass(frozen=True, slots=True)
class ClaimRequest:
    """One claim of a worker: up to ``limit`` jobs of ``queues`` (None: every queue) for worker
    ``worker_id``, leased for ``lease_seconds`` unless ``task_leases`` names a task's own lease,
    none of the tasks in ``excluded``.

    ``held`` gives the ids of the attempts the worker runs already; ``notified``: the claim
    follows a wake-up for new work; ``failed`` is told of each try that failed and is tried
    again (the error, and the delay before the next try when known), instead of a log line.
    """

    worker_id: str
    limit: int
    queues: Sequence[str] | None
    lease_seconds: float
    task_leases: Mapping[str, float]
    held: Callable[[], Collection[int]] = frozenset
    notified: bool = False
    failed: Callable[[BaseException, float | None], None] | None = None
    excluded: Sequence[str] = ()


@dataclass(slots=True)  # not frozen: cheaper to build (thousands per second); see _claimed_jobs
class ClaimedJob:
    """What a worker needs to run one claimed attempt."""

    id: int
    task_name: str
    queue: str
    args: list[Any]
    kwargs: dict[str, Any]
    attempt: int
    max_attempts: int
    priority: int
    # The lease's fencing token as the text of its UUID: a worker only sends it back.
    lease_token: str
    atomic: bool
    cancel_requested: bool
    # The enqueuing code's trace context (JSON text as stored, read only when tracing is on).
    trace_context: str | None = None
    # Whether the job has a concurrency key: its outcome must then free the key's slot. True
    # unless the claim said otherwise, so an attempt built by hand is always counted off.
    keyed: bool = True
    # A rate-limited job's time to start: seconds after its claim statement began (the flow
    # claim's ``start_within``), and the monotonic time by which its handler must start
    # (``start_by``, from a reading taken before the claim was sent), or the job goes back
    # unstarted. None for every other job.
    start_within: float | None = None
    start_by: float | None = None
    problem: str | None = None  # why the row cannot run (its arguments did not decode)


@dataclass(slots=True)  # not frozen (cheaper to build, one per job)
class Outcome:
    """The result of one attempt, to be written by a batched transition (``kind.transition``).

    Built with the constructor named after its kind (``Outcome.complete(job)``,
    ``Outcome.retry(job, error, delay)`` ...), which takes what that transition writes. The
    executor sets ``progress`` once, before handing it on, when the handler reported progress
    that no heartbeat wrote yet; it is never changed after that.
    """

    job_id: int
    lease_token: str  # the attempt's ``ClaimedJob.lease_token``
    kind: OutcomeKind
    result_json: str = "null"
    error: str = ""
    delay: float = 0.0
    max_snoozes: int = 0  # a snooze's: how many the job may have before one counts as an attempt
    progress: Progress | None = None
    keyed: bool = True  # the job may have a concurrency key (``ClaimedJob.keyed``)
    # A suspension's: its wake time (epoch seconds, database clock) and the awaited signal.
    wake_at: float = 0.0
    signal: str | None = None

    @classmethod
    def complete(cls, job: ClaimedJob, result_json: str = "null") -> Outcome:
        """The attempt succeeded; ``result_json`` is the encoded return value."""
        return cls(job.id, job.lease_token, _COMPLETE, result_json, keyed=job.keyed)

    @classmethod
    def retry(cls, job: ClaimedJob, error: str, delay: float) -> Outcome:
        """The attempt failed and another one runs ``delay`` seconds from now."""
        return cls(job.id, job.lease_token, _RETRY, "null", error, delay, keyed=job.keyed)

    @classmethod
    def fail(cls, job: ClaimedJob, error: str) -> Outcome:
        """The attempt failed and the job fails for good."""
        return cls(job.id, job.lease_token, _FAIL, "null", error, keyed=job.keyed)

    @classmethod
    def cancelled(cls, job: ClaimedJob, error: str) -> Outcome:
        """The handler ended after a cancel was requested."""
        return cls(job.id, job.lease_token, _CANCELLED, "null", error, keyed=job.keyed)

    @classmethod
    def release(cls, job: ClaimedJob) -> Outcome:
        """Shutdown gave the job back before its handler ended; the attempt does not count."""
        return cls(job.id, job.lease_token, _RELEASE, keyed=job.keyed)

    @classmethod
    def snooze(cls, job: ClaimedJob, delay: float, max_snoozes: int) -> Outcome:
        """The handler asked to run again ``delay`` seconds from now without using an attempt;
        once the job snoozed ``max_snoozes`` times, the snooze counts as a failed attempt
        (retried after ``delay``, or failed for good on the last attempt) whose error the
        statement writes."""
        return cls(
            job.id, job.lease_token, _SNOOZE, "null", "", delay, max_snoozes, keyed=job.keyed
        )

    @classmethod
    def suspend(cls, job: ClaimedJob, wake_at: float, signal: str | None) -> Outcome:
        """The handler slept (``signal`` None) or waits for ``signal``: the job runs again at
        ``wake_at`` (epoch seconds, database clock), or when the signal arrives, without
        using an attempt."""
        return cls(
            job.id, job.lease_token, _SUSPEND, keyed=job.keyed, wake_at=wake_at, signal=signal
        )


@dataclass(frozen=True, slots=True)
class WorkerIdentity:
    """Who a worker process is, as its row in the worker registry (``pgqueue_workers``) says:
    its id, host and pid, the queues it serves (empty: all of them), its concurrency and
    pgqueue's version. What a worker writes (``WorkerEntry``) and what operators read
    (``admin_values.WorkerInfo``) both begin with it."""

    id: str
    host: str
    pid: int
    queues: tuple[str, ...]
    concurrency: int
    version: str


@dataclass(frozen=True, slots=True)
class WorkerEntry(WorkerIdentity):
    """What a worker writes about itself to the worker registry.

    ``started_at`` is None until its first registration returned the database's start time;
    ``claim_error`` is the error of its latest claim while its claims fail, None while they
    work; ``tasks`` names the tasks it registers (the only ones it claims); ``pool`` is where
    it runs sync handlers (``Settings.pool``).
    """

    started_at: dt.datetime | None = None
    claim_error: str | None = None
    tasks: tuple[str, ...] = ()
    pool: str | None = None


@dataclass(frozen=True, slots=True)
class WorkflowPlan:
    """A workflow ready to insert: its validated jobs, each job's parents (indexes into
    ``jobs``, in the order their results are passed) and ``WorkflowRole`` value, the indexes
    of the jobs whose results are the workflow's result, and of its ``on_failure`` job."""

    jobs: Sequence[NewJob]
    parents: Sequence[tuple[int, ...]]
    roles: Sequence[int]
    final: tuple[int, ...]
    on_failure: int | None = None


@dataclass(frozen=True, slots=True)
class InsertedWorkflow:
    """What inserting a ``WorkflowPlan`` gave: the workflow's id and its jobs' ids (in the
    plan's order), the closing marker's id last."""

    id: int
    job_ids: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class JobTables:
    """Where jobs are: ``pgqueue_jobs`` alone, or, under the partitioned history, also
    ``pgqueue_job_history`` (finished jobs moved there). Without it nothing touches the history
    table, since a role may hold no rights on it. Every ``db.Executor`` carries one, set by
    whoever made it from its settings; the data layer's reads of jobs ask it."""

    partitioned: bool = False

    @classmethod
    def of(cls, settings: Settings) -> JobTables:
        """The tables ``settings`` put jobs in (one of two shared values: it is asked once per
        unit of work)."""
        return _PARTITIONED if settings.partitioned_history else IN_PLACE

    @property
    def reads(self) -> tuple[bool, ...]:
        """The tables a read of jobs covers, as the statements' ``history`` flag. The live
        table comes first: a job moved between two reads is then seen twice (and kept once)
        rather than missed."""
        return (False, True) if self.partitioned else (False,)


# ``pgqueue_jobs`` alone: the tables of the default layout, and of an executor made with no
# settings at hand (migrations, steps), whose work reads no moved job.
IN_PLACE: Final = JobTables()
_PARTITIONED: Final = JobTables(partitioned=True)
