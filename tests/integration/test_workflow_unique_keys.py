"""Unique keys on workflow members: a keyed member holds its key from the workflow's enqueue
until it ends, waiting included; a workflow a member of which has a key held elsewhere is not
enqueued at all (``UniqueKeyHeld``, nothing written, the caller's transaction still usable)."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import create_engine, event, text
from sqlalchemy.engine import URL
from sqlalchemy.ext.asyncio import AsyncSession, create_async_engine
from sqlalchemy.orm import Session
from support.host_alembic import owned_transaction_config
from support.locks import wait_for_lock_waiters
from test_workflows import run_workflow

from alembic import command
from pgqueue import JobState, PgQueue, UniqueKeyHeld, ValidationError, chain, group, migrations
from pgqueue.data.insert_choice import COPY_THRESHOLD
from pgqueue.errors import MigrationRefused

# The tables a workflow's enqueue writes.
TABLES = ("pgqueue_jobs", "pgqueue_message_queue", "pgqueue_workflows")


def _rows(pgq: PgQueue) -> dict[str, int]:
    with pgq.engine.connect() as c:
        return {t: c.execute(text(f"SELECT count(*) FROM {t}")).scalar_one() for t in TABLES}


def _tasks(pgq: PgQueue) -> tuple[Any, Any]:
    @pgq.task(name="first")
    def first(n: int) -> int:
        return n

    @pgq.task(name="then")
    def then(previous: int, n: int) -> int:
        return previous + n

    return first, then


def test_a_waiting_member_holds_its_key_until_it_ends(pgq: PgQueue) -> None:
    first, then = _tasks(pgq)
    wf = chain(first.s(1), then.s(10).set(unique_key="report:7")).enqueue()
    member = wf.job_ids[1]
    assert pgq.get_job(member).state is JobState.WAITING
    # A plain enqueue of the key, from Python and from SQL, returns the waiting member.
    assert then.configure(unique_key="report:7").enqueue(0, 0) == member
    with pgq.engine.begin() as c:
        held = c.execute(text("SELECT pgqueue_enqueue('then', unique_key => 'report:7')"))
        assert held.scalar_one() == member
    assert _rows(pgq)["pgqueue_jobs"] == 3  # the two steps and the closing marker

    status = run_workflow(pgq, wf.id, concurrency=2)
    assert (status.state, status.result) == ("succeeded", 11)
    # Ended, the member holds the key no more: it can be taken again, by a plain job or a member.
    again = then.configure(unique_key="report:7").enqueue(0, 0)
    assert again not in wf.job_ids
    pgq.cancel_job(again)
    second = chain(first.s(2), then.s(20).set(unique_key="report:7")).enqueue()
    assert run_workflow(pgq, second.id, concurrency=2).result == 22


def test_a_large_workflow_with_a_keyed_member_keeps_the_key(pgq: PgQueue) -> None:
    """A group as large as the COPY path takes, one member keyed: written by the INSERT path,
    so the member has its key and holds it."""
    first, _ = _tasks(pgq)
    members = [first.s(i) for i in range(COPY_THRESHOLD - 1)]
    members.append(first.s(-1).set(unique_key="big"))
    wf = group(members).enqueue()
    assert len(wf.job_ids) == COPY_THRESHOLD
    assert first.configure(unique_key="big").enqueue(0) == wf.job_ids[-1]
    assert _rows(pgq) == {
        "pgqueue_jobs": COPY_THRESHOLD + 1,
        "pgqueue_message_queue": COPY_THRESHOLD,
        "pgqueue_workflows": 1,
    }


def test_a_held_key_refuses_the_whole_workflow_and_writes_nothing(pgq: PgQueue) -> None:
    first, then = _tasks(pgq)
    holder = then.configure(unique_key="k").enqueue(0, 0)
    before = _rows(pgq)
    workflow = chain(first.s(1).set(unique_key="other"), then.s(2).set(unique_key="k"))
    with pytest.raises(UniqueKeyHeld) as refused:
        workflow.enqueue()
    assert (refused.value.key, refused.value.job_id, refused.value.workflow_id) == (
        "k",
        holder,
        None,
    )
    assert str(refused.value) == (
        f"workflow not enqueued: unique_key 'k' of one of its members is held by job {holder}"
    )
    assert _rows(pgq) == before
    # The member's other key was not taken either.
    assert first.configure(unique_key="other").enqueue(0) != holder
    assert _rows(pgq)["pgqueue_jobs"] == before["pgqueue_jobs"] + 1


def test_a_key_held_by_another_workflows_member_names_that_workflow(pgq: PgQueue) -> None:
    first, then = _tasks(pgq)
    owner = chain(first.s(1), then.s(2).set(unique_key="nightly")).enqueue()
    before = _rows(pgq)
    with pytest.raises(UniqueKeyHeld) as refused:
        group(first.s(3), first.s(4).set(unique_key="nightly")).enqueue()
    held = refused.value
    assert (held.key, held.job_id, held.workflow_id) == ("nightly", owner.job_ids[1], owner.id)
    assert f"job {owner.job_ids[1]} of workflow {owner.id}" in str(held)
    assert _rows(pgq) == before


def test_in_the_callers_session_the_refusal_leaves_its_transaction_usable(pgq: PgQueue) -> None:
    first, then = _tasks(pgq)
    holder = then.configure(unique_key="k").enqueue(0, 0)
    with Session(pgq.engine) as session:
        earlier = first.configure(session=session).enqueue(1)
        workflow = chain(first.s(2), then.s(3).set(unique_key="k")).configure(session=session)
        with pytest.raises(UniqueKeyHeld) as refused:
            workflow.enqueue()
        assert refused.value.job_id == holder
        later = first.configure(session=session).enqueue(4)
        session.commit()
    with pgq.engine.connect() as c:
        ids = c.execute(text("SELECT id FROM pgqueue_jobs ORDER BY id")).scalars().all()
    assert ids == [holder, earlier, later]
    assert _rows(pgq) == {"pgqueue_jobs": 3, "pgqueue_message_queue": 3, "pgqueue_workflows": 0}


def test_two_members_with_one_key_are_refused_before_any_sql(pgq: PgQueue) -> None:
    first, _ = _tasks(pgq)
    with pytest.raises(ValidationError, match="two jobs of the workflow have unique_key 'twice'"):
        group(first.s(1).set(unique_key="twice"), first.s(2).set(unique_key="twice")).enqueue()
    assert _rows(pgq) == dict.fromkeys(TABLES, 0)


def test_a_workflow_waiting_for_a_holders_commit_is_refused_when_it_commits(pgq: PgQueue) -> None:
    """The second enqueue's insert waits for the first transaction holding the key (the unique
    index's check), then finds it held: refused whole, nothing of it written."""
    first, then = _tasks(pgq)
    outcome: dict[str, Any] = {}

    def second() -> None:
        try:
            outcome["ids"] = group(first.s(9), then.s(1, 2).set(unique_key="race")).enqueue()
        except UniqueKeyHeld as exc:
            outcome["refused"] = exc

    with Session(pgq.engine) as session:
        held = chain(first.s(1), then.s(2).set(unique_key="race")).enqueue(session=session)
        thread = threading.Thread(target=second)
        thread.start()
        wait_for_lock_waiters(pgq.engine)
        assert thread.is_alive()  # waiting for this transaction
        session.commit()
    thread.join(timeout=30)
    assert "ids" not in outcome
    assert (outcome["refused"].job_id, outcome["refused"].workflow_id) == (
        held.job_ids[1],
        held.id,
    )
    assert _rows(pgq) == {"pgqueue_jobs": 3, "pgqueue_message_queue": 1, "pgqueue_workflows": 1}


