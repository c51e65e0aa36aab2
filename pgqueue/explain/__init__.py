"""Why isn't this job running? The blockers of one job, in the order the claim applies them.

``explain_job`` reads what the claim would check for the job (its row, its ticket, its queue's
switches, the RUNNING jobs filling the queue's limit, its dependencies, the worker registry,
and, for information, a bounded queue's depth) through the data layer (``data.explain``),
each read bounded by a key or an index, and ``explanation`` turns those facts into a
``JobExplanation``: the job's state and a list of ``Blocker``s, each an enum kind, one readable
sentence and the data behind it. A job nothing blocks gets one ``READY`` entry with its
position in line; a finished job one ``FINISHED`` entry; a running one ``LEASE_HELD``.

The diagnosis touches no database: ``_values`` holds the explanation's values and
``_sentences`` each blocker's sentence, and this module decides which blockers hold.
"""

from __future__ import annotations

from typing import Any

from pgqueue.data import explain as explain_data
from pgqueue.data import signals as signals_data
from pgqueue.data import workers as workers_data
from pgqueue.db import Executor
from pgqueue.errors import JobNotFound
from pgqueue.explain import _sentences as sentences
from pgqueue.explain._values import AHEAD_CAP as AHEAD_CAP
from pgqueue.explain._values import DEPENDENCY_CAP as DEPENDENCY_CAP
from pgqueue.explain._values import LIST_CAP as LIST_CAP
from pgqueue.explain._values import Blocker as Blocker
from pgqueue.explain._values import BlockerKind as BlockerKind
from pgqueue.explain._values import JobExplanation as JobExplanation
from pgqueue.explain._values import JobFacts as JobFacts
from pgqueue.states import FINAL_STATES, JobState


def explain_job(db: Executor, job_id: int, *, stale_seconds: float) -> JobExplanation:
    """Read the facts about job ``job_id`` through ``db`` and explain them; a worker is live
    when the registry saw it within ``stale_seconds``. Raises JobNotFound."""
    job = explain_data.job_facts(db, job_id)
    if job is None:
        raise JobNotFound(f"no job with id {job_id}")
    state = JobState(job.state)
    finished = state in FINAL_STATES
    running_ids: list[int] = []
    if not finished and job.concurrency_limit is not None:
        running_ids = explain_data.running_in_queue(db, job.queue, LIST_CAP)
    dependencies: dict[int, JobState | None] = {}
    if state is JobState.WAITING and job.depends_on:
        wanted = list(job.depends_on)[:DEPENDENCY_CAP]
        dependencies = dict.fromkeys(wanted)
        dependencies.update(explain_data.dependency_states(db, wanted))
    ahead: int | None = None
    if job.has_ticket and not finished:
        ahead = explain_data.tickets_ahead(db, job, AHEAD_CAP)
    holder = None
    if state is JobState.RUNNING and job.lease_owner is not None:
        found = workers_data.job_holder(db, job.id, stale_seconds)
        # Its host is null when the lease owner has no registry row.
        holder = found if found is not None and found[1] is not None else None
    serving: list[str] = []
    failing: dict[str, tuple[str, float]] = {}
    live = 0
    task_registered = True
    if not finished and state is not JobState.RUNNING:
        for worker_id, claim_error, failing_for in explain_data.serving_workers(
            db, job.queue, stale_seconds, LIST_CAP
        ):
            serving.append(worker_id)
            if claim_error is not None:
                failing[worker_id] = (claim_error, failing_for or 0.0)
        live = explain_data.live_worker_count(db, stale_seconds, LIST_CAP)
        if serving:
            task_registered = explain_data.task_registered(
                db, job.queue, job.task_name, stale_seconds
            )
    suspension = None
    if state is JobState.QUEUED:
        suspension = signals_data.suspension(db, job.id)
    bound = None
    key: Any = None
    key_running: list[int] = []
    queue_rate: Any = None
    if not finished and state is not JobState.RUNNING:
        key, key_running, queue_rate = _flow_facts(db, job)
        if job.max_depth is not None:
            depth = explain_data.queue_depth(db, job.queue, job.max_depth + 1)
            bound = (job.max_depth, depth)
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
        suspension=suspension,
    )
    return explanation(facts)


