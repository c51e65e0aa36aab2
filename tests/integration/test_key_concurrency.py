"""Per-key concurrency limits: enforced in the claim, fair across keys, exact through every way a
job leaves RUNNING, overridable at run time, explained, and refused on bad input."""

from __future__ import annotations

import threading
import time
from collections import defaultdict
from typing import Any

import pytest
from sqlalchemy import text
from sqlalchemy.orm import Session
from support.flow_checks import waiting_keys
from support.workers import in_thread

from pgqueue import JobState, PgQueue, backoff
from pgqueue.data import claim as claim_data
from pgqueue.data import flow as flow_data
from pgqueue.data import maintenance as maintenance_data
from pgqueue.data import outcomes as outcomes_data
from pgqueue.db import executor_for
from pgqueue.errors import ValidationError
from pgqueue.jobs import Outcome
from pgqueue.testing import states_of, table_counts, wait_for_states
from pgqueue.worker import Worker

CLAIM = {"worker_id": "w", "queues": None, "lease_seconds": 30.0, "task_leases": {}}


class KeyProbe:
    """Handlers running at once, per key; ``peaks`` is the most seen per key."""

    def __init__(self) -> None:
        self.peaks: dict[str, int] = defaultdict(int)
        self._now: dict[str, int] = defaultdict(int)
        self._lock = threading.Lock()

    def run(self, key: str, seconds: float) -> None:
        with self._lock:
            self._now[key] += 1
            self.peaks[key] = max(self.peaks[key], self._now[key])
        try:
            time.sleep(seconds)
        finally:
            with self._lock:
                self._now[key] -= 1


def _noop() -> None: ...


def _claim(pgq: PgQueue, limit: int) -> list[Any]:
    with Session(pgq.engine) as session, session.begin():
        return claim_data.claim(executor_for(session), limit=limit, **CLAIM)


def _key_rows(pgq: PgQueue) -> dict[str, tuple[int | None, int]]:
    with pgq.engine.connect() as c:
        rows = c.execute(text("SELECT key, key_limit, running FROM pgqueue_concurrency_keys"))
        return {row.key: (row.key_limit, row.running) for row in rows}


def test_key_limit_holds_within_one_worker_and_other_keys_run(pgq: PgQueue) -> None:
    probe = KeyProbe()

    @pgq.task(name="sync", concurrency_key=lambda account, **_: f"account:{account}", key_limit=2)
    def sync(account: int, n: int = 0) -> None:
        probe.run(f"account:{account}", 0.1)

    ids = sync.enqueue_many([{"account": n % 3, "n": n} for n in range(18)])
    stats = pgq.run_worker(drain=True, concurrency=12)
    assert stats.succeeded == 18
    assert dict(probe.peaks) == {"account:0": 2, "account:1": 2, "account:2": 2}
    assert set(states_of(pgq, ids).values()) == {JobState.SUCCEEDED}
    assert _key_rows(pgq) == {f"account:{n}": (2, 0) for n in range(3)}


def test_a_claim_skips_a_key_at_its_limit_and_takes_other_keys(pgq: PgQueue) -> None:
    @pgq.task(name="k", concurrency_key=lambda key: key, key_limit=2)
    def keyed(key: str) -> None: ...

    @pgq.task(name="plain")
    def plain() -> None: ...

    busy = keyed.enqueue_many([["busy"]] * 10)
    [lone] = keyed.enqueue_many([["lone"]])
    [free] = plain.enqueue_many([[]])
    first = {job.id for job in _claim(pgq, 8)}
    assert first == {busy[0], busy[1], lone, free}
    assert _claim(pgq, 8) == []  # "busy" is at its limit: its 8 tickets stay
    assert _key_rows(pgq) == {"busy": (2, 2), "lone": (2, 1)}
    with pgq.engine.connect() as c:
        keys = c.execute(
            text(
                "SELECT count(*) FROM pgqueue_message_queue t JOIN pgqueue_jobs j "
                "ON j.id = t.job_id WHERE j.concurrency_key = 'busy' AND t.keyed"
            )
        ).scalar()
    assert keys == 8


