"""Why isn't this job running? The blockers of one job, in the order the claim applies them.

``explain_job`` reads what the claim would check for the job (its row, its ticket, its queue's
switches, the RUNNING jobs filling the queue's limit, its dependencies, the worker registry,
and, for information, a bounded queue's depth),
each read bounded by a key or an index, and ``explanation`` turns those facts into a
``JobExplanation``: the job's state and a list of ``Blocker``s, each an enum kind, one readable
sentence and the data behind it. A job nothing blocks gets one ``READY`` entry with its
position in line; a finished job one ``FINISHED`` entry; a running one ``LEASE_HELD``.
"""

from __future__ import annotations

import datetime as dt
import enum
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from sqlalchemy.orm import Session

from pgqueue.db import executor_for
from pgqueue.errors import JobNotFound, error_summary
from pgqueue.sql import explain as sql
from pgqueue.sql import flow as flow_sql
from pgqueue.sql import workers as registry
from pgqueue.states import FINAL_STATES, JobState

__all__ = [
    "AHEAD_CAP",
    "DEPENDENCY_CAP",
    "LIST_CAP",
    "Blocker",
    "BlockerKind",
    "JobExplanation",
    "JobFacts",
    "explain_job",
    "explanation",
]

# Counting tickets ahead stops here ("at least"), so a deep queue costs no more to explain.
AHEAD_CAP: Final = 10_000
# Job and worker ids listed in one sentence (the running jobs of a full queue, the live workers).
LIST_CAP: Final = 20
# Dependencies read for one job; a job with more names the first ones and counts the rest.
DEPENDENCY_CAP: Final = 200


class BlockerKind(enum.StrEnum):
    """What an entry of a ``JobExplanation`` says, in the order the claim checks it."""

    FINISHED = "finished"
    """The job ended (succeeded, failed or cancelled): nothing will run it again by itself."""
    LEASE_HELD = "lease_held"
    """It is RUNNING: a worker holds its lease (who, last seen when, until when)."""
    NO_TICKET = "no_ticket"
    """QUEUED or RETRYING without a ticket (a row written by hand): no claim can find it."""
    DEPENDENCIES = "dependencies"
    """WAITING for dependencies to succeed (which, and their states)."""
    SCHEDULED = "scheduled"
    """Its ``run_at`` is in the future (when)."""
    PAUSED = "paused"
    """Its queue is paused."""
    AT_LIMIT = "at_limit"
    """Its queue is at its concurrency limit (the RUNNING jobs filling it)."""
    RATE_LIMITED = "rate_limited"
    """Its queue's (or its key's) rate limit is used up for now (when the window frees)."""
    KEY_AT_LIMIT = "key_at_limit"
    """Its concurrency key is at its limit (the RUNNING jobs with the key)."""
    KEY_IN_CONTROLLED_QUEUE = "key_in_controlled_queue"
    """It has a concurrency key and its queue a concurrency or rate limit: such jobs wait."""
    NO_LIVE_WORKER = "no_live_worker"
    """No live worker claims from its queue."""
    TASK_NOT_REGISTERED = "task_not_registered"
    """Live workers claim from its queue, but none registers its task: it waits for one that
    does (a rolling deploy under way, or a task removed from the code)."""
    CLAIMS_FAILING = "claims_failing"
    """Every live worker serving its queue fails to claim (each one's error, for how long)."""
    READY = "ready"
    """Nothing blocks it: claimable now, with this many tickets of its queue ahead of it."""
    BOUNDED = "bounded"
    """Informational, never a blocker: its queue is bounded (its ``max_depth`` and how many
    jobs wait in it now). A bound refuses new enqueues; it never holds back a waiting job."""


