"""Runs the statements of ``queries.py`` on a Session it is given; never commits.

The caller owns the transaction: the unit of work (``uow.py``), the worker, or the host
application's own session for transactional enqueue. Methods translate between Python values and
the statements' bind parameters, and report lost leases as the set of ids that matched no row.
"""

from __future__ import annotations

import datetime as dt
import time
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from sqlalchemy import Connection, Engine
from sqlalchemy.orm import Session

from pgqueue import queries, uow, validation
from pgqueue.errors import SerializationError
from pgqueue.jobs import ClaimedJob, NewJob, Outcome
from pgqueue.models import Job
from pgqueue.states import JobState


def _core(session: Session) -> Connection:
    """The session's connection: statements here are Core, so skip ORM statement handling."""
    return session.connection()


def insert_jobs(session: Session, jobs: Sequence[NewJob]) -> list[int]:
    """Insert jobs and their tickets; return ids in input order.

    A job whose unique key is already held by an active job is not inserted; the existing job's
    id is returned in its place (if that job finished meanwhile, the insert is tried again).
    """
    if not jobs:
        return []
    if any(j.depends_on for j in jobs):
        return insert_dependent_jobs(session, jobs)
    with_keys = any(j.unique_key is not None for j in jobs)
    for _ in range(10):
        rows = _core(session).execute(queries.insert_jobs(with_keys), _insert_params(jobs)).all()
        if not with_keys:
            return [row[0] for row in rows]
        resolved = _match_unique(session, jobs, rows)
        if resolved is not None:
            return resolved
    raise RuntimeError("unique-key enqueue did not settle after 10 tries")  # pragma: no cover


def insert_one_job_params(job: NewJob) -> dict[str, Any]:
    """Parameters of ``queries.insert_one_job`` (a job without unique key or dependencies)."""
    return {
        "task_name": job.task_name,
        "queue": job.queue,
        "args": job.args_json,
        "kwargs": job.kwargs_json,
        "priority": job.priority,
        "max_attempts": job.max_attempts,
        "delay": job.delay,
        "run_at": job.run_at,
        "atomic": job.atomic,
    }


def copy_jobs(
    driver: Any,
    allocate: uow.DriverStatement,
    notify: uow.DriverStatement,
    jobs: Sequence[NewJob],
) -> list[int]:
    """Insert a large batch of jobs (no unique keys, no dependencies, one ``delay``/``run_at``
    for all) and their tickets with two ``COPY``s on a psycopg connection, in the caller's
    transaction; return the ids in input order.

    Ids come from the identity sequence first (``queries.allocate_job_ids``, ascending like
    the ``INSERT``'s), with the batch's ``run_at``, so both tables get the same values. The
    wake-up (``queries.notify_tickets``, one per queue) is sent last, delivered at commit.
    """
    first = jobs[0]
    params = allocate.params({"n": len(jobs), "run_at": first.run_at, "delay": first.delay})
    ids, run_at = driver.execute(allocate.sql, params).fetchone()
    # The rows as COPY text, formatted here: psycopg's write_row adapts every value on its own,
    # several times slower than an f-string per row. Text columns are escaped (``_copy_text``);
    # the others are ints, one timestamp and booleans, whose text needs no escaping. Written in
    # chunks, so a huge batch is never held as text all at once.
    stamp = run_at.isoformat()
    text = _copy_text
    names = {name: text(name) for name in {j.task_name for j in jobs} | {j.queue for j in jobs}}
    pairs = list(zip(ids, jobs, strict=True))
    with driver.cursor() as cursor:
        with cursor.copy(queries.copy_jobs()) as copy:
            _write_in_chunks(
                copy,
                (
                    f"{job_id}\t{names[job.task_name]}\t{names[job.queue]}\t"
                    f"{text(job.args_json)}\t{text(job.kwargs_json)}\t{job.priority}\t"
                    f"{job.max_attempts}\t{stamp}\t{'t' if job.atomic else 'f'}\n"
                    for job_id, job in pairs
                ),
            )
        with cursor.copy(queries.copy_tickets()) as copy:
            _write_in_chunks(
                copy,
                (
                    f"{job_id}\t{names[job.queue]}\t{job.priority}\t{stamp}"
                    f"\t{'t' if job.atomic else 'f'}\n"
                    for job_id, job in pairs
                ),
            )
    queues = sorted({job.queue for job in jobs})
    driver.execute(notify.sql, notify.params({"queues": queues, "run_at": run_at}))
    return list(ids)


