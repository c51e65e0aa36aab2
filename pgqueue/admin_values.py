"""The values of the admin API (``pgq.admin``): the records its reads return, its limits and
defaults, and the checks of its arguments that run before any SQL. Pure; ``pgqueue.admin``
re-exports the names of ``__all__``, which is where users import them from (the others serve
pgqueue itself).
"""

from __future__ import annotations

import datetime as dt
import getpass
import os
import socket
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

from pgqueue.errors import ValidationError
from pgqueue.job_filter import BulkAction
from pgqueue.job_search import (
    DEFAULT_SEARCH_SCAN,
    JsonMatch,
    SearchExtent,
    check_error_text,
    check_scan,
    check_window,
)
from pgqueue.jobs import WorkerIdentity
from pgqueue.models import Job
from pgqueue.states import JobState

__all__ = [
    "AUDIT_SOURCES",
    "DEFAULT_COUNT_CAP",
    "DEFAULT_PAGE_SIZE",
    "DEFAULT_SEARCH_SCAN",
    "DEFAULT_THROUGHPUT_CAP",
    "MAX_JOB_ID",
    "MAX_PAGE_SIZE",
    "BulkResult",
    "JobHolder",
    "JobPage",
    "JsonMatch",
    "KeyOverride",
    "ListArguments",
    "OldestWaiting",
    "QueueSettings",
    "RecentActivity",
    "SearchExtent",
    "Throughput",
    "WaitTime",
    "WorkerInfo",
    "check_job_id",
    "default_actor",
    "list_arguments",
    "page_of",
]

MAX_JOB_ID: Final = 2**63 - 1  # job ids are bigint
MAX_QUEUE_DEPTH: Final = 2**31 - 1  # a queue's bound is an integer column
DEFAULT_PAGE_SIZE: Final = 50
MAX_PAGE_SIZE: Final = 1000
# A capped count reads at most this many index entries per queue and state, so it costs the
# same however much history the jobs table holds.
DEFAULT_COUNT_CAP: Final = 1000
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


@dataclass(frozen=True, slots=True)
class JobPage:
    """One page of jobs, newest first, with the cursors of the pages beside it.

    ``newer`` is the ``after=`` and ``older`` the ``before=`` of the adjacent pages; None when
    there is no such page. A search (``ListArguments.searching``) orders its page by its
    window's column (``created_at``: by id; ``finished_at``: newest finished first), and says
    in ``search`` how much of the window it read; its ``older`` continues where the search
    stopped, which, when it was cut short, is past the page's last job.
    """

    jobs: tuple[Job, ...]
    newer: int | None
    older: int | None
    search: SearchExtent | None = None


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
class WaitTime:
    """How long the ``jobs`` that finished in one bucket of time waited from their ``run_at``
    to their claim, in seconds: the median ``p50`` and the 95th percentile ``p95``."""

    jobs: int
    p50: float
    p95: float


@dataclass(frozen=True, slots=True)
class RecentActivity:
    """The overview's throughput and, over the same buckets, its wait times per queue
    (``waits[queue][0]`` the newest bucket, None where none of the queue's jobs finished)."""

    throughput: Throughput
    waits: dict[str, list[WaitTime | None]]


@dataclass(frozen=True, slots=True)
class WorkerInfo(WorkerIdentity):
    """One worker process in the worker registry (who it is: ``WorkerIdentity``).

    ``seconds_since_seen`` counts from its latest heartbeat (database clock); ``live`` is false
    once that exceeds the stale interval (``Settings.worker_stale_seconds``). ``running`` is the
    number of RUNNING jobs it holds. ``claim_error`` is the error of its latest claim while its
    claims fail (it is alive but takes no work), and ``seconds_failing`` how long they have
    failed; both None while its claims work. ``tasks`` names the tasks it registers, the only
    ones it claims (None for a worker of a version that did not record them); ``pool`` is where
    it runs sync handlers, ``thread`` or ``process`` (None likewise).
    """

    started_at: dt.datetime
    last_seen_at: dt.datetime
    seconds_since_seen: float
    live: bool
    running: int
    claim_error: str | None = None
    seconds_failing: float | None = None
    tasks: tuple[str, ...] | None = None
    pool: str | None = None

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
    """The filters and cursor of a job listing (checked by ``list_arguments``): jobs of
    ``queue``, in ``state``, of task ``task_name`` (None: any), up to ``limit`` of them, older
    than job ``before`` or newer than job ``after`` (None: from the newest).

    The search filters (``pgqueue.job_search``): job ``job_id`` alone; created (or, with
    ``time_column="finished_at"``, finished) from ``since`` on and before ``until``;
    ``error_contains`` found in ``last_error`` ignoring case; ``json_match`` on the arguments
    or the result. A listing with a window, error text or JSON match is a search: it reads at
    most ``scan`` jobs of its window."""

    queue: str | None = None
    state: JobState | None = None
    task_name: str | None = None
    before: int | None = None
    after: int | None = None
    limit: int = DEFAULT_PAGE_SIZE
    job_id: int | None = None
    since: dt.datetime | None = None
    until: dt.datetime | None = None
    time_column: str = "created_at"
    error_contains: str | None = None
    json_match: JsonMatch | None = None
    scan: int = DEFAULT_SEARCH_SCAN

    @property
    def searching(self) -> bool:
        """A bounded search of a window, not a walk of the listing indexes."""
        return (
            self.since is not None
            or self.until is not None
            or self.error_contains is not None
            or self.json_match is not None
        )


def check_job_id(value: object, *, what: str = "job id") -> int:
    """``value`` as a job id (or, ``what`` naming it, a workflow id: both are ``bigint``
    identities); ValidationError unless it is a positive int within ``bigint``."""
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise ValidationError(f"{what} must be a positive int, got {value!r}")
    if value > MAX_JOB_ID:
        raise ValidationError(f"{what} must be at most {MAX_JOB_ID} (a bigint), got {value}")
    return value


def default_actor() -> str:
    """``user@host`` of this process: the actor of a bulk action when none is given."""
    try:
        user = getpass.getuser()
    except (KeyError, OSError):  # no name for the uid (a container without a passwd entry)
        user = str(os.getuid())
    return f"{user}@{socket.gethostname()}"


def check_actor(actor: object, source: object) -> tuple[str, str]:
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
    job_id: int | None = None,
    since: dt.datetime | None = None,
    until: dt.datetime | None = None,
    time_column: str = "created_at",
    error_contains: str | None = None,
    json_match: JsonMatch | None = None,
    scan: int = DEFAULT_SEARCH_SCAN,
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
    if job_id is not None:
        job_id = check_job_id(job_id)
        if before is not None or after is not None:
            raise ValidationError("job_id names one job: give no before= or after= with it")
    since, until, time_column = check_window(since, until, time_column)
    error_contains = check_error_text(error_contains)
    if json_match is not None and not isinstance(json_match, JsonMatch):
        raise ValidationError(f"json_match must be a JsonMatch, got {json_match!r:.80}")
    if (error_contains is not None or json_match is not None) and since is None and job_id is None:
        raise ValidationError(
            "a search of errors or JSON content needs a window to bound what it reads: give "
            "since= (and until=; they bound time_column, created_at or finished_at)"
        )
    return ListArguments(
        queue,
        state,
        task_name,
        before,
        after,
        limit,
        job_id,
        since,
        until,
        time_column,
        error_contains,
        json_match,
        check_scan(scan),
    )


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