@dataclass(frozen=True, slots=True)
class Blocker:
    """One reason, as a kind, a sentence and its data (JSON-ready values and datetimes)."""

    kind: BlockerKind
    message: str
    data: Mapping[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """``{"kind", "message", "data"}`` with datetimes in ISO 8601."""
        return {"kind": self.kind.value, "message": self.message, "data": _jsonable(self.data)}


@dataclass(frozen=True, slots=True)
class JobExplanation:
    """Why job ``job_id`` is (not) running, as checked at ``checked_at`` (database clock)."""

    job_id: int
    task_name: str
    queue: str
    state: JobState
    checked_at: dt.datetime
    blockers: tuple[Blocker, ...]

    @property
    def kinds(self) -> tuple[BlockerKind, ...]:
        """The kinds of the entries, in order."""
        return tuple(blocker.kind for blocker in self.blockers)

    @property
    def headline(self) -> str:
        """``job 42 (send_receipt, queue default): queued``."""
        return f"job {self.job_id} ({self.task_name}, queue {self.queue}): {self.state.value}"

    def to_dict(self) -> dict[str, Any]:
        """The explanation as JSON-ready values."""
        return {
            "job_id": self.job_id,
            "task_name": self.task_name,
            "queue": self.queue,
            "state": self.state.value,
            "checked_at": self.checked_at.isoformat(),
            "blockers": [blocker.to_dict() for blocker in self.blockers],
        }


@dataclass(frozen=True, slots=True)
class JobFacts:
    """What the database says about one job, its queue and the workers (see ``explain_job``)."""

    job: Any
    """The ``sql.explain.job_facts`` row."""
    running_ids: Sequence[int]
    """RUNNING jobs of the queue (up to ``LIST_CAP``), read when the queue has a limit."""
    dependencies: Mapping[int, JobState | None]
    """Each dependency read (up to ``DEPENDENCY_CAP``) -> its state, None when it is gone."""
    ahead: int | None
    """Ready tickets of the queue ahead of the job's (capped at ``AHEAD_CAP``); None without a
    ticket."""
    holder: Sequence[Any] | None
    """The ``sql.workers.job_holder`` row of a running job (lease owner, host, pid, last seen,
    seconds since seen, live), None when its worker is not registered."""
    serving_workers: Sequence[str]
    """Live workers claiming from the queue (up to ``LIST_CAP``)."""
    live_workers: int
    """Live workers in all (up to ``LIST_CAP``)."""
    failing_workers: Mapping[str, tuple[str, float]] = field(default_factory=dict)
    """Of ``serving_workers``, those whose claims fail: id -> (error, seconds failing)."""
    bound: tuple[int, int] | None = None
    """``(max_depth, depth)`` of a bounded queue (depth counted up to one more than the
    bound), None when the queue is unbounded or the job does not wait."""
    key: Any = None
    """The ``sql.flow.key_facts`` row of a waiting job's concurrency key (None: no key)."""
    key_running_ids: Sequence[int] = ()
    """RUNNING jobs with the job's key (up to ``LIST_CAP``), read when the key is at its limit."""
    queue_rate: Any = None
    """The ``sql.flow.queue_rate_facts`` row when the job's queue has a rate limit."""
    task_registered: bool = True
    """Whether a live worker serving the queue registers the job's task (read when the job
    waits and some live worker serves the queue)."""


def explain_job(session: Session, job_id: int, *, stale_seconds: float) -> JobExplanation:
    """Read the facts about job ``job_id`` in ``session`` and explain them; a worker is live
    when the registry saw it within ``stale_seconds``. Raises JobNotFound."""
    db = executor_for(session)
    rows = db.rows(sql.job_facts(), {"job_id": job_id})
    if not rows:
        raise JobNotFound(f"no job with id {job_id}")
    job = rows[0]
    state = JobState(job.state)
    finished = state in FINAL_STATES
    running_ids: list[int] = []
    if not finished and job.concurrency_limit is not None:
        params = {"queue": job.queue, "cap": LIST_CAP}
        running_ids = [row[0] for row in db.rows(sql.running_in_queue(), params)]
    dependencies: dict[int, JobState | None] = {}
    if state is JobState.WAITING and job.depends_on:
        wanted = list(job.depends_on)[:DEPENDENCY_CAP]
        dependencies = dict.fromkeys(wanted)
        for dependency_id, dependency_state in db.rows(sql.dependency_states(), {"ids": wanted}):
            dependencies[dependency_id] = JobState(dependency_state)
    ahead: int | None = None
    if job.has_ticket and not finished:
        ahead = db.rows(
            sql.tickets_ahead(),
            {
                "atomic": job.ticket_atomic,
                "priority": job.ticket_priority,
                "run_at": job.ticket_run_at,
                "job_id": job.id,
                "queue": job.queue,
                "cap": AHEAD_CAP,
            },
        )[0][0]
    holder = None
    if state is JobState.RUNNING and job.lease_owner is not None:
        found = db.rows(registry.job_holder(), {"job_id": job.id, "stale_seconds": stale_seconds})
        # Its host is null when the lease owner has no registry row.
        holder = found[0] if found and found[0][1] is not None else None
    serving: list[str] = []
    failing: dict[str, tuple[str, float]] = {}
    live = 0
    task_registered = True
    if not finished and state is not JobState.RUNNING:
        workers = {"stale_seconds": stale_seconds, "cap": LIST_CAP}
        for worker_id, claim_error, failing_for in db.rows(
            sql.live_workers(serving_queue=True), {**workers, "queue": job.queue}
        ):
            serving.append(worker_id)
            if claim_error is not None:
                failing[worker_id] = (claim_error, float(failing_for or 0.0))
        live = len(db.rows(sql.live_workers(serving_queue=False), workers))
        if serving:
            params = {"stale_seconds": stale_seconds, "queue": job.queue, "task": job.task_name}
            task_registered = bool(db.rows(sql.task_registered(), params)[0][0])
    bound = None
    key: Any = None
    key_running: list[int] = []
    queue_rate: Any = None
    if not finished and state is not JobState.RUNNING:
        key, key_running, queue_rate = _flow_facts(db, job)
        if job.max_depth is not None:
            params = {"queue": job.queue, "cap": job.max_depth + 1}
            bound = (job.max_depth, int(db.rows(sql.queue_depth(), params)[0][0]))
    facts = JobFacts(
        job,
        running_ids,
        dependencies,
        ahead,
        holder,
        serving,
        live,
        failing_workers=failing,
        bound=bound,
        key=key,
        key_running_ids=key_running,
        queue_rate=queue_rate,
        task_registered=task_registered,
    )
    return explanation(facts)


def _flow_facts(db: Any, job: Any) -> tuple[Any, list[int], Any]:
    """The key row, the RUNNING jobs filling the key, and the queue's rate (each None or empty
    when the job has no key, or its queue no rate limit)."""
    key = None
    key_running: list[int] = []
    if job.concurrency_key is not None:
        found = db.rows(flow_sql.key_facts(), {"key": job.concurrency_key})
        key = found[0] if found else None
        if key is not None and key[1] is not None and key[0] >= key[1]:
            params = {"key": job.concurrency_key, "cap": LIST_CAP}
            key_running = [row[0] for row in db.rows(flow_sql.running_with_key(), params)]
    queue_rate = None
    if job.rate_limit is not None:
        found = db.rows(flow_sql.queue_rate_facts(), {"queue": job.queue})
        queue_rate = found[0] if found else None
    return key, key_running, queue_rate


def explanation(facts: JobFacts) -> JobExplanation:
    """The entries that hold for ``facts``, in the order the claim applies them."""
    job = facts.job
    state = JobState(job.state)
    if state in FINAL_STATES:
        blockers = [_finished(job, state)]
    elif state is JobState.RUNNING:
        blockers = [_lease_held(job, facts.holder)]
    else:
        blockers = _waiting_blockers(facts, state)
    return JobExplanation(
        job_id=job.id,
        task_name=job.task_name,
        queue=job.queue,
        state=state,
        checked_at=job.now,
        blockers=tuple(blockers),
    )


def _waiting_blockers(facts: JobFacts, state: JobState) -> list[Blocker]:
    job = facts.job
    now: dt.datetime = job.now
    blockers: list[Blocker] = []
    if state is not JobState.WAITING and not job.has_ticket:
        blockers.append(
            Blocker(
                BlockerKind.NO_TICKET,
                f"the job is {state.value} but has no ticket, so no worker can claim it (its row "
                "was written or edited by hand): delete it and enqueue it again",
                {"state": state.value},
            )
        )
    if state is JobState.WAITING:
        blockers.append(_dependencies(job, facts.dependencies))
    run_at: dt.datetime = job.ticket_run_at if job.has_ticket else job.run_at
    if run_at > now:
        when = f"{_when(run_at)} (in {_duration((run_at - now).total_seconds())})"
        # A QUEUED job with snoozes was last put back by its handler's ``Snooze``.
        snoozed = state is JobState.QUEUED and job.snoozes > 0
        blockers.append(
            Blocker(
                BlockerKind.SCHEDULED,
                f"snoozed {job.snoozes} {'time' if job.snoozes == 1 else 'times'}, "
                f"next run at {when}"
                if snoozed
                else f"run_at is in the future: {when}",
                {
                    "run_at": run_at,
                    "seconds": (run_at - now).total_seconds(),
                    "snoozes": job.snoozes,
                },
            )
        )
    if job.paused:
        blockers.append(
            Blocker(
                BlockerKind.PAUSED,
                f"queue {job.queue} is paused: `pgqueue resume {job.queue}` lets workers claim "
                "it again",
                {"queue": job.queue},
            )
        )
    limit = job.concurrency_limit
    if limit is not None and job.running >= limit:
        ids = list(facts.running_ids)
        listed = ", ".join(str(i) for i in ids) or "none found"
        more = job.running - len(ids)
        blockers.append(
            Blocker(
                BlockerKind.AT_LIMIT,
                f"queue {job.queue} is at its limit of {limit} running "
                f"{'job' if limit == 1 else 'jobs'}: {listed}"
                + (f" and {more} more" if more > 0 else ""),
                {
                    "queue": job.queue,
                    "limit": limit,
                    "running": job.running,
                    "running_job_ids": ids,
                },
            )
        )
    blockers.extend(_flow_blockers(facts))
    if not facts.serving_workers:
        others = (
            f"{facts.live_workers}{'+' if facts.live_workers >= LIST_CAP else ''} live "
            f"{'worker claims' if facts.live_workers == 1 else 'workers claim'} other queues"
            if facts.live_workers
            else "no worker is alive at all"
        )
        blockers.append(
            Blocker(
                BlockerKind.NO_LIVE_WORKER,
                f"no live worker serves queue {job.queue} ({others}): start one with "
                f"`pgqueue worker APP --queues {job.queue}`",
                {"queue": job.queue, "live_workers": facts.live_workers},
            )
        )
    if facts.serving_workers and not facts.task_registered:
        blockers.append(_task_not_registered(job, facts.serving_workers))
    failing = facts.failing_workers
    if facts.serving_workers and len(failing) == len(facts.serving_workers):
        blockers.append(_claims_failing(job, failing))
    if not blockers and facts.ahead is not None:
        blockers.append(_ready(job, facts.ahead, facts.serving_workers, failing))
    if facts.bound is not None:
        blockers.append(_bounded(job, *facts.bound))
    return blockers


def _bounded(job: Any, max_depth: int, depth: int) -> Blocker:
    waiting = f"more than {max_depth}" if depth > max_depth else str(depth)
    full = depth >= max_depth
    return Blocker(
        BlockerKind.BOUNDED,
        f"(information) queue {job.queue} is bounded at {max_depth} waiting "
        f"{'job' if max_depth == 1 else 'jobs'} and holds {waiting} now"
        + (": new enqueues into it raise QueueFull" if full else "")
        + "; the bound never holds back a job already waiting",
        {"queue": job.queue, "max_depth": max_depth, "depth": depth, "full": full},
    )


def _flow_blockers(facts: JobFacts) -> list[Blocker]:
    """The key's limit, the key's rate and the queue's rate, as the claim checks them."""
    job = facts.job
    blockers: list[Blocker] = []
    if job.concurrency_key is not None and (
        job.concurrency_limit is not None or job.rate_limit is not None
    ):
        blockers.append(
            Blocker(
                BlockerKind.KEY_IN_CONTROLLED_QUEUE,
                f"the job has concurrency key {job.concurrency_key} and queue {job.queue} has a "
                "concurrency or rate limit; workers do not claim keyed jobs of such queues: "
                "remove the queue's limit or enqueue into another queue",
                {"queue": job.queue, "key": job.concurrency_key},
            )
        )
    key = facts.key
    if key is not None:
        running, limit, rate_limit, rate_per, in_window, wait = key
        if limit is not None and running >= limit:
            ids = list(facts.key_running_ids)
            listed = ", ".join(str(i) for i in ids) or "none found"
            more = running - len(ids)
            blockers.append(
                Blocker(
                    BlockerKind.KEY_AT_LIMIT,
                    f"key {job.concurrency_key} at its limit: {running} of {limit} running, "
                    f"{'job' if len(ids) == 1 else 'jobs'} {listed}"
                    + (f" and {more} more" if more > 0 else ""),
                    {
                        "key": job.concurrency_key,
                        "limit": limit,
                        "running": running,
                        "running_job_ids": ids,
                    },
                )
            )
        if wait is not None:
            blockers.append(
                _rate_limited(f"key {job.concurrency_key}", rate_limit, rate_per, in_window, wait)
            )
    if facts.queue_rate is not None:
        rate_limit, rate_per, in_window, wait = facts.queue_rate
        if wait is not None:
            blockers.append(
                _rate_limited(f"queue {job.queue}", rate_limit, rate_per, in_window, wait)
            )
    return blockers


def _rate_limited(what: str, limit: int, per: float, started: int, wait: float) -> Blocker:
    return Blocker(
        BlockerKind.RATE_LIMITED,
        f"{what} is at its rate limit: {started} of {limit} started in the last "
        f"{_seconds(per)}; the window has room again in {_seconds(float(wait))}",
        {
            "scope": what,
            "limit": limit,
            "per": per,
            "started": started,
            "seconds": float(wait),
        },
    )


def _dependencies(job: Any, dependencies: Mapping[int, JobState | None]) -> Blocker:
    total = len(job.depends_on or ())
    pending = {
        dependency: state
        for dependency, state in dependencies.items()
        if state is not JobState.SUCCEEDED
    }
    described = ", ".join(
        f"{dependency} ({state.value if state is not None else 'missing'})"
        for dependency, state in pending.items()
    )
    unread = total - len(dependencies)
    return Blocker(
        BlockerKind.DEPENDENCIES,
        f"waiting for {len(pending)} of {total} "
        f"{'dependency' if total == 1 else 'dependencies'}: {described or 'none left'}"
        + (f" (and {unread} not read)" if unread > 0 else ""),
        {
            "dependencies": [
                {"id": dependency, "state": state.value if state is not None else None}
                for dependency, state in dependencies.items()
            ],
            "pending": len(pending),
            "total": total,
        },
    )


def _failing_list(failing: Mapping[str, tuple[str, float]]) -> str:
    """``w1 (for 2 min 5 s: <error>), w2 (...)``."""
    return ", ".join(
        f"{worker_id} (for {_duration(seconds)}: {error})"
        for worker_id, (error, seconds) in failing.items()
    )


def _failing_data(failing: Mapping[str, tuple[str, float]]) -> dict[str, Any]:
    return {
        worker_id: {"error": error, "seconds_failing": seconds}
        for worker_id, (error, seconds) in failing.items()
    }


def _task_not_registered(job: Any, serving: Sequence[str]) -> Blocker:
    workers = ", ".join(serving) + ("+" if len(serving) >= LIST_CAP else "")
    return Blocker(
        BlockerKind.TASK_NOT_REGISTERED,
        f"no live worker registers task {job.task_name} (live workers serving queue "
        f"{job.queue}: {workers}): it waits for a worker whose code has the task; if the task "
        "is gone for good, cancel or delete the job",
        {"queue": job.queue, "task": job.task_name, "workers": list(serving)},
    )


def _claims_failing(job: Any, failing: Mapping[str, tuple[str, float]]) -> Blocker:
    return Blocker(
        BlockerKind.CLAIMS_FAILING,
        f"every live worker serving queue {job.queue} fails to claim: {_failing_list(failing)}; "
        "their logs have the whole error",
        {"queue": job.queue, "failing_workers": _failing_data(failing)},
    )


def _ready(
    job: Any, ahead: int, serving: Sequence[str], failing: Mapping[str, tuple[str, float]]
) -> Blocker:
    at_least = ahead >= AHEAD_CAP
    count = f"at least {ahead}" if at_least else str(ahead)
    in_line = (
        "it is next in line"
        if ahead == 0
        else f"{count} {'job' if ahead == 1 else 'jobs'} of queue {job.queue} ahead of it"
    )
    workers = ", ".join(serving) + ("+" if len(serving) >= LIST_CAP else "")
    also = f"; failing to claim: {_failing_list(failing)}" if failing else ""
    data: dict[str, Any] = {"position": ahead, "at_least": at_least, "workers": list(serving)}
    if failing:
        data["failing_workers"] = _failing_data(failing)
    return Blocker(
        BlockerKind.READY,
        f"claimable now, {in_line}; live workers serving the queue: {workers}{also}",
        data,
    )


def _lease_held(job: Any, holder: Sequence[Any] | None) -> Blocker:
    now: dt.datetime = job.now
    started = f"running since {_when(job.started_at)}" if job.started_at else "running"
    owner = job.lease_owner
    data: dict[str, Any] = {
        "worker_id": owner,
        "started_at": job.started_at,
        "lease_expires_at": job.lease_expires_at,
        "host": None,
        "pid": None,
        "last_seen_seconds": None,
        "live": False,
    }
    if owner is None:
        who = "held by no worker (no lease owner recorded)"
    elif holder is None:
        who = f"lease held by worker {owner}, which is not in the worker registry"
    else:
        _, host, pid, _, seen_seconds, live = holder
        seen = float(seen_seconds)
        data.update(host=host, pid=pid, last_seen_seconds=seen, live=bool(live))
        who = (
            f"lease held by worker {owner} (host {host}, pid {pid}), "
            f"last seen {_duration(seen)} ago" + ("" if live else " (not live)")
        )
    expires: dt.datetime | None = job.lease_expires_at
    if expires is None:
        lease = "an atomic job: its claiming transaction holds it"
    elif expires > now:
        left = (expires - now).total_seconds()
        lease = f"lease until {_when(expires)} (in {_duration(left)})"
    else:
        lease = (
            f"lease expired {_duration((now - expires).total_seconds())} ago: a worker's "
            "rescue pass re-queues it"
        )
    return Blocker(
        BlockerKind.LEASE_HELD,
        f"{started}, attempt {job.attempts} of {job.max_attempts}; {who}; {lease}",
        data,
    )


def _finished(job: Any, state: JobState) -> Blocker:
    at = f" at {_when(job.finished_at)}" if job.finished_at else ""
    attempts = f"{job.attempts} {'attempt' if job.attempts == 1 else 'attempts'}"
    last_error = error_summary(job.last_error) if job.last_error else None
    if state is JobState.SUCCEEDED:
        message = f"succeeded{at} after {attempts}"
    elif state is JobState.FAILED:
        message = f"failed{at} after {attempts}" + (
            f", last error: {last_error}" if last_error else ""
        )
    else:
        message = f"cancelled{at}" + (f": {last_error}" if last_error else "")
    if state is not JobState.SUCCEEDED:
        message += f" (`pgqueue retry {job.id}` runs it again)"
    return Blocker(
        BlockerKind.FINISHED,
        message,
        {
            "state": state.value,
            "finished_at": job.finished_at,
            "attempts": job.attempts,
            "last_error": last_error,
        },
    )


def _when(moment: dt.datetime) -> str:
    return moment.astimezone(dt.UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def _seconds(total_seconds: float) -> str:
    """``0.4 s``, ``12.5 s``; from a minute on as ``_duration`` says it."""
    if total_seconds < 60:
        return f"{total_seconds:.1f} s"
    return _duration(total_seconds)


def _duration(total_seconds: float) -> str:
    """``4 s``, ``2 min 5 s``, ``3 h 0 min``, ``2 d 4 h``."""
    whole = max(0, round(total_seconds))
    days, rest = divmod(whole, 86_400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    if days:
        return f"{days} d {hours} h"
    if hours:
        return f"{hours} h {minutes} min"
    if minutes:
        return f"{minutes} min {secs} s"
    return f"{secs} s"


def _jsonable(value: Any) -> Any:
    if isinstance(value, dt.datetime):
        return value.isoformat()
    if isinstance(value, Mapping):
        return {key: _jsonable(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_jsonable(item) for item in value]
    return value
