"""Unique jobs: one active job per key, race-free under concurrent enqueues; reusable after."""

from __future__ import annotations

import threading
from typing import Any

import pytest
from sqlalchemy import URL, create_engine, func, select, text
from support.workers import in_thread

from pgqueue import Job, JobState, PgQueue
from pgqueue.data import enqueue as enqueue_data
from pgqueue.testing import run_until_final, states_of, wait_for_states
from pgqueue.worker import Worker


def _enqueue_concurrently(count: int, enqueue: object) -> list[int]:
    barrier = threading.Barrier(count)
    results: list[int] = []
    errors: list[BaseException] = []
    lock = threading.Lock()

    def one() -> None:
        try:
            barrier.wait(timeout=30)
            job_id = enqueue()  # type: ignore[operator]
            with lock:
                results.append(job_id)
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=one) for _ in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert errors == []
    return results


def _jobs_with_key(pgq: PgQueue, key: str) -> int:
    with pgq.sessions() as session:
        return session.scalar(select(func.count()).select_from(Job).where(Job.unique_key == key))


def test_fifty_threads_same_key_one_job_same_id(pgq: PgQueue) -> None:
    @pgq.task(name="invoice")
    def invoice(n: int) -> int:
        return n

    ids = _enqueue_concurrently(50, lambda: invoice.configure(unique_key="invoice-42").enqueue(1))
    assert len(ids) == 50
    assert len(set(ids)) == 1
    assert _jobs_with_key(pgq, "invoice-42") == 1
    (job_id,) = set(ids)
    assert run_until_final(pgq, [job_id]) == {job_id: JobState.SUCCEEDED}
    # Finished: the key is free again and a new job gets a new id.
    again = invoice.configure(unique_key="invoice-42").enqueue(2)
    assert again != job_id
    assert _jobs_with_key(pgq, "invoice-42") == 2
    assert states_of(pgq, [again]) == {again: JobState.QUEUED}


def test_task_level_key_function_races_too(pgq: PgQueue) -> None:
    @pgq.task(name="sync_customer", unique_key=lambda customer: f"customer-{customer}")
    def sync_customer(customer: int) -> None:
        return None

    ids = _enqueue_concurrently(50, lambda: sync_customer.enqueue(7))
    assert len(set(ids)) == 1
    other = sync_customer.enqueue(8)
    assert other not in ids
    # An explicit key overrides the function's.
    explicit = sync_customer.configure(unique_key="customer-7").enqueue(9)
    assert explicit == ids[0]


def test_key_held_while_running_and_retrying(pgq: PgQueue) -> None:
    attempts: list[int] = []
    gate = threading.Event()

    @pgq.task(name="flaky", max_attempts=2, retry=lambda attempt: 0.0)
    def flaky() -> None:
        attempts.append(1)
        gate.wait(10)
        if len(attempts) == 1:
            raise RuntimeError("first attempt fails")

    first = flaky.configure(unique_key="k").enqueue()
    worker = Worker(pgq, concurrency=1)
    with in_thread(worker):
        wait_for_states(pgq, [first], {JobState.RUNNING}, timeout=30)
        assert flaky.configure(unique_key="k").enqueue() == first
        gate.set()
        wait_for_states(pgq, [first], {JobState.SUCCEEDED}, timeout=30)
    assert len(attempts) == 2
    assert flaky.configure(unique_key="k").enqueue() != first


def test_batch_with_duplicate_keys_in_one_call(pgq: PgQueue) -> None:
    @pgq.task(name="batch_task")
    def batch_task(n: int) -> None:
        return None

    with pgq.sessions() as session, session.begin():
        a = batch_task.configure(session=session, unique_key="x").enqueue(1)
        b = batch_task.configure(session=session, unique_key="x").enqueue(2)
        c = batch_task.configure(session=session, unique_key="y").enqueue(3)
    assert a == b
    assert c != a
    assert _jobs_with_key(pgq, "x") == 1


def test_unique_enqueue_survives_generic_plans(database_url: URL) -> None:
    """A driver that prepares statements, on a server that plans them generically, still infers
    the partial unique index: its predicate must not depend on bound values."""
    admin = create_engine(database_url, isolation_level="AUTOCOMMIT")
    with admin.connect() as connection:
        name = connection.exec_driver_sql("SELECT current_database()").scalar_one()
        connection.execute(
            text(f'ALTER DATABASE "{name}" SET plan_cache_mode = force_generic_plan')
        )
    admin.dispose()
    pgq = PgQueue(database_url.render_as_string(hide_password=False))
    try:

        @pgq.task(name="invoice")
        def invoice(n: int) -> int:
            return n

        # psycopg prepares a statement from its sixth run on one connection.
        ids = {invoice.configure(unique_key="invoice-7").enqueue(n) for n in range(12)}
        assert len(ids) == 1
        assert _jobs_with_key(pgq, "invoice-7") == 1
    finally:
        pgq.dispose()