_COPY_CHUNK = 5000  # rows per write of a COPY


def _write_in_chunks(copy: Any, lines: Iterable[str]) -> None:
    """Send COPY text lines ``_COPY_CHUNK`` at a time: one ``write`` per line costs more
    Python than the line, one for the whole batch holds it all in memory twice."""
    rows: list[str] = []
    for line in lines:
        rows.append(line)
        if len(rows) == _COPY_CHUNK:
            copy.write("".join(rows))
            rows.clear()
    copy.write("".join(rows))


_COPY_ESCAPES: dict[int, str] = {
    ord("\\"): "\\\\",
    ord("\t"): "\\t",
    ord("\n"): "\\n",
    ord("\r"): "\\r",
}


def _copy_text(value: str) -> str:
    """``value`` as a field of COPY's text format: backslash, tab, newline and carriage return
    escaped (``\\N`` in a value thus stays text, never NULL). JSON text from ``validation``
    holds no raw control characters, so usually only a backslash needs it, or nothing."""
    if "\\" in value or "\t" in value or "\n" in value or "\r" in value:
        return value.translate(_COPY_ESCAPES)
    return value


def _insert_params(jobs: Sequence[NewJob]) -> dict[str, list[Any]]:
    return {
        "task_names": [j.task_name for j in jobs],
        "queues": [j.queue for j in jobs],
        "args": [j.args_json for j in jobs],
        "kwargs": [j.kwargs_json for j in jobs],
        "priorities": [j.priority for j in jobs],
        "max_attempts": [j.max_attempts for j in jobs],
        "delays": [j.delay for j in jobs],
        "run_ats": [None if j.run_at is None else j.run_at.isoformat() for j in jobs],
        "unique_keys": [j.unique_key for j in jobs],
        "atomics": [j.atomic for j in jobs],
    }


def _match_unique(
    session: Session, jobs: Sequence[NewJob], rows: Sequence[Any]
) -> list[int] | None:
    """Map inserted rows back to inputs; look up the holders of keys that conflicted."""
    inserted_plain = iter(sorted(row[0] for row in rows if row[1] is None))
    by_key: dict[str, int] = {row[1]: row[0] for row in rows if row[1] is not None}
    missing = [
        j.unique_key for j in jobs if j.unique_key is not None and j.unique_key not in by_key
    ]
    if missing:
        found = (
            _core(session)
            .execute(queries.active_job_ids_by_unique_key(), {"unique_keys": missing})
            .all()
        )
        by_key.update({key: job_id for job_id, key in found if key is not None})
        if any(key not in by_key for key in missing):
            return None  # the holder finished between our insert and lookup: insert again
    return [next(inserted_plain) if j.unique_key is None else by_key[j.unique_key] for j in jobs]


def claim(
    session: Session,
    *,
    worker_id: str,
    limit: int,
    queues: Sequence[str] | None,
    lease_seconds: float,
    task_leases: Mapping[str, float],
    atomic: bool = False,
) -> list[ClaimedJob]:
    """Claim up to ``limit`` ready jobs (see ``queries.claim``)."""
    key = id(session.get_bind())
    stmt, params = _claim_statement(
        key, worker_id, limit, queues, lease_seconds, task_leases, atomic=atomic
    )
    rows = _core(session).execute(stmt, params).all()
    _refresh_limits_seen(key, lambda: any_queue_limit(session))
    return _claimed_jobs(rows)


def claim_held(
    held: uow.HeldConnection,
    *,
    worker_id: str,
    limit: int,
    queues: Sequence[str] | None,
    lease_seconds: float,
    task_leases: Mapping[str, float],
) -> list[ClaimedJob]:
    """``claim`` (leased) on a connection the claimer keeps (``uow.HeldConnection``, autocommit):
    the worker's claim without a Session or a pool checkout per call."""
    key = id(held.engine)
    stmt, params = _claim_statement(
        key, worker_id, limit, queues, lease_seconds, task_leases, atomic=False
    )
    rows = held.rows(stmt, params)
    _refresh_limits_seen(key, lambda: bool(held.rows(queries.any_queue_limit(), {})[0][0]))
    return _claimed_jobs(rows)