@pytest.mark.parametrize("round_", range(5))
def test_concurrent_workflows_sharing_keys_exactly_one_is_enqueued(
    pgq: PgQueue, round_: int
) -> None:
    """Two threads released by a barrier enqueue workflows sharing two keys, listed in opposite
    orders: exactly one is enqueued, the other raises UniqueKeyHeld, nothing half-written."""
    first, _ = _tasks(pgq)
    barrier = threading.Barrier(2)
    enqueued: list[Any] = []
    refused: list[UniqueKeyHeld] = []
    errors: list[BaseException] = []

    def enqueue(keys: tuple[str, str]) -> None:
        workflow = group(first.s(1).set(unique_key=keys[0]), first.s(2).set(unique_key=keys[1]))
        barrier.wait()
        try:
            enqueued.append(workflow.enqueue())
        except UniqueKeyHeld as exc:
            refused.append(exc)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=enqueue, args=(keys,)) for keys in (("a", "b"), ("b", "a"))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    assert errors == []
    assert (len(enqueued), len(refused)) == (1, 1)
    assert refused[0].workflow_id == enqueued[0].id
    assert refused[0].job_id in enqueued[0].job_ids
    assert _rows(pgq) == {"pgqueue_jobs": 3, "pgqueue_message_queue": 2, "pgqueue_workflows": 1}