def test_a_holder_ending_between_insert_and_lookup_reinserts_only_that_job(
    pgq: PgQueue, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A batch of unkeyed jobs and one keyed job whose key is held: the holder ends (another
    transaction) after the batch's insert skipped the keyed job and before its holder is looked
    up. The keyed job alone is inserted again; each unkeyed job goes in once."""

    @pgq.task(name="mixed", unique_key=lambda n: "the-key" if n == 1 else None)
    def mixed(n: int) -> None:
        pass

    holder = mixed.enqueue(1)
    real_holders = enqueue_data.unique_key_holders
    ended: list[int] = []

    def holder_ends_first(ex: Any, keys: Any) -> Any:
        if not ended:
            with pgq.engine.begin() as connection:
                connection.execute(
                    text(
                        "UPDATE pgqueue_jobs SET state = 'cancelled', finished_at = now()"
                        " WHERE id = :id"
                    ),
                    {"id": holder},
                )
            ended.append(holder)
        return real_holders(ex, keys)

    monkeypatch.setattr(enqueue_data, "unique_key_holders", holder_ends_first)
    ids = mixed.enqueue_many([[0], [1], [2]])
    assert ended == [holder]
    with pgq.engine.connect() as connection:
        args = (
            connection.execute(
                text("SELECT args::text FROM pgqueue_jobs WHERE id <> :holder ORDER BY id"),
                {"holder": holder},
            )
            .scalars()
            .all()
        )
    assert sorted(args) == ["[0]", "[1]", "[2]"]  # no unkeyed job twice
    assert len(set(ids)) == 3 and holder not in ids
    assert [pgq.get_job(job_id).state for job_id in ids] == [JobState.QUEUED] * 3


def test_a_retry_that_would_give_a_key_two_holders_is_refused(pgq: PgQueue) -> None:
    from pgqueue.errors import InvalidStateTransition, UniqueKeyHeld
    from pgqueue.job_filter import JobFilter

    @pgq.task(name="refund", max_attempts=1)
    def refund(n: int) -> None:
        if n == 1:
            raise ValueError("declined")

    first = refund.configure(unique_key="refund-7").enqueue(1)
    run_until_final(pgq, [first])
    holder = refund.configure(unique_key="refund-7").enqueue(2)
    assert holder != first

    with pytest.raises(UniqueKeyHeld) as refused:
        pgq.admin.retry_job(first)
    assert str(refused.value) == (
        f"cannot retry job {first}: its unique_key 'refund-7' is held by job {holder}, "
        "which has not ended; retry it once that job has ended"
    )
    assert (refused.value.key, refused.value.job_id) == ("refund-7", holder)
    with pytest.raises(InvalidStateTransition, match="retry changed nothing: a matched job"):
        pgq.admin.bulk_retry(JobFilter(task_name="refund"), actor="test")
    assert states_of(pgq, [first, holder]) == {first: JobState.FAILED, holder: JobState.QUEUED}

    # Once the holder has ended, the key is free for the retried job.
    run_until_final(pgq, [holder])
    pgq.admin.retry_job(first)
    assert states_of(pgq, [first]) == {first: JobState.QUEUED}


def test_a_holder_committed_during_the_retry_is_named_and_the_callers_session_survives(
    pgq: PgQueue,
) -> None:
    from sqlalchemy.orm import Session

    from pgqueue.errors import UniqueKeyHeld

    @pgq.task(name="refund_late", max_attempts=1)
    def refund_late(n: int) -> None:
        raise ValueError("declined")

    failed = refund_late.configure(unique_key="refund-8").enqueue(1)
    run_until_final(pgq, [failed])
    # Another transaction takes the key without committing: the retry's look for a holder
    # cannot see it, and its update waits on the unique index until that transaction commits.
    other = pgq.engine.connect()
    holder = other.execute(
        text(
            "INSERT INTO pgqueue_jobs (task_name, unique_key) VALUES ('refund_late', 'refund-8')"
            " RETURNING id"
        )
    ).scalar_one()
    committer = threading.Timer(1.0, other.commit)
    committer.start()
    try:
        with Session(pgq.engine) as session:
            with pytest.raises(UniqueKeyHeld) as refused:
                pgq.admin.retry_job(failed, session=session)
            assert refused.value.job_id == holder
            # The refusal left the caller's transaction usable.
            assert session.execute(text("SELECT 1")).scalar_one() == 1
            session.commit()
    finally:
        committer.join()
        other.close()
    assert states_of(pgq, [failed, holder]) == {failed: JobState.FAILED, holder: JobState.QUEUED}