def _claimed_jobs(rows: Iterable[Sequence[Any]]) -> list[ClaimedJob]:
    """Rows of ``queries.CLAIMED_COLUMNS`` (positional: SQLAlchemy rows or driver tuples) as
    jobs, each job's arguments decoded on its own. The claim has committed: a row that cannot
    be decoded must not take the others' answer with it, so it becomes a job whose ``problem``
    says why (the executor fails it at once)."""
    load = validation.load_arguments
    jobs = []
    for row in rows:
        job = ClaimedJob(*row)
        try:
            job.args, job.kwargs = load(row[3], row[4])
        except SerializationError as exc:
            job.args, job.kwargs = [], {}
            job.problem = f"job {job.id}'s arguments could not be decoded ({exc})"
        jobs.append(job)
    return jobs


def _refresh_limits_seen(key: int, any_limit: Callable[[], bool]) -> None:
    """Ask ``any_limit()`` whether any queue has a limit when this claimer's answer is missing
    or older than ``LIMITS_CHECK_SECONDS``. After the claim, so the claim itself stays the first
    and only statement of its turn."""
    seen = _limits_seen.get(key)
    if seen is None or time.monotonic() >= seen[0]:
        exists = any_limit()
        _limits_seen[key] = (time.monotonic() + LIMITS_CHECK_SECONDS, exists)


def _claim_statement(
    key: int,
    worker_id: str,
    limit: int,
    queues: Sequence[str] | None,
    lease_seconds: float,
    task_leases: Mapping[str, float],
    *,
    atomic: bool,
) -> tuple[Any, dict[str, Any]]:
    params: dict[str, Any] = {"limit": limit, "worker": worker_id, "lease_seconds": lease_seconds}
    if task_leases:
        params["task_leases"] = dict(task_leases)
    if queues is not None:
        params["queues"] = list(queues)
    seen = _limits_seen.get(key)
    # Until this claimer has looked, assume limits exist: the full variant is always correct.
    limits = True if seen is None else seen[1]
    stmt = queries.claim(
        atomic=atomic,
        filter_queues=queues is not None,
        limits=limits,
        task_leases=bool(task_leases),
    )
    return stmt, params


def claimed_by(
    session: Session, *, worker_id: str, held: Iterable[int], within: float
) -> list[ClaimedJob]:
    """Jobs RUNNING under ``worker_id``, claimed in the last ``within`` seconds, that it does not
    hold (``queries.claimed_by``)."""
    params = {"worker": worker_id, "held": sorted(held), "within": within}
    return _claimed_jobs(_core(session).execute(queries.claimed_by(), params).all())


# How long a claimer trusts its last look at whether any queue has a limit. Only the limited
# queues wait on it (the lean claim skips them): pause and the limits themselves are read by
# every claim statement, so staleness can delay a newly limited queue by this much, never let
# it exceed its limit. Long enough that an idle worker's statement rate barely changes.
LIMITS_CHECK_SECONDS = 5.0
_limits_seen: dict[int, tuple[float, bool]] = {}


def record_outcomes(session: Session, outcomes: Iterable[Outcome]) -> set[int]:
    """Write many outcomes, one statement per kind; return the ids whose lease was lost."""
    connection = _core(session)
    lost, dependents = _record_outcomes(
        lambda stmt, params: connection.execute(stmt, params).all(), outcomes
    )
    if dependents:
        settle_dependents(session, dependents)
    return lost


class _HasDependents(Exception):
    """Ended jobs have dependents to settle: the batch goes the SQLAlchemy way instead."""