def test_counter_falls_back_through_success_failure_retry_cancel_and_rescue(
    pgq: PgQueue,
) -> None:
    calls: dict[str, int] = defaultdict(int)

    @pgq.task(
        name="mixed",
        concurrency_key="shared",
        key_limit=1,
        max_attempts=2,
        retry=backoff.constant(0),
    )
    def mixed(kind: str) -> None:
        calls[kind] += 1
        if kind == "fail" or (kind == "retry" and calls[kind] == 1):
            raise RuntimeError(kind)

    ids = mixed.enqueue_many([["ok"], ["fail"], ["retry"]])
    stats = pgq.run_worker(drain=True, concurrency=4)
    assert stats.succeeded == 2
    assert _key_rows(pgq) == {"shared": (1, 0)}
    states = states_of(pgq, ids)
    assert states == {
        ids[0]: JobState.SUCCEEDED,
        ids[1]: JobState.FAILED,
        ids[2]: JobState.SUCCEEDED,
    }

    # A claim whose worker vanished: the rescue gives the key's slot back.
    [stuck] = mixed.enqueue_many([["ok"]])
    [claimed] = _claim(pgq, 1)
    assert claimed.id == stuck
    assert _key_rows(pgq) == {"shared": (1, 1)}
    with pgq.engine.begin() as c:
        c.execute(text("UPDATE pgqueue_jobs SET lease_expires_at = now() - interval '1 second'"))
    with Session(pgq.engine) as session, session.begin():
        maintenance_data.rescue_expired(executor_for(session), lock_key=1, limit=10, error="lost")
    assert _key_rows(pgq) == {"shared": (1, 0)}
    pgq.run_worker(drain=True, concurrency=1)
    assert states_of(pgq, [stuck]) == {stuck: JobState.SUCCEEDED}
    assert _key_rows(pgq) == {"shared": (1, 0)}


def test_overrides_by_prefix_longest_wins_and_none_removes(pgq: PgQueue) -> None:
    @pgq.task(name="t", concurrency_key=lambda key: key, key_limit=3)
    def keyed(key: str) -> None: ...

    keyed.enqueue_many([["tenant:a"]] * 5 + [["tenant:b"]] * 5 + [["other"]] * 5)
    pgq.set_key_limit("tenant:", 1)
    pgq.set_key_limit("tenant:b", 2)
    taken: dict[str, int] = defaultdict(int)
    keys = waiting_keys(pgq.engine)
    for job in _claim(pgq, 15):
        taken[keys[job.id]] += 1
    assert dict(taken) == {"tenant:a": 1, "tenant:b": 2, "other": 3}
    pgq.set_key_limit("tenant:", None)
    pgq.set_key_limit("tenant:b", None)
    for job in _claim(pgq, 15):
        taken[keys[job.id]] += 1
    assert dict(taken) == {"tenant:a": 3, "tenant:b": 3, "other": 3}
    with pgq.engine.connect() as c:
        assert c.execute(text("SELECT count(*) FROM pgqueue_key_limits")).scalar() == 0