def test_a_workflow_takes_its_keys_in_key_order_so_it_never_deadlocks(pgq: PgQueue) -> None:
    """A transaction holding key a (uncommitted) and then taking key b, while a workflow with
    members keyed b, a (in that order) waits for a: the workflow took no key before a, so the
    transaction gets b at once (no deadlock) and commits; the workflow is refused, naming the
    first of its members whose key is held (b)."""
    first, then = _tasks(pgq)
    outcome: dict[str, Any] = {}

    def enqueue_workflow() -> None:
        workflow = group(first.s(1).set(unique_key="b"), first.s(2).set(unique_key="a"))
        try:
            with Session(pgq.engine) as session:
                outcome["ids"] = workflow.enqueue(session=session)
                session.commit()
        except BaseException as exc:
            outcome["error"] = exc

    with Session(pgq.engine) as session:
        a = then.configure(session=session, unique_key="a").enqueue(0, 0)
        thread = threading.Thread(target=enqueue_workflow)
        thread.start()
        wait_for_lock_waiters(pgq.engine)
        assert thread.is_alive()  # waiting for key a
        b = then.configure(session=session, unique_key="b").enqueue(0, 0)
        session.commit()
    thread.join(timeout=30)
    assert "ids" not in outcome
    assert isinstance(outcome["error"], UniqueKeyHeld)
    assert (outcome["error"].key, outcome["error"].job_id) == ("b", b)
    with pgq.engine.connect() as c:
        held = c.execute(text("SELECT unique_key, id FROM pgqueue_jobs ORDER BY id")).all()
    assert [tuple(row) for row in held] == [("a", a), ("b", b)]


def test_cancel_workflow_frees_the_keys_of_its_waiting_members(pgq: PgQueue) -> None:
    first, then = _tasks(pgq)
    wf = chain(first.s(1), then.s(2).set(unique_key="k")).enqueue()
    with pytest.raises(UniqueKeyHeld):
        chain(first.s(1), then.s(2).set(unique_key="k")).enqueue()
    assert pgq.cancel_workflow(wf.id) is True
    assert pgq.get_job(wf.job_ids[1]).state is JobState.CANCELLED
    again = chain(first.s(3), then.s(4).set(unique_key="k")).enqueue()
    assert then.configure(unique_key="k").enqueue(0, 0) == again.job_ids[1]


def test_aenqueue_raises_unique_key_held_and_writes_nothing(
    pgq: PgQueue, database_url: URL
) -> None:
    first, then = _tasks(pgq)
    holder = then.configure(unique_key="k").enqueue(0, 0)
    before = _rows(pgq)

    async def main() -> tuple[UniqueKeyHeld, UniqueKeyHeld, int]:
        app_engine = create_async_engine(database_url.set(drivername="postgresql+psycopg_async"))
        workflow = chain(first.s(1), then.s(2).set(unique_key="k"))
        try:
            with pytest.raises(UniqueKeyHeld) as own:
                await workflow.aenqueue()
            async with AsyncSession(app_engine) as session:
                earlier = await first.configure(session=session).aenqueue(5)
                with pytest.raises(UniqueKeyHeld) as in_session:
                    await workflow.configure(session=session).aenqueue()
                await session.commit()
            return own.value, in_session.value, earlier
        finally:
            await app_engine.dispose()
            await pgq.adispose()

    own, in_session, earlier = asyncio.run(main())
    assert (own.key, own.job_id, own.workflow_id) == ("k", holder, None)
    assert (in_session.key, in_session.job_id) == ("k", holder)
    after = _rows(pgq)
    assert after["pgqueue_workflows"] == before["pgqueue_workflows"] == 0
    assert after["pgqueue_jobs"] == before["pgqueue_jobs"] + 1  # the session's own job
    assert pgq.get_job(earlier).state is JobState.QUEUED


def _index_and_function(connection: Any) -> tuple[str, bool, str]:
    """The unique index's predicate, whether it is valid, and ``pgqueue_enqueue``'s lookup of a
    key's holder (the state list after ``j.state IN``)."""
    predicate, valid = connection.execute(
        text(
            "SELECT pg_get_expr(i.indpred, i.indrelid), i.indisvalid FROM pg_index AS i"
            " WHERE i.indexrelid = 'uq_pgqueue_jobs_unique_key_active'::regclass"
        )
    ).one()
    body = connection.execute(
        text("SELECT prosrc FROM pg_proc WHERE proname = 'pgqueue_enqueue'")
    ).scalar_one()
    lookup = body[body.index("j.state IN (") :].split(")")[0]
    return predicate, valid, lookup


OLD_LOOKUP = "j.state IN ('queued', 'running', 'retrying'"
NEW_LOOKUP = "j.state IN ('queued', 'running', 'retrying', 'waiting'"


