"""The sentence of each ``Blocker``: one builder per kind, turning the facts behind it into a
readable sentence and its data, and the way durations and moments read in those sentences.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping, Sequence
from typing import Any

from pgqueue.errors import error_summary
from pgqueue.explain._values import AHEAD_CAP, LIST_CAP, Blocker, BlockerKind
from pgqueue.states import JobState, WorkflowRole


def no_ticket(state: JobState) -> Blocker:
    return Blocker(
        BlockerKind.NO_TICKET,
        f"the job is {state.value} but has no ticket, so no worker can claim it (its row "
        "was written or edited by hand): delete it and enqueue it again",
        {"state": state.value},
    )


def scheduled(job: Any, state: JobState, run_at: dt.datetime, now: dt.datetime) -> Blocker:
    when = f"{_when(run_at)} (in {_duration((run_at - now).total_seconds())})"
    # A QUEUED job with snoozes was last put back by its handler's ``Snooze``.
    snoozed = state is JobState.QUEUED and job.snoozes > 0
    return Blocker(
        BlockerKind.SCHEDULED,
        f"snoozed {job.snoozes} {'time' if job.snoozes == 1 else 'times'}, next run at {when}"
        if snoozed
        else f"run_at is in the future: {when}",
        {
            "run_at": run_at,
            "seconds": (run_at - now).total_seconds(),
            "snoozes": job.snoozes,
        },
    )


def suspended(suspension: Any, now: dt.datetime) -> Blocker:
    """A job its handler suspended (``ctx.sleep``, ``ctx.wait_for_signal``)."""
    signal, wake_at, arrived = suspension
    when = f"{_when(wake_at)} (in {_duration((wake_at - now).total_seconds())})"
    if signal is None:
        message = f"sleeping (ctx.sleep) until {when}"
    elif arrived:
        message = (
            f"signal {signal!r} arrived: the job resumes as soon as a worker claims it "
            f"(it waited with a deadline of {_when(wake_at)})"
        )
    else:
        message = (
            f"waiting for signal {signal!r} (ctx.wait_for_signal) until {when}; then it "
            "resumes and the wait raises SignalTimeout"
        )
    return Blocker(
        BlockerKind.SUSPENDED,
        message,
        {
            "signal": signal,
            "wake_at": wake_at,
            "seconds": (wake_at - now).total_seconds(),
            "arrived": bool(arrived),
        },
    )


def paused(job: Any) -> Blocker:
    return Blocker(
        BlockerKind.PAUSED,
        f"queue {job.queue} is paused: `pgqueue resume {job.queue}` lets workers claim it again",
        {"queue": job.queue},
    )


def at_limit(job: Any, limit: int, running_ids: Sequence[int]) -> Blocker:
    ids = list(running_ids)
    return Blocker(
        BlockerKind.AT_LIMIT,
        f"queue {job.queue} is at its limit of {limit} running "
        f"{_noun(limit, 'job', 'jobs')}: {_ids_and_more(ids, job.running)}",
        {"queue": job.queue, "limit": limit, "running": job.running, "running_job_ids": ids},
    )


def no_live_worker(job: Any, live_workers: int) -> Blocker:
    others = (
        f"{live_workers}{'+' if live_workers >= LIST_CAP else ''} live "
        f"{'worker claims' if live_workers == 1 else 'workers claim'} other queues"
        if live_workers
        else "no worker is alive at all"
    )
    return Blocker(
        BlockerKind.NO_LIVE_WORKER,
        f"no live worker serves queue {job.queue} ({others}): start one with "
        f"`pgqueue worker APP --queues {job.queue}`",
        {"queue": job.queue, "live_workers": live_workers},
    )


def key_in_controlled_queue(job: Any) -> Blocker:
    return Blocker(
        BlockerKind.KEY_IN_CONTROLLED_QUEUE,
        f"the job has concurrency key {job.concurrency_key} and queue {job.queue} has a "
        "concurrency or rate limit; workers do not claim keyed jobs of such queues: "
        "remove the queue's limit or enqueue into another queue",
        {"queue": job.queue, "key": job.concurrency_key},
    )


def key_at_limit(job: Any, running: int, limit: int, running_ids: Sequence[int]) -> Blocker:
    ids = list(running_ids)
    key = job.concurrency_key
    return Blocker(
        BlockerKind.KEY_AT_LIMIT,
        f"key {key} at its limit: {running} of {limit} running, "
        f"{_noun(len(ids), 'job', 'jobs')} {_ids_and_more(ids, running)}",
        {"key": key, "limit": limit, "running": running, "running_job_ids": ids},
    )


def _ids_and_more(ids: Sequence[int], total: int) -> str:
    """``ids`` listed (``none found`` when empty), and how many of ``total`` were not."""
    more = total - len(ids)
    listed = ", ".join(str(i) for i in ids) or "none found"
    return listed + (f" and {more} more" if more > 0 else "")


def _noun(count: int, one: str, many: str) -> str:
    """``one`` for a count of 1, else ``many``."""
    return one if count == 1 else many


def bounded(job: Any, max_depth: int, depth: int) -> Blocker:
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


def rate_limited(what: str, limit: int, per: float, started: int, wait: float) -> Blocker:
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


def dependencies(job: Any, dependencies: Mapping[int, JobState | None]) -> Blocker:
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
    # A workflow job counts its unfinished dependencies: the count is exact however many it
    # has, where the states read are the first few only.
    counted = getattr(job, "pending_dependencies", None)
    waiting_for = len(pending) if counted is None else counted
    workflow = getattr(job, "workflow_id", None)
    return Blocker(
        BlockerKind.DEPENDENCIES,
        f"waiting for {waiting_for} of {total} "
        f"{_noun(total, 'dependency', 'dependencies')}"
        + (f" of workflow {workflow}" if workflow is not None else "")
        + f": {described or 'none left'}"
        + (f" (and {unread} not read)" if unread > 0 else ""),
        {
            "dependencies": [
                {"id": dependency, "state": state.value if state is not None else None}
                for dependency, state in dependencies.items()
            ],
            "pending": waiting_for,
            "total": total,
            "workflow_id": workflow,
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


def task_not_registered(job: Any, serving: Sequence[str]) -> Blocker:
    workers = ", ".join(serving) + ("+" if len(serving) >= LIST_CAP else "")
    return Blocker(
        BlockerKind.TASK_NOT_REGISTERED,
        f"no live worker registers task {job.task_name} (live workers serving queue "
        f"{job.queue}: {workers}): it waits for a worker whose code has the task; if the task "
        "is gone for good, cancel or delete the job",
        {"queue": job.queue, "task": job.task_name, "workers": list(serving)},
    )


def claims_failing(job: Any, failing: Mapping[str, tuple[str, float]]) -> Blocker:
    return Blocker(
        BlockerKind.CLAIMS_FAILING,
        f"every live worker serving queue {job.queue} fails to claim: {_failing_list(failing)}; "
        "their logs have the whole error",
        {"queue": job.queue, "failing_workers": _failing_data(failing)},
    )


def ready(
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


def lease_held(job: Any, holder: Sequence[Any] | None) -> Blocker:
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


def finished(job: Any, state: JobState) -> Blocker:
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
    # A workflow's jobs are settled by their workflow, never retried on their own (its
    # on_failure job aside).
    by_hand = (
        getattr(job, "workflow_id", None) is None or job.workflow_role == WorkflowRole.ON_FAILURE
    )
    if state is not JobState.SUCCEEDED and by_hand:
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
