"""Job dependencies: a job runs only after all its dependencies succeeded; a dependency that
fails for good (or is cancelled) cancels its dependents, transitively, with the reason."""

from __future__ import annotations

import threading

import pytest
from sqlalchemy import text
from sqlalchemy.orm import Session

from pgqueue import JobNotFound, JobState, PgQueue, ValidationError
from pgqueue.db import executor_for
from pgqueue.testing import run_until_final, states_of, table_counts


def _ledger(pgq: PgQueue) -> None:
    with pgq.engine.begin() as c:
        c.execute(
            text("CREATE TABLE ledger (name text, event text, seq bigserial, at timestamptz)")
        )


def _events(pgq: PgQueue) -> list[tuple[str, str]]:
    with pgq.engine.connect() as c:
        return [(r.name, r.event) for r in c.execute(text("SELECT * FROM ledger ORDER BY seq"))]


def test_diamond_runs_in_a_valid_order(pgq: PgQueue) -> None:
    _ledger(pgq)

    @pgq.task(name="step")
    def step(name: str) -> str:
        with pgq.engine.begin() as c:
            insert = "INSERT INTO ledger (name, event, at) VALUES (:n, :e, clock_timestamp())"
            c.execute(text(insert), {"n": name, "e": "start"})
            c.execute(text(insert), {"n": name, "e": "end"})
        return name

    a = step.enqueue("A")
    b = step.configure(depends_on=[a]).enqueue("B")
    c = step.configure(depends_on=[a]).enqueue("C")
    d = step.configure(depends_on=[b, c]).enqueue("D")
    assert states_of(pgq, [a, b, c, d]) == {
        a: JobState.QUEUED,
        b: JobState.WAITING,
        c: JobState.WAITING,
        d: JobState.WAITING,
    }
    # Only A has a ticket: waiting jobs are not polled, they are released by outcomes.
    assert table_counts(pgq.engine)["pgqueue_message_queue"] == 1
    final = run_until_final(pgq, [a, b, c, d], concurrency=4)
    assert set(final.values()) == {JobState.SUCCEEDED}
    events = _events(pgq)
    position = {(name, event): i for i, (name, event) in enumerate(events)}
    assert position["A", "end"] < position["B", "start"]
    assert position["A", "end"] < position["C", "start"]
    assert position["B", "end"] < position["D", "start"]
    assert position["C", "end"] < position["D", "start"]
    assert pgq.get_job(d).depends_on == [b, c]


def test_failing_root_cancels_the_whole_diamond_with_reason(pgq: PgQueue) -> None:
    ran: list[str] = []

    @pgq.task(name="maybe_fail", max_attempts=2, retry=lambda attempt: 0.0)
    def maybe_fail(name: str) -> None:
        ran.append(name)
        if name == "A":
            raise RuntimeError("A broke")

    a = maybe_fail.enqueue("A")
    b = maybe_fail.configure(depends_on=[a]).enqueue("B")
    c = maybe_fail.configure(depends_on=[a]).enqueue("C")
    d = maybe_fail.configure(depends_on=[b, c]).enqueue("D")
    final = run_until_final(pgq, [a, b, c, d], concurrency=4)
    assert final == {
        a: JobState.FAILED,
        b: JobState.CANCELLED,
        c: JobState.CANCELLED,
        d: JobState.CANCELLED,
    }
    assert ran == ["A", "A"]  # retried once, then failed for good; nothing else ran
    for job_id in (b, c, d):
        job = pgq.get_job(job_id)
        assert job.last_error == f"dependency {a} ended failed; not run"
        assert job.finished_at is not None
        assert job.attempts == 0
    assert table_counts(pgq.engine)["pgqueue_message_queue"] == 0


def test_cancelling_a_dependency_cancels_dependents(pgq: PgQueue) -> None:
    @pgq.task(name="noop_dep")
    def noop_dep() -> None:
        return None

    a = noop_dep.configure(delay=3600).enqueue()
    b = noop_dep.configure(depends_on=[a]).enqueue()
    assert pgq.cancel_job(a) is JobState.CANCELLED
    assert states_of(pgq, [a, b]) == {a: JobState.CANCELLED, b: JobState.CANCELLED}
    assert pgq.get_job(b).last_error == f"dependency {a} ended cancelled; not run"
    # A waiting job can be cancelled directly too, and that cascades.
    x = noop_dep.configure(delay=3600).enqueue()
    y = noop_dep.configure(depends_on=[x]).enqueue()
    z = noop_dep.configure(depends_on=[y]).enqueue()
    assert pgq.cancel_job(y) is JobState.CANCELLED
    assert states_of(pgq, [x, y, z]) == {
        x: JobState.QUEUED,
        y: JobState.CANCELLED,
        z: JobState.CANCELLED,
    }