def record_outcomes_on_driver(engine: Engine, outcomes: Sequence[Outcome]) -> set[int]:
    """``record_outcomes`` in one transaction on the pooled psycopg connection (statements
    compiled once, see ``uow.driver_statement``): the worker writes thousands of outcomes per
    second, and SQLAlchemy's per-statement execution work cost more CPU than the rows.

    When an ended job has dependents (rare; ``settle_dependents`` renders its SQL per
    execution) the transaction is rolled back and the whole batch is written again through a
    ``Session``. Callers check ``uow.driver_usable`` first.
    """

    def work(driver: Any) -> set[int]:
        def run(stmt: Any, params: dict[str, Any]) -> Sequence[Any]:
            prepared = uow.driver_statement(stmt, engine)
            values = _as_array_literals(prepared.params(params))
            rows: Sequence[Any] = driver.execute(prepared.sql, values).fetchall()
            return rows

        lost, dependents = _record_outcomes(run, outcomes)
        if dependents:
            raise _HasDependents
        return lost

    try:
        return uow.run_on_driver(engine, work, autocommit=False, attempts=1)
    except _HasDependents:
        with Session(engine) as session, session.begin():
            return record_outcomes(session, outcomes)


def _as_array_literals(params: dict[str, Any]) -> dict[str, Any]:
    """``params`` with the outcome statements' usual arrays as PostgreSQL array literals.

    psycopg dumps a list element by element in Python, the largest single cost of an outcome
    batch if left to it; the statements cast every array bind (``::BIGINT[]``, ``::UUID[]``,
    ``::TEXT[]``), so a literal built by ``str.join`` reads the same. Only values of known
    form are converted: job ids (ints), lease tokens (UUIDs, whose ``str`` is canonical) and
    results that are all ``null`` (the common case); anything else stays a list.
    """
    converted = dict(params)
    for name in ("ids", "tokens"):
        items = params.get(name)
        if items is not None:
            converted[name] = "{" + ",".join(map(str, items)) + "}"
    results = params.get("results")
    if results is not None and all(r == "null" for r in results):
        converted["results"] = "{" + ",".join(['"null"'] * len(results)) + "}"
    return converted


def _record_outcomes(
    run: Callable[[Any, dict[str, Any]], Sequence[Any]], outcomes: Iterable[Outcome]
) -> tuple[set[int], set[int]]:
    """The statements of ``record_outcomes`` through ``run(statement, params)``: the ids whose
    lease was lost, and the dependents of the jobs that ended (to settle in the same
    transaction)."""
    by_kind: dict[str, list[Outcome]] = {}
    for outcome in outcomes:
        by_kind.setdefault(outcome.kind, []).append(outcome)
    if len(by_kind) == 1:
        ids = sorted(o.job_id for items in by_kind.values() for o in items)
    else:
        ids = sorted({o.job_id for items in by_kind.values() for o in items})
    if len(ids) > 1:
        # One statement per kind would lock the rows in kind order; in a transaction that can
        # deadlock with a heartbeat of the same jobs. Take them all first, in id order.
        run(queries.lock_jobs(), {"ids": ids})
    lost: set[int] = set()
    dependents: set[int] = set()
    for kind, items in by_kind.items():
        params: dict[str, Any] = {
            "ids": [o.job_id for o in items],
            "tokens": [o.lease_token for o in items],
        }
        if kind == "complete":
            stmt: Any = queries.complete()
            params["results"] = [o.result_json for o in items]
        elif kind == "retry":
            stmt = queries.retry()
            params["delays"] = [o.delay for o in items]
            params["errors"] = [o.error for o in items]
        elif kind == "fail":
            stmt = queries.fail()
            params["errors"] = [o.error for o in items]
        elif kind == "cancelled":
            stmt = queries.mark_cancelled()
            params["errors"] = [o.error for o in items]
        elif kind == "release":
            stmt = queries.release()
        else:  # pragma: no cover - Outcome kinds are produced by pgqueue only
            raise ValueError(f"unknown outcome kind {kind!r}")
        rows = run(stmt, params)
        if kind in ("complete", "fail", "cancelled"):
            for row in rows:
                if row[1]:
                    dependents.update(row[1])
        if len(rows) != len(items):
            done = {row[0] for row in rows}
            lost.update(o.job_id for o in items if o.job_id not in done)
    return lost, dependents


