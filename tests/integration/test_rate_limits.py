"""Rate limits of queues and keys: a sliding window checked in the claim, jobs over the rate
wait without an attempt counted, a worker wakes when the window frees, explain says when, and
bad input is refused before any SQL."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
from sqlalchemy import select, text
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.orm import Session
from sqlalchemy.sql.functions import FunctionElement
from support.flow_checks import most_in_window, waiting_keys

from pgqueue import JobState, PgQueue, Settings
from pgqueue.data import claim as claim_data
from pgqueue.data import outcomes as outcomes_data
from pgqueue.db import Database, executor_for
from pgqueue.errors import ValidationError
from pgqueue.sql import claim as claim_sql
from pgqueue.states import OutcomeKind
from pgqueue.testing import states_of
from pgqueue.worker.execution import Execution
from pgqueue.worker.executor import Executor

CLAIM = {"worker_id": "w", "queues": None, "lease_seconds": 30.0, "task_leases": {}}


def _claim(pgq: PgQueue, limit: int) -> list[Any]:
    with Session(pgq.engine) as session, session.begin():
        return claim_data.claim(executor_for(session), limit=limit, **CLAIM)


@pytest.fixture
def settings() -> Settings:
    """A poll interval far longer than the windows: a worker that waited for its poll instead
    of the window would take seconds per window."""
    return Settings(poll_interval=5.0, rescue_interval=0.5, lease_seconds=10.0)


def test_jobs_over_the_rate_wait_without_an_attempt(pgq: PgQueue) -> None:
    @pgq.task(name="r", queue="rated")
    def rated(n: int) -> None: ...

    pgq.set_rate_limit("rated", 5, per=60)
    rated.enqueue_many([[n] for n in range(20)])
    assert len(_claim(pgq, 20)) == 5  # the window holds five starts
    assert _claim(pgq, 20) == []
    with pgq.engine.connect() as c:
        waiting = c.execute(
            text("SELECT count(*) FROM pgqueue_jobs WHERE attempts = 0 AND state = 'queued'")
        ).scalar()
    assert waiting == 15


def test_queue_rate_holds_in_every_window_and_workers_wake_when_it_frees(pgq: PgQueue) -> None:
    starts: list[float] = []
    lock = threading.Lock()

    @pgq.task(name="r", queue="rated")
    def rated(n: int) -> None:
        with lock:
            starts.append(time.monotonic())

    pgq.set_rate_limit("rated", 5, per=0.5)
    ids = rated.enqueue_many([[n] for n in range(20)])
    began = time.monotonic()
    stats = pgq.run_worker(drain=True, concurrency=8, poll_interval=30.0)
    elapsed = time.monotonic() - began
    assert stats.succeeded == 20
    assert set(states_of(pgq, ids).values()) == {JobState.SUCCEEDED}
    assert most_in_window(starts, 0.5) <= 5
    # Four windows of 0.55 s (with the margin) for 20 jobs: not less, and no poll interval
    # (30 s) waited in between: the worker sleeps until the window has room. The upper bound
    # leaves room for a loaded machine; one poll waited would pass it.
    assert 1.6 <= elapsed < 15.0, elapsed


def test_key_rate_limits_each_key_alone(pgq: PgQueue) -> None:
    @pgq.task(name="k", concurrency_key=lambda key: key)
    def keyed(key: str) -> None: ...

    keyed.enqueue_many([["api:a"]] * 6 + [["api:b"]] * 6 + [["other"]] * 6)
    pgq.set_rate_limit(key="api:", limit=2, per=60)
    keys = waiting_keys(pgq.engine)
    taken = sorted(keys[job.id] for job in _claim(pgq, 18))
    assert taken == ["api:a"] * 2 + ["api:b"] * 2 + ["other"] * 6
    assert _claim(pgq, 18) == []
    pgq.set_rate_limit(key="api:", limit=None)
    assert len(_claim(pgq, 18)) == 8


def test_the_claim_gives_each_rate_limited_job_its_margin(pgq: PgQueue) -> None:
    @pgq.task(name="r", queue="rated")
    def rated() -> None: ...

    @pgq.task(name="k", concurrency_key=lambda key: key)
    def keyed(key: str) -> None: ...

    @pgq.task(name="p")
    def plain() -> None: ...

    pgq.set_rate_limit("rated", 10, per=0.5)
    pgq.set_rate_limit(key="api:", limit=10, per=60)
    rated.enqueue_many([[]])
    keyed.enqueue_many([["api:a"], ["other"]])
    plain.enqueue_many([[]])
    keys = waiting_keys(pgq.engine)
    sent = time.monotonic()
    claimed = _claim(pgq, 10)
    took = time.monotonic() - sent
    margins = {keys.get(job.id) or job.task_name: job.start_within for job in claimed}
    assert margins.keys() == {"r", "api:a", "other", "p"}
    # Null where no rate applies.
    assert margins["other"] is None and margins["p"] is None
    # A tenth of the window, at most 0.1 s, after the stamp, plus the stamp's delay after the
    # statement began: no delay is negative, and none outlasts the claim's round trip (a loaded
    # host delays the stamp by tens of milliseconds).
    rated_margin, keyed_margin = margins["r"], margins["api:a"]
    assert rated_margin is not None and keyed_margin is not None
    assert 0.05 <= rated_margin <= 0.05 + took, (rated_margin, took)
    assert 0.1 <= keyed_margin <= 0.1 + took, (keyed_margin, took)
    # Both rows were stamped by the same statement, so their delays differ by far less than the
    # margins do.
    assert keyed_margin - rated_margin == pytest.approx(0.05, abs=0.02)


def test_a_rate_limited_job_not_started_within_its_margin_goes_back_unstarted(
    pgq: PgQueue,
) -> None:
    ran: list[int] = []

    @pgq.task(name="r", queue="rated")
    def rated(n: int) -> None:
        ran.append(n)

    pgq.set_rate_limit("rated", 10, per=1)
    [late_id, on_time_id] = rated.enqueue_many([[1], [2]])
    late, on_time = sorted(_claim(pgq, 2), key=lambda job: job.id)
    executor = Executor(pgq.registry, pgq.settings, lambda: Session(pgq.engine), lambda: None)  # type: ignore[arg-type,return-value]
    now = time.monotonic()
    given_back = executor.run_leased(Execution(late, 30.0, None, now, start_by=now - 0.001))
    started = executor.run_leased(Execution(on_time, 30.0, None, now, start_by=now + 60))
    assert (given_back.kind, started.kind) == (OutcomeKind.RELEASE, OutcomeKind.COMPLETE)
    assert ran == [2]
    with Session(pgq.engine) as session, session.begin():
        assert outcomes_data.record_outcomes(executor_for(session), [given_back, started]) == set()
    with pgq.engine.connect() as c:
        rows = dict(
            c.execute(
                text("SELECT id, state || ' ' || attempts FROM pgqueue_jobs ORDER BY id")
            ).all()
        )
    assert rows == {late_id: "queued 0", on_time_id: "succeeded 1"}
    assert _claim(pgq, 2) != []  # its ticket is back (the window still has room)


def test_a_window_that_freed_after_the_claim_looked_sends_the_claimer_back_at_once(
    pgq: PgQueue,
) -> None:
    # Four claimers wake when a window frees; one takes the room and the others, having
    # waited for the queue's row, find the window full again. When a start leaves the window
    # between such a claim and the claimer's question, waiting a poll interval would idle
    # that claimer for the rest of the window.
    @pgq.task(name="r", queue="rated")
    def rated() -> None: ...

    pgq.set_rate_limit("rated", 2, per=0.3)
    rated.enqueue_many([[], [], []])
    before_claim = time.monotonic()
    assert len(_claim(pgq, 3)) == 2  # the window (0.33 s with its margin) is full
    with pgq.engine.connect() as c:

        def wait(looked_ago: float) -> float | None:
            seconds = c.execute(claim_sql.rate_wait(), {"looked_ago": looked_ago}).scalar()
            return None if seconds is None else float(seconds)

        first = wait(0.0)
        since_claim = time.monotonic() - before_claim
        # The window's rest: 0.33 s less the time since the claim (small, unless the machine
        # is loaded).
        assert first is not None and 0.33 - since_claim - 0.02 <= first <= 0.35
        time.sleep(0.4)
        assert wait(1.0) == 0  # full when the claim looked, free now: claim again
        assert wait(0.01) is None  # free when the claim looked: not why it came back short


class _SlowToCompile(FunctionElement[Any]):
    """``clock_timestamp()``, compiled in no less than a third of a second (a claim statement's
    first compile on a loaded host)."""

    inherit_cache = True


@compiles(_SlowToCompile)
def _compile_slowly(element: Any, compiler: Any, **kw: Any) -> str:
    time.sleep(0.3)
    return "clock_timestamp()"


def test_the_sent_time_of_a_claim_is_read_after_its_statement_is_compiled(pgq: PgQueue) -> None:
    # A rate-limited job's start-by time counts from this reading: one taken before a slow
    # first compile would spend the job's margin before the statement ever reached the server.
    database = Database(pgq.engine)
    held = database.held_connection()
    try:
        for run in (
            lambda: database.run(
                lambda ex: ex.timed_rows(select(_SlowToCompile())), autocommit=False
            ),
            lambda: held.timed_rows(select(_SlowToCompile())),
        ):
            before = time.monotonic()
            rows, sent = run()
            assert len(rows) == 1
            assert sent - before >= 0.3
    finally:
        held.close()


def test_explain_says_when_the_window_frees(pgq: PgQueue) -> None:
    @pgq.task(name="e", queue="partner_api")
    def call() -> None: ...

    pgq.set_rate_limit("partner_api", 2, per=30)
    ids = call.enqueue_many([[]] * 3)
    assert len(_claim(pgq, 3)) == 2
    explained = pgq.explain_job(ids[2])
    [blocker] = [b for b in explained.blockers if b.kind == "rate_limited"]
    assert blocker.message.startswith(
        "queue partner_api is at its rate limit: 2 of 2 started in the last 30.0 s; "
        "the window has room again in "
    )
    assert 29.0 < blocker.data["seconds"] <= 33.0
    pgq.set_rate_limit("partner_api", None)
    assert "rate_limited" not in pgq.explain_job(ids[2]).kinds
    assert len(_claim(pgq, 3)) == 1


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda pgq: pgq.set_rate_limit("q", 0, per=1), "rate limit must be a whole number"),
        (lambda pgq: pgq.set_rate_limit("q", 5, per=0), "per must be a positive number"),
        (lambda pgq: pgq.set_rate_limit("q", 5, per=-1.0), "per must be a positive number"),
        (lambda pgq: pgq.set_rate_limit("q", 5, per="1"), "per must be a positive number"),
        (lambda pgq: pgq.set_rate_limit("q", 5), "a rate limit needs per="),
        (lambda pgq: pgq.set_rate_limit(limit=5, per=1), "either a queue or key="),
        (lambda pgq: pgq.set_rate_limit("q", 5, per=1, key="k"), "either a queue or key="),
        (lambda pgq: pgq.set_rate_limit(key="", limit=5, per=1), "key must be a non-empty"),
        (lambda pgq: pgq.set_rate_limit(key=3, limit=5, per=1), "key must be a string"),
        (lambda pgq: pgq.set_rate_limit("bad queue!", 5, per=1), "queue name"),
    ],
)
def test_bad_rate_limits_are_refused_before_any_sql(pgq: PgQueue, call: Any, message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        call(pgq)
    with pgq.engine.connect() as c:
        assert c.execute(text("SELECT count(*) FROM pgqueue_queues")).scalar() == 0
        assert c.execute(text("SELECT count(*) FROM pgqueue_key_limits")).scalar() == 0