def test_configure_overrides_the_computed_key(pgq: PgQueue) -> None:
    @pgq.task(name="c", concurrency_key=lambda n: f"n:{n}", key_limit=1)
    def keyed(n: int) -> None: ...

    first = keyed.configure(concurrency_key="fixed").enqueue(1)
    second = keyed.enqueue(2)
    with pgq.engine.connect() as c:
        rows = dict(c.execute(text("SELECT id, concurrency_key FROM pgqueue_jobs")).all())
        tickets = dict(
            c.execute(
                text(
                    "SELECT t.job_id, t.keyed AND t.key_hash = "
                    "('x' || substr(md5(j.concurrency_key), 1, 8))::bit(32)::int "
                    "FROM pgqueue_message_queue t JOIN pgqueue_jobs j ON j.id = t.job_id"
                )
            ).all()
        )
    assert rows == {first: "fixed", second: "n:2"}
    assert tickets == {first: True, second: True}


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (
            lambda pgq: pgq.task(name="a", concurrency_key=42)(_noop),
            "concurrency_key must be a string",
        ),
        (lambda pgq: pgq.task(name="b", concurrency_key="")(_noop), "non-empty string"),
        (
            lambda pgq: pgq.task(name="c", concurrency_key="k", key_limit=0)(_noop),
            "key_limit must be a whole number of at least 1",
        ),
        (lambda pgq: pgq.task(name="d", key_limit=2)(_noop), "key_limit needs a concurrency_key"),
        (lambda pgq: pgq.set_key_limit("", 2), "key_or_prefix must be a non-empty string"),
        (lambda pgq: pgq.set_key_limit(7, 2), "key_or_prefix must be a string"),
        (lambda pgq: pgq.set_key_limit("k", 0), "key limit must be a whole number"),
        (lambda pgq: pgq.set_key_limit("k", True), "key limit must be a whole number"),
    ],
)
def test_bad_settings_are_refused_before_any_sql(pgq: PgQueue, make: Any, message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        make(pgq)
    assert _key_rows(pgq) == {}
    with pgq.engine.connect() as c:
        assert c.execute(text("SELECT count(*) FROM pgqueue_key_limits")).scalar() == 0


def test_bad_keys_from_the_key_function_are_refused_and_nothing_is_written(pgq: PgQueue) -> None:
    def broken(n: int) -> str:
        if n == 0:
            raise KeyError("no account")
        if n == 1:
            return None  # type: ignore[return-value]
        return "" if n == 2 else f"ok:{n}"

    @pgq.task(name="broken", concurrency_key=broken, key_limit=1)
    def task(n: int) -> None: ...

    with pytest.raises(ValidationError, match="concurrency_key of task broken raised KeyError"):
        task.enqueue(0)
    with pytest.raises(ValidationError, match="concurrency_key of task broken must be a string"):
        task.enqueue_many([[3], [1]])  # the good first job is not written either
    with pytest.raises(ValidationError, match="must be a non-empty string"):
        task.enqueue(2)
    with pytest.raises(ValidationError, match="concurrency_key must be a string"):
        task.configure(concurrency_key=5)  # type: ignore[arg-type]
    assert table_counts(pgq.engine) == {"pgqueue_jobs": 0, "pgqueue_message_queue": 0}
    assert _key_rows(pgq) == {}


def test_explain_names_the_key_and_the_jobs_filling_it(pgq: PgQueue) -> None:
    @pgq.task(name="e", concurrency_key=lambda key: key, key_limit=2)
    def keyed(key: str) -> None: ...

    ids = keyed.enqueue_many([["account:42"]] * 3)
    running = sorted(job.id for job in _claim(pgq, 3))
    assert running == ids[:2]
    explained = pgq.explain_job(ids[2])
    [blocker] = [b for b in explained.blockers if b.kind == "key_at_limit"]
    assert blocker.message == (
        f"key account:42 at its limit: 2 of 2 running, jobs {running[0]}, {running[1]}"
    )
    assert blocker.data["running_job_ids"] == running


def test_a_first_keyed_job_starts_at_once_on_a_worker_that_saw_no_keys(pgq: PgQueue) -> None:
    """The worker checked for controls at its start (none) and would look again in 5 s; the
    wake-up of the enqueue makes it look at once when its lean claim finds nothing."""
    started: dict[str, float] = {}

    @pgq.task(name="first", concurrency_key="only", key_limit=1)
    def first() -> None:
        started["at"] = time.monotonic()

    @pgq.task(name="warmup")
    def warmup() -> None: ...

    with in_thread(Worker(pgq, concurrency=2)):
        wait_for_states(pgq, [warmup.enqueue()], {JobState.SUCCEEDED}, timeout=30)
        time.sleep(0.3)  # the worker idles: its lean claims find nothing
        enqueued = time.monotonic()
        job = first.enqueue()
        wait_for_states(pgq, [job], {JobState.SUCCEEDED}, timeout=30)
    # Well under the 5 s the worker would wait without the wake-up, with room for a loaded
    # machine's scheduling.
    assert started["at"] - enqueued < 2.5


def test_a_claim_over_a_thousand_keys_stays_fast(pgq: PgQueue) -> None:
    @pgq.task(name="many", concurrency_key=lambda n: f"k:{n % 1000}", key_limit=1)
    def many(n: int) -> None: ...

    many.enqueue_many([[n] for n in range(5000)])
    _claim(pgq, 50)  # warm the plan cache of this connection pool
    timings = []
    for _ in range(5):
        began = time.perf_counter()
        claimed = _claim(pgq, 50)
        timings.append(time.perf_counter() - began)
        assert len(claimed) == 50
    best = min(timings)
    print(f"claim of 50 over 1,000 keys with 5,000 keyed tickets: best {best * 1000:.1f} ms")
    assert best < 0.5


def test_cancel_and_release_give_the_key_back(pgq: PgQueue) -> None:
    @pgq.task(name="cr", concurrency_key="cr", key_limit=2)
    def keyed() -> None: ...

    keyed.enqueue_many([[]] * 3)
    cancelled, released = _claim(pgq, 3)
    assert _key_rows(pgq) == {"cr": (2, 2)}
    outcomes = [Outcome.cancelled(cancelled, "stop"), Outcome.release(released)]
    with Session(pgq.engine) as session, session.begin():
        assert outcomes_data.record_outcomes(executor_for(session), outcomes) == set()
    assert _key_rows(pgq) == {"cr": (2, 0)}
    again = {job.id for job in _claim(pgq, 3)}
    assert released.id in again and len(again) == 2  # the released job and the third one
    assert _key_rows(pgq) == {"cr": (2, 2)}


def test_atomic_keyed_jobs_keep_the_limit_and_the_counter(pgq: PgQueue) -> None:
    probe = KeyProbe()

    @pgq.task(name="atomic_keyed", atomic=True, concurrency_key="ak", key_limit=1)
    def atomic_keyed() -> None:
        probe.run("ak", 0.05)

    ids = atomic_keyed.enqueue_many([[]] * 4)
    stats = pgq.run_worker(drain=True, concurrency=4)
    assert stats.succeeded == 4
    assert probe.peaks["ak"] == 1
    assert set(states_of(pgq, ids).values()) == {JobState.SUCCEEDED}
    assert _key_rows(pgq) == {"ak": (1, 0)}


def test_the_recount_repairs_a_counter_changed_by_hand(pgq: PgQueue) -> None:
    @pgq.task(name="rc", concurrency_key="rc", key_limit=2)
    def keyed() -> None: ...

    keyed.enqueue_many([[]] * 2)
    [running] = _claim(pgq, 1)
    with pgq.engine.begin() as c:
        c.execute(text("UPDATE pgqueue_concurrency_keys SET running = 7"))
    with Session(pgq.engine) as session, session.begin():
        assert flow_data.recount_keys(executor_for(session)) == {"rc": 1}
    assert _key_rows(pgq) == {"rc": (2, 1)}
    assert running.id in states_of(pgq, [running.id])


def test_the_claim_marks_keyed_jobs_and_each_outcome_batch_frees_only_real_keys(
    pgq: PgQueue,
) -> None:
    @pgq.task(name="mk", concurrency_key="mk", key_limit=5)
    def keyed() -> None: ...

    @pgq.task(name="unkeyed")
    def plain() -> None: ...

    keyed.enqueue_many([[]] * 2)
    plain.enqueue_many([[]] * 2)
    claimed = _claim(pgq, 4)
    flags = sorted((job.task_name, job.keyed) for job in claimed)
    assert flags == [("mk", True), ("mk", True), ("unkeyed", False), ("unkeyed", False)]
    assert _key_rows(pgq) == {"mk": (5, 2)}
    by_task = {
        name: [job for job in claimed if job.task_name == name] for name in ("mk", "unkeyed")
    }
    plain_only = [Outcome.complete(job) for job in by_task["unkeyed"]]
    mixed = [Outcome.complete(by_task["mk"][0]), Outcome.fail(by_task["mk"][1], "boom")]
    with Session(pgq.engine) as session, session.begin():
        assert outcomes_data.record_outcomes(executor_for(session), plain_only) == set()
    assert _key_rows(pgq) == {"mk": (5, 2)}
    with Session(pgq.engine) as session, session.begin():
        assert outcomes_data.record_outcomes(executor_for(session), mixed) == set()
    assert _key_rows(pgq) == {"mk": (5, 0)}
