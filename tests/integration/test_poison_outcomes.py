"""One job's bad outcome or bad row never costs the other jobs anything.

- An error text PostgreSQL cannot store (a NUL byte, a lone surrogate) is escaped, and a retry
  delay too large for an interval is refused where it is made (``Retry(delay=...)``), so the
  batched outcome statement of the other jobs goes through: they succeed on their first attempt,
  and the two bad jobs carry clear recorded errors. An atomic task doing the same counts every
  attempt and ends FAILED after ``max_attempts``.
- When a batch is refused all the same (here: a host's CHECK constraint on ``pgqueue_jobs``),
  its outcomes are written one by one; only the refused one is replaced by a failed attempt
  whose recorded error says why. For an atomic task the handler's writes roll back with it.
- A row whose arguments Python cannot decode (JSON nested far deeper than the recursion limit,
  written by another client) fails alone, at once, with the decoding error recorded; the jobs
  claimed in the same statement run at once.
"""

from __future__ import annotations

import threading
from typing import Any

import pytest
from sqlalchemy import Engine, text
from support.json_rows import nest_args

from pgqueue import JobContext, JobState, PgQueue, Retry, backoff
from pgqueue.testing import run_until_final

NUL_ERROR = "bad\x00byte"
SURROGATE_ERROR = "lone \udc80 surrogate"


@pytest.mark.slow
@pytest.mark.parametrize("bad_text", [NUL_ERROR, SURROGATE_ERROR], ids=["nul", "surrogate"])
def test_unstorable_error_and_huge_retry_delay_spoil_nothing_in_their_batch(
    pgq: PgQueue, bad_text: str
) -> None:
    jobs = 200
    together = threading.Barrier(jobs, timeout=30)
    retried: set[int] = set()

    @pgq.task(name="poison.leased", max_attempts=2, retry=backoff.constant(0))
    def leased(n: int) -> int:
        # Every first attempt returns at about the same moment: the outcomes share batches.
        if n not in retried:
            retried.add(n)
            together.wait()
        if n == 17:
            raise ValueError(bad_text)
        if n == 42:
            raise Retry(delay=1e300)
        return n

    ids = leased.enqueue_many([{"n": n} for n in range(jobs)])
    # One claim takes all 200 (a slot each). A good job whose outcome was dropped would be
    # rescued when its lease expired and run again: a second attempt, an error recorded.
    states = run_until_final(pgq, ids, concurrency=jobs, timeout=60)
    good = [job_id for n, job_id in enumerate(ids) if n not in (17, 42)]
    assert {states[i] for i in good} == {JobState.SUCCEEDED}
    assert {(pgq.get_job(i).attempts, len(pgq.get_job(i).errors)) for i in good} == {(1, 0)}
    assert all(pgq.get_job(i).result == n for n, i in enumerate(ids) if i in good)

    nul_job, delay_job = pgq.get_job(ids[17]), pgq.get_job(ids[42])
    for job in (nul_job, delay_job):
        assert (job.state, job.attempts) == (JobState.FAILED, 2)
        assert [entry["attempt"] for entry in job.errors] == [1, 2]
        assert job.last_error == job.errors[-1]["error"]
    escaped = bad_text.encode("utf-8", "backslashreplace").decode().replace("\x00", "\\x00")
    assert all(f"ValueError: {escaped}" in entry["error"] for entry in nul_job.errors)
    assert all(
        "delay must be at most 315360000 seconds (3650 days), got 1e+300" in entry["error"]
        for entry in delay_job.errors
    )