def test_migration_down_and_up_with_jobs_held(empty_database_url: URL) -> None:
    """Down refuses while a waiting job holds a key (nothing changed), then goes down once none
    does; up refuses a waiting job whose key another job holds, then goes up; the jobs stay."""
    engine = create_engine(empty_database_url)
    insert = text(
        "INSERT INTO pgqueue_jobs (id, task_name, queue, state, unique_key)"
        " VALUES (:id, 't', 'q', :state, :key)"
    )
    try:
        with engine.begin() as c:
            migrations.upgrade(c, "pgqueue_0023")
            c.execute(
                insert,
                [
                    {"id": 1, "state": "queued", "key": "plain"},
                    {"id": 2, "state": "waiting", "key": "member"},
                    {"id": 3, "state": "succeeded", "key": "plain"},
                ],
            )
        with engine.begin() as c, pytest.raises(MigrationRefused, match=r"job 2 \('member'\)"):
            migrations.downgrade(c, "pgqueue_0022")
        with engine.begin() as c:
            assert migrations.current(c) == "pgqueue_0023"
            predicate, valid, lookup = _index_and_function(c)
            assert "waiting" in predicate and valid and lookup == NEW_LOOKUP
            c.execute(text("UPDATE pgqueue_jobs SET state = 'cancelled' WHERE id = 2"))
        with engine.begin() as c:
            migrations.downgrade(c, "pgqueue_0022")
            predicate, valid, lookup = _index_and_function(c)
            assert "waiting" not in predicate and valid and lookup == OLD_LOOKUP
            # The older schema lets a waiting job share a held key: the upgrade refuses it.
            c.execute(insert, {"id": 4, "state": "waiting", "key": "plain"})
        refused = pytest.raises(MigrationRefused, match=r"key 'plain': waiting job 4 and job 1")
        with engine.begin() as c, refused:
            migrations.upgrade(c)
        with engine.begin() as c:
            assert migrations.current(c) == "pgqueue_0022"
            c.execute(text("DELETE FROM pgqueue_jobs WHERE id = 4"))
            migrations.upgrade(c)
            predicate, valid, lookup = _index_and_function(c)
            assert "waiting" in predicate and valid and lookup == NEW_LOOKUP
            c.execute(insert, {"id": 5, "state": "waiting", "key": "member"})
            held = c.execute(text("SELECT pgqueue_enqueue('t', unique_key => 'member')"))
            assert held.scalar_one() == 5
            ids = c.execute(text("SELECT id FROM pgqueue_jobs ORDER BY id")).scalars().all()
            assert ids == [1, 2, 3, 5]
    finally:
        engine.dispose()


def test_with_alembic_owning_the_transaction_the_index_is_swapped_concurrently(
    empty_database_url: URL, tmp_path: Path
) -> None:
    """A host's Alembic that begins the migration's transaction itself: 0023 swaps the index
    with CREATE/DROP INDEX CONCURRENTLY both ways, the index ends valid, jobs stay."""
    engine = create_engine(empty_database_url)
    statements: list[str] = []
    event.listen(engine, "before_cursor_execute", lambda *a: statements.append(a[2]), named=False)
    try:
        with engine.connect() as connection:
            config = owned_transaction_config(tmp_path, connection)
            command.upgrade(config, "pgqueue@pgqueue_0022")
            connection.execute(
                text(
                    "INSERT INTO pgqueue_jobs (task_name, queue, state, unique_key)"
                    " SELECT 't', 'q', 'queued', 'k' || i FROM generate_series(1, 1000) AS i"
                )
            )
            connection.commit()
            statements.clear()
            command.upgrade(config, "pgqueue@head")
            assert any("CREATE UNIQUE INDEX CONCURRENTLY" in s for s in statements)
            predicate, valid, lookup = _index_and_function(connection)
            assert "waiting" in predicate and valid and lookup == NEW_LOOKUP
            connection.commit()  # Alembic begins the next transaction itself
            statements.clear()
            command.downgrade(config, "pgqueue@pgqueue_0022")
            assert any("CREATE UNIQUE INDEX CONCURRENTLY" in s for s in statements)
            predicate, valid, lookup = _index_and_function(connection)
            assert "waiting" not in predicate and valid and lookup == OLD_LOOKUP
            names = connection.execute(
                text("SELECT indexname FROM pg_indexes WHERE indexname LIKE 'uq_pgqueue_jobs%'")
            )
            assert names.scalars().all() == ["uq_pgqueue_jobs_unique_key_active"]
            count = connection.execute(text("SELECT count(*) FROM pgqueue_jobs")).scalar_one()
            assert count == 1000
            connection.commit()
    finally:
        engine.dispose()