def heartbeat(session: Session, leases: Sequence[tuple[int, uuid.UUID, float]]) -> dict[int, bool]:
    """Extend leases ``(job id, token, seconds)``; return ``{id: cancel_requested}`` for those
    still held (ids missing from the result have lost their lease)."""
    if not leases:
        return {}
    rows = session.execute(
        queries.heartbeat(),
        {
            "ids": [job_id for job_id, _, _ in leases],
            "tokens": [token for _, token, _ in leases],
            "lease_secondss": [seconds for _, _, seconds in leases],
        },
    )
    return {job_id: bool(flag) for job_id, flag in rows}


def expired_lease_exists(session: Session) -> bool:
    return bool(_core(session).execute(queries.expired_lease_exists()).scalar())


def rescue_expired(
    session: Session, *, lock_key: int, limit: int, error: str
) -> list[tuple[int, str]]:
    params = {"lock_key": lock_key, "limit": limit, "error": error}
    rows = _core(session).execute(queries.rescue_expired(), params).all()
    dependents = {d for row in rows if row[1] != JobState.RETRYING.value for d in row[2] or ()}
    if dependents:
        settle_dependents(session, dependents)
    return [(row[0], row[1]) for row in rows]


def prune_finished(
    session: Session, *, succeeded_before: float, failed_before: float, limit: int
) -> int:
    params = {"succeeded_before": succeeded_before, "failed_before": failed_before, "limit": limit}
    return int(_core(session).execute(queries.prune_finished(), params).scalar_one())


def try_maintenance_lock(session: Session, key: int) -> bool:
    return bool(_core(session).execute(queries.try_maintenance_lock(), {"key": key}).scalar_one())


def rerun(session: Session, job_id: int) -> bool:
    return _core(session).execute(queries.rerun(), {"job_id": job_id}).first() is not None


def cancel_waiting(session: Session, job_id: int, reason: str) -> bool:
    row = (
        _core(session)
        .execute(queries.cancel_waiting(), {"job_id": job_id, "reason": reason})
        .first()
    )
    if row is not None and row[1]:
        settle_dependents(session, row[1])
    return row is not None


def request_cancel_running(session: Session, job_id: int) -> bool:
    return (
        _core(session).execute(queries.request_cancel_running(), {"job_id": job_id}).first()
        is not None
    )


def get_job(session: Session, job_id: int) -> Job | None:
    return session.execute(queries.get_job(), {"job_id": job_id}).scalar_one_or_none()


def state_counts(session: Session) -> dict[str, dict[JobState, int]]:
    counts: dict[str, dict[JobState, int]] = {}
    for queue, state, count in _core(session).execute(queries.job_state_counts()):
        counts.setdefault(queue, {})[JobState(state)] = count
    return counts


def ready_ticket_exists(session: Session, queues: Sequence[str] | None) -> bool:
    params = {} if queues is None else {"queues": list(queues)}
    return bool(
        _core(session).execute(queries.ready_ticket_exists(queues is not None), params).scalar()
    )


def active_job_exists(session: Session, queues: Sequence[str] | None) -> bool:
    params = {} if queues is None else {"queues": list(queues)}
    return bool(
        _core(session).execute(queries.active_job_exists(queues is not None), params).scalar()
    )


def next_ticket_run_at(session: Session, queues: Sequence[str] | None) -> dt.datetime | None:
    params = {} if queues is None else {"queues": list(queues)}
    value = _core(session).execute(queries.next_ticket_run_at(queues is not None), params).scalar()
    return value if isinstance(value, dt.datetime) else None


# --- dashboard (pgqueue.contrib.flask.dashboard) ---------------------------------------------


def list_jobs(
    session: Session,
    *,
    queue: str | None = None,
    state: JobState | None = None,
    task_name: str | None = None,
    before: int | None = None,
    after: int | None = None,
    limit: int = 50,
) -> list[Job]:
    """Up to ``limit`` jobs, newest first, matching the filters; ``before``/``after`` (a job id)
    page to older/newer jobs. Returns ORM objects of ``session``."""
    cursor = "before" if before is not None else "after" if after is not None else None
    params: dict[str, Any] = {"limit": limit}
    params["states"] = [s.value for s in JobState] if state is None else [state.value]
    if queue is not None:
        params["queue"] = queue
        params["queues"] = [queue]
    elif state is not None and task_name is None:
        params["queues"] = job_queues(session)
    if task_name is not None:
        params["task_name"] = task_name
    if cursor is not None:
        params["cursor"] = before if before is not None else after
    stmt = queries.list_jobs(
        by_queue=queue is not None,
        by_state=state is not None,
        by_task=task_name is not None,
        cursor=cursor,
    )
    jobs = list(session.scalars(stmt, params))
    return jobs[::-1] if cursor == "after" else jobs