def test_atomic_task_with_unstorable_error_or_huge_delay_counts_each_attempt(
    pgq: PgQueue,
) -> None:
    runs: dict[int, int] = {}

    @pgq.task(name="poison.atomic", atomic=True, max_attempts=3, retry=backoff.constant(0))
    def atomic(n: int) -> None:
        runs[n] = runs.get(n, 0) + 1
        if n == 1:
            raise ValueError(NUL_ERROR + SURROGATE_ERROR)
        if n == 2:
            raise Retry(delay=1e300)

    ids = [atomic.enqueue(n) for n in range(4)]
    states = run_until_final(pgq, ids, concurrency=2, timeout=30)
    assert states == {
        ids[0]: JobState.SUCCEEDED,
        ids[1]: JobState.FAILED,
        ids[2]: JobState.FAILED,
        ids[3]: JobState.SUCCEEDED,
    }
    assert runs == {0: 1, 1: 3, 2: 3, 3: 1}
    for job_id in ids[1:3]:
        job = pgq.get_job(job_id)
        assert job.attempts == 3
        assert [entry["attempt"] for entry in job.errors] == [1, 2, 3]
    assert "ValueError: bad\\x00bytelone \\udc80 surrogate" in pgq.get_job(ids[1]).last_error
    assert "delay must be at most" in pgq.get_job(ids[2]).last_error


def test_results_with_nul_or_a_lone_surrogate_spoil_nothing_either(pgq: PgQueue) -> None:
    @pgq.task(name="poison.result", max_attempts=3)
    def result(kind: str) -> Any:
        return {"nul": "a\x00b", "surrogate": "a\udc80b", "key": {"k\ud800": 1}}.get(kind, kind)

    kinds = ["ok", "nul", "surrogate", "key", "ok2"]
    ids = [result.enqueue(kind) for kind in kinds]
    states = run_until_final(pgq, ids, concurrency=len(ids))
    jobs = {kind: pgq.get_job(job_id) for kind, job_id in zip(kinds, ids, strict=True)}
    # JSON holds a NUL as \u0000, and the ``json`` column keeps that text as it is.
    assert [(jobs[k].state, jobs[k].attempts, jobs[k].result) for k in ("ok", "nul", "ok2")] == [
        (JobState.SUCCEEDED, 1, "ok"),
        (JobState.SUCCEEDED, 1, "a\x00b"),
        (JobState.SUCCEEDED, 1, "ok2"),
    ]
    for kind in ("surrogate", "key"):
        job = jobs[kind]
        # A result that cannot be stored fails at once: running again returns it again.
        assert (states[job.id], job.attempts) == (JobState.FAILED, 1)
        assert job.last_error is not None
        assert job.last_error.startswith("result could not be stored: result")
        assert "contains a lone surrogate and is not valid Unicode" in job.last_error


def _refuse_success_of_refused_tasks(engine: Engine) -> None:
    """A host's own rule on pgqueue's table that refuses the success of the ``poison.refused*``
    tasks: a database error no escaping or validation in pgqueue can foresee."""
    with engine.begin() as connection:
        connection.execute(
            text(
                "ALTER TABLE pgqueue_jobs ADD CONSTRAINT host_refuses_one_task "
                "CHECK (NOT (task_name LIKE 'poison.refused%' AND state = 'succeeded'))"
            )
        )


def test_a_batch_refused_by_the_database_is_written_one_by_one(
    pgq: PgQueue, engine: Engine
) -> None:
    jobs = 60
    together = threading.Barrier(jobs, timeout=30)

    @pgq.task(name="poison.fine")
    def fine(n: int) -> int:
        together.wait()
        return n

    @pgq.task(name="poison.refused", pass_context=True, max_attempts=2, retry=backoff.constant(0))
    def refused(ctx: JobContext) -> str:
        if ctx.attempt == 1:
            together.wait()
        return "ran"

    _refuse_success_of_refused_tasks(engine)
    ids = fine.enqueue_many([{"n": n} for n in range(jobs - 1)])
    bad = refused.enqueue()
    states = run_until_final(pgq, [*ids, bad], concurrency=jobs, timeout=60)
    assert {states[i] for i in ids} == {JobState.SUCCEEDED}
    assert {pgq.get_job(i).attempts for i in ids} == {1}
    job = pgq.get_job(bad)
    assert (job.state, job.attempts) == (JobState.FAILED, 2)
    assert len(job.errors) == 2
    for entry in job.errors:
        assert entry["error"].startswith("OutcomeNotRecorded: this attempt's 'complete' outcome")
        assert "host_refuses_one_task" in entry["error"]