def _flow_facts(db: Executor, job: Any) -> tuple[Any, list[int], Any]:
    """The key row, the RUNNING jobs filling the key, and the queue's rate (each None or empty
    when the job has no key, or its queue no rate limit)."""
    key = None
    key_running: list[int] = []
    if job.concurrency_key is not None:
        key = explain_data.key_facts(db, job.concurrency_key)
        if key is not None and key[1] is not None and key[0] >= key[1]:
            key_running = explain_data.running_with_key(db, job.concurrency_key, LIST_CAP)
    queue_rate = None
    if job.rate_limit is not None:
        queue_rate = explain_data.queue_rate_facts(db, job.queue)
    return key, key_running, queue_rate


def explanation(facts: JobFacts) -> JobExplanation:
    """The entries that hold for ``facts``, in the order the claim applies them."""
    job = facts.job
    state = JobState(job.state)
    if state in FINAL_STATES:
        blockers = [sentences.finished(job, state)]
    elif state is JobState.RUNNING:
        blockers = [sentences.lease_held(job, facts.holder)]
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
    blockers: list[Blocker] = []
    if state is not JobState.WAITING and not job.has_ticket:
        blockers.append(sentences.no_ticket(state))
    if state is JobState.WAITING:
        blockers.append(sentences.dependencies(job, facts.dependencies))
    run_at = job.ticket_run_at if job.has_ticket else job.run_at
    if facts.suspension is not None and run_at > job.now:
        blockers.append(sentences.suspended(facts.suspension, job.now))
    elif run_at > job.now:
        blockers.append(sentences.scheduled(job, state, run_at, job.now))
    if job.paused:
        blockers.append(sentences.paused(job))
    limit = job.concurrency_limit
    if limit is not None and job.running >= limit:
        blockers.append(sentences.at_limit(job, limit, facts.running_ids))
    blockers.extend(_flow_blockers(facts))
    if not facts.serving_workers:
        blockers.append(sentences.no_live_worker(job, facts.live_workers))
    if facts.serving_workers and not facts.task_registered:
        blockers.append(sentences.task_not_registered(job, facts.serving_workers))
    failing = facts.failing_workers
    if facts.serving_workers and len(failing) == len(facts.serving_workers):
        blockers.append(sentences.claims_failing(job, failing))
    if not blockers and facts.ahead is not None:
        blockers.append(sentences.ready(job, facts.ahead, facts.serving_workers, failing))
    if facts.bound is not None:
        blockers.append(sentences.bounded(job, *facts.bound))
    return blockers


def _flow_blockers(facts: JobFacts) -> list[Blocker]:
    """The key's limit, the key's rate and the queue's rate, as the claim checks them."""
    job = facts.job
    blockers: list[Blocker] = []
    if job.concurrency_key is not None and (
        job.concurrency_limit is not None or job.rate_limit is not None
    ):
        blockers.append(sentences.key_in_controlled_queue(job))
    key = facts.key
    if key is not None:
        running, limit, rate_limit, rate_per, in_window, wait = key
        if limit is not None and running >= limit:
            blockers.append(sentences.key_at_limit(job, running, limit, facts.key_running_ids))
        if wait is not None:
            blockers.append(
                sentences.rate_limited(
                    f"key {job.concurrency_key}", rate_limit, rate_per, in_window, wait
                )
            )
    if facts.queue_rate is not None:
        rate_limit, rate_per, in_window, wait = facts.queue_rate
        if wait is not None:
            blockers.append(
                sentences.rate_limited(f"queue {job.queue}", rate_limit, rate_per, in_window, wait)
            )
    return blockers