def job_queues(session: Session) -> list[str]:
    """Names of the queues that have jobs, sorted (one index probe per queue)."""
    return list(_core(session).execute(queries.job_queues()).scalars())


def capped_state_counts(session: Session, cap: int) -> dict[str, dict[JobState, int]]:
    """``{queue: {state: count}}`` for every queue with jobs, each count stopping at ``cap``
    (``cap`` means "``cap`` or more"); states without jobs count 0."""
    counts: dict[str, dict[JobState, int]] = {}
    params = {"states": [s.value for s in JobState], "cap": cap}
    for queue, state, count in _core(session).execute(queries.capped_state_counts(), params):
        counts.setdefault(queue, {})[JobState(state)] = int(count)
    return counts


def oldest_waiting(session: Session) -> dict[str, tuple[int, dt.datetime, float]]:
    """``{queue: (job_id, run_at, seconds waiting)}`` for the earliest ticket of each queue."""
    rows = _core(session).execute(queries.oldest_waiting_per_queue())
    return {row[0]: (row[1], row[2], float(row[3])) for row in rows}


def finished_per_minute(session: Session) -> dict[str, dict[JobState, list[int]]]:
    """``{queue: {state: [count per minute]}}`` over the last hour; index 0 is the current
    minute, index 59 an hour ago. Only queues with finished jobs in that hour appear."""
    series: dict[str, dict[JobState, list[int]]] = {}
    for queue, state, minutes_ago, count in _core(session).execute(queries.finished_per_minute()):
        if not 0 <= minutes_ago < 60:
            continue  # the boundary of the hour, by a fraction of a second
        by_state = series.setdefault(queue, {})
        by_state.setdefault(JobState(state), [0] * 60)[minutes_ago] += int(count)
    return series


def delete_job(session: Session, job_id: int) -> bool:
    """Delete a job that is not running (and its ticket); False when nothing was deleted."""
    return _core(session).execute(queries.delete_job(), {"job_id": job_id}).first() is not None


# --- scheduling and job control --------------------------------------------------------------


def insert_dependent_jobs(session: Session, jobs: Sequence[NewJob]) -> list[int]:
    """Insert jobs some of which depend on others (``NewJob.depends_on``).

    The dependencies are locked first (see ``queries.lock_dependencies``) and their states read
    after the lock: a job whose dependencies all SUCCEEDED is queued at once; one with a
    dependency FAILED or CANCELLED is inserted CANCELLED with the reason; the others wait
    (WAITING, no ticket) and are appended to their unfinished dependencies' ``dependents``.
    Unique keys are not combined with dependencies (the waiting job would hold no key).
    """
    from pgqueue.errors import JobNotFound, ValidationError

    if any(j.unique_key is not None and j.depends_on for j in jobs):
        raise ValidationError("a job with depends_on cannot also have a unique_key")
    wanted = sorted({d for j in jobs for d in j.depends_on})
    found = dict(_core(session).execute(queries.lock_dependencies(), {"ids": wanted}).all())
    missing = [d for d in wanted if d not in found]
    if missing:
        raise JobNotFound(f"depends_on names jobs that do not exist: {missing}")
    states: list[str] = []
    depends_ons: list[str | None] = []
    reasons: list[str | None] = []
    for job in jobs:
        dep_states = {d: JobState(found[d]) for d in job.depends_on}
        dead = [d for d, st in dep_states.items() if st in (JobState.FAILED, JobState.CANCELLED)]
        pending = sum(1 for st in dep_states.values() if st is not JobState.SUCCEEDED)
        if dead:
            state = JobState.CANCELLED
            reasons.append(f"dependency {dead[0]} ended {dep_states[dead[0]].value}; not run")
        else:
            state = JobState.WAITING if pending else JobState.QUEUED
            reasons.append(None)
        states.append(state.value)
        depends_ons.append(
            "{" + ",".join(str(d) for d in job.depends_on) + "}" if job.depends_on else None
        )
    params: dict[str, Any] = _insert_params(jobs)
    params.update(states=states, depends_ons=depends_ons, reasons=reasons)
    with_keys = any(j.unique_key is not None for j in jobs)
    rows = (
        _core(session).execute(queries.insert_jobs(with_keys, with_dependencies=True), params).all()
    )
    edges = [
        (dependency, row[0])
        for row in rows
        if row[2] == JobState.WAITING.value
        for dependency in row[3] or ()
        if JobState(found[dependency]) is not JobState.SUCCEEDED
    ]
    if edges:
        _core(session).execute(
            queries.add_dependents(),
            {
                "dependency_ids": [d for d, _ in edges],
                "dependent_ids": [j for _, j in edges],
            },
        )
    if with_keys:
        resolved = _match_unique(session, jobs, rows)
        if resolved is None:  # pragma: no cover - keys are refused above
            raise RuntimeError("unique-key enqueue with dependencies did not settle")
        return resolved
    return [row[0] for row in rows]