def test_an_atomic_outcome_refused_by_the_database_rolls_back_the_handler_and_counts(
    pgq: PgQueue, engine: Engine
) -> None:
    with engine.begin() as connection:
        connection.execute(text("CREATE TABLE effects (job_id BIGINT, attempt INT)"))
    _refuse_success_of_refused_tasks(engine)

    @pgq.task(
        name="poison.refused_atomic",
        atomic=True,
        pass_context=True,
        max_attempts=3,
        retry=backoff.constant(0),
    )
    def refused_atomic(ctx: JobContext) -> None:
        ctx.session.execute(
            text("INSERT INTO effects VALUES (:job, :attempt)"),
            {"job": ctx.job_id, "attempt": ctx.attempt},
        )

    job_id = refused_atomic.enqueue()
    assert run_until_final(pgq, [job_id], timeout=30) == {job_id: JobState.FAILED}
    job = pgq.get_job(job_id)
    assert job.attempts == 3
    assert [entry["attempt"] for entry in job.errors] == [1, 2, 3]
    assert "OutcomeNotRecorded" in job.last_error
    with engine.connect() as connection:
        assert connection.execute(text("SELECT count(*) FROM effects")).scalar() == 0


@pytest.mark.parametrize("depth", [10_000, 100_000])
@pytest.mark.parametrize("atomic", [False, True], ids=["leased", "atomic"])
def test_arguments_python_cannot_decode_fail_alone_at_once(
    pgq: PgQueue, engine: Engine, depth: int, atomic: bool
) -> None:
    ran: list[Any] = []

    @pgq.task(name="poison.decode", atomic=atomic, max_attempts=5)
    def decode(x: Any) -> None:
        ran.append(x)

    ids = [decode.enqueue(n) for n in range(51)]
    bad = ids[25]
    nest_args(engine, bad, depth)
    states = run_until_final(pgq, ids, concurrency=60, timeout=60)
    assert states == {i: JobState.FAILED if i == bad else JobState.SUCCEEDED for i in ids}
    assert sorted(ran) == [n for n in range(51) if n != 25]
    # At once: none waited for its lease to expire (that would show as a second attempt and
    # a "lease expired" error).
    good = [pgq.get_job(i) for i in ids if i != bad]
    assert {(job.attempts, len(job.errors)) for job in good} == {(1, 0)}
    with engine.connect() as connection:
        attempts, last_error, entries = connection.execute(
            text(
                "SELECT attempts, last_error, jsonb_array_length(errors) FROM pgqueue_jobs "
                "WHERE id = :id"
            ),
            {"id": bad},
        ).one()
    assert (attempts, entries) == (1, 1)
    assert last_error == (
        f"ValidationError: job {bad}'s arguments could not be decoded (RecursionError: "
        "maximum recursion depth exceeded while decoding a JSON array from a unicode string)"
    )


@pytest.mark.parametrize(
    "poison",
    [{1, 2}, float("nan"), object(), "x" * 1_000_001],
    ids=["set", "nan", "object", "oversized"],
)
def test_an_atomic_result_that_cannot_be_stored_rolls_back_the_handler(
    pgq: PgQueue, engine: Engine, poison: Any
) -> None:
    with engine.begin() as connection:
        connection.execute(text("CREATE TABLE effects (job_id BIGINT, attempt INT)"))

    @pgq.task(name="poison.atomic_result", atomic=True, pass_context=True, max_attempts=2)
    def atomic_result(ctx: JobContext) -> Any:
        ctx.session.execute(
            text("INSERT INTO effects VALUES (:job, :attempt)"),
            {"job": ctx.job_id, "attempt": ctx.attempt},
        )
        return poison

    job_id = atomic_result.enqueue()
    assert run_until_final(pgq, [job_id], timeout=30) == {job_id: JobState.FAILED}
    assert "result could not be stored" in pgq.get_job(job_id).last_error
    with engine.connect() as connection:
        assert connection.execute(text("SELECT count(*) FROM effects")).scalar() == 0