def test_dependencies_already_finished_at_enqueue(pgq: PgQueue) -> None:
    @pgq.task(name="quick", max_attempts=1)
    def quick(ok: bool) -> None:
        if not ok:
            raise RuntimeError("no")

    good = quick.enqueue(True)
    bad = quick.enqueue(False)
    run_until_final(pgq, [good, bad])
    after_good = quick.configure(depends_on=[good]).enqueue(True)
    after_bad = quick.configure(depends_on=[good, bad]).enqueue(True)
    assert states_of(pgq, [after_good, after_bad]) == {
        after_good: JobState.QUEUED,
        after_bad: JobState.CANCELLED,
    }
    assert pgq.get_job(after_bad).last_error == f"dependency {bad} ended failed; not run"
    with pytest.raises(JobNotFound):
        quick.configure(depends_on=[999_999]).enqueue(True)
    with pytest.raises(ValidationError):
        quick.configure(depends_on=["1"]).enqueue(True)  # type: ignore[list-item]


def test_dependency_completing_while_dependents_are_enqueued(pgq: PgQueue) -> None:
    """Enqueues racing the dependency's completion: every dependent is released exactly once."""

    @pgq.task(name="parent_task")
    def parent_task() -> None:
        return None

    @pgq.task(name="child_task")
    def child_task(n: int) -> None:
        return None

    parent = parent_task.enqueue()
    children: list[int] = []
    lock = threading.Lock()

    def enqueue_children() -> None:
        for n in range(25):
            job_id = child_task.configure(depends_on=[parent]).enqueue(n)
            with lock:
                children.append(job_id)

    threads = [threading.Thread(target=enqueue_children) for _ in range(4)]
    for thread in threads:
        thread.start()
    stats = pgq.run_worker(drain=True, concurrency=4)
    for thread in threads:
        thread.join(timeout=60)
    final = run_until_final(pgq, [parent, *children])
    assert len(children) == 100
    assert set(final.values()) == {JobState.SUCCEEDED}
    assert stats.succeeded >= 1


def test_parents_ending_in_concurrent_transactions_release_their_shared_dependent(
    pgq: PgQueue,
) -> None:
    """Two parents of one dependent complete in two transactions open at once: each outcome's
    settling must see the other parent's success once that transaction commits, or neither
    releases the dependent and it waits for good (each saw the other still RUNNING)."""
    from pgqueue.data import outcomes as outcomes_data
    from pgqueue.jobs import ClaimRequest, Outcome
    from pgqueue.worker.store import WorkerStore

    @pgq.task(name="parent")
    def parent() -> None: ...

    @pgq.task(name="child")
    def child() -> None: ...

    first, second = parent.enqueue(), parent.enqueue()
    dependent = child.configure(depends_on=[first, second]).enqueue()
    store = WorkerStore(pgq.engine, stopping=threading.Event())
    claimed = {
        job.id: job
        for job in store.claim(
            ClaimRequest(worker_id="w1", limit=2, queues=None, lease_seconds=30.0, task_leases={})
        )
    }
    assert set(claimed) == {first, second}

    def outcome(job_id: int) -> list[Outcome]:
        return [Outcome(job_id, claimed[job_id].lease_token, "complete")]

    with Session(pgq.engine) as held:
        outcomes_data.record_outcomes(executor_for(held), outcome(first))
        other = threading.Thread(
            target=lambda: store.record_outcomes(outcome(second)), name="second-parent"
        )
        other.start()
        other.join(timeout=1.0)
        held.commit()
    other.join(timeout=30)
    assert not other.is_alive()
    assert states_of(pgq, [first, second, dependent]) == {
        first: JobState.SUCCEEDED,
        second: JobState.SUCCEEDED,
        dependent: JobState.QUEUED,
    }