def set_queue_control(
    session: Session,
    name: str,
    *,
    paused: bool | None = None,
    concurrency_limit: int | bool | None = False,
) -> None:
    """Upsert a queue's switches; ``concurrency_limit=False`` leaves the limit as it is."""
    params: dict[str, Any] = {"name": name}
    if paused is not None:
        params["paused"] = paused
    set_limit = concurrency_limit is not False
    if set_limit:
        params["concurrency_limit"] = concurrency_limit
    stmt = queries.set_queue_control(paused=paused is not None, limit=set_limit)
    _core(session).execute(stmt, params)


def any_queue_limit(session: Session) -> bool:
    return bool(_core(session).execute(queries.any_queue_limit()).scalar())


def recount_running(session: Session) -> dict[str, int]:
    """Correct drifted ``running`` counters of limited queues (call inside a transaction);
    returns ``{queue: corrected count}``. Queues a claim is using right now are skipped."""
    names = list(_core(session).execute(queries.lock_limited_queues()).scalars())
    if not names:
        return {}
    rows = _core(session).execute(queries.recount_running(), {"names": names})
    return {name: running for name, running in rows}


def queue_controls(session: Session) -> list[Any]:
    """All queue control rows (``QueueControl`` objects of ``session``)."""
    return list(session.scalars(queries.queue_controls()))


def record_tick(session: Session, schedule_name: str, scheduled_at: dt.datetime) -> bool:
    """True when this caller recorded the tick first (and so must enqueue its job)."""
    params = {"tick_name": schedule_name, "tick_at": scheduled_at}
    return _core(session).execute(queries.record_tick(), params).first() is not None


def set_tick_job(
    session: Session, schedule_name: str, scheduled_at: dt.datetime, job_id: int
) -> None:
    params = {"tick_name": schedule_name, "tick_at": scheduled_at, "tick_job": job_id}
    _core(session).execute(queries.set_tick_job(), params)


def last_ticks(session: Session, names: Sequence[str]) -> dict[str, dt.datetime]:
    """Latest recorded tick per schedule name (schedules never ticked are absent)."""
    rows = _core(session).execute(queries.last_ticks(), {"names": list(names)})
    return {name: at for name, at in rows}


def database_now(session: Session) -> dt.datetime:
    value = _core(session).execute(queries.database_now()).scalar_one()
    assert isinstance(value, dt.datetime)
    return value


def settle_dependents(session: Session, job_ids: Iterable[int]) -> dict[int, JobState]:
    """Queue or cancel WAITING jobs whose dependencies ended (``queries.settle_dependents``).

    Runs right after the outcome statement, in its own statement so that it sees dependents
    enqueued while that statement waited (see ``queries`` on the follow-ups)."""
    rows = _core(session).execute(queries.settle_dependents(), {"ids": sorted(set(job_ids))})
    return {row[0]: JobState(row[1]) for row in rows}
