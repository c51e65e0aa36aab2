"""Workflows (chain, group, chord): enqueued whole in one transaction, results passed through
the database, each callback released once, failures ending the workflow FAILED and running
``on_failure`` once, cancellation."""

from __future__ import annotations

import asyncio
import itertools
import threading
import time
from typing import Any

import pytest
from sqlalchemy import text
from sqlalchemy.engine import URL
from sqlalchemy.ext.asyncio import AsyncSession, create_async_engine
from sqlalchemy.orm import Session
from support.workers import in_thread

from pgqueue import (
    JobState,
    PgQueue,
    QueueFull,
    ValidationError,
    WorkflowNotFound,
    chain,
    chord,
    group,
)
from pgqueue.explain import BlockerKind
from pgqueue.testing import run_until_final, table_counts
from pgqueue.worker import Worker


def run_workflow(pgq: PgQueue, workflow_id: int, timeout: float = 30.0, **options: Any) -> Any:
    """Run a worker in a thread until the workflow ended; its status (shared by the workflow
    test modules)."""
    options.setdefault("concurrency", 4)
    worker = Worker(pgq, **options)
    with in_thread(worker, join_timeout=60):
        return pgq.wait_for_workflow(workflow_id, timeout=timeout)


def test_a_chain_passes_each_result_to_the_next_step(pgq: PgQueue) -> None:
    @pgq.task(name="add")
    def add(x: int, y: int) -> int:
        return x + y

    @pgq.task(name="mul")
    def mul(x: int, y: int) -> int:
        return x * y

    wf = chain(add.s(2, 2), add.s(4), mul.s(10)).enqueue()
    status = run_workflow(pgq, wf.id)
    assert status.state == "succeeded"
    assert status.result == 80
    assert [pgq.get_job(j).args for j in wf.job_ids] == [[2, 2], [4, 4], [8, 10]]


def test_a_chain_of_100_steps_passes_every_value_on(pgq: PgQueue) -> None:
    @pgq.task(name="inc")
    def inc(x: int) -> int:
        return x + 1

    wf = chain(inc.si(0), *(inc.s() for _ in range(99))).enqueue()
    status = run_workflow(pgq, wf.id, concurrency=2)
    assert status.state == "succeeded"
    assert status.result == 100
    assert [pgq.get_job(j).result for j in wf.job_ids] == list(range(1, 101))


def test_si_receives_no_parent_result(pgq: PgQueue) -> None:
    @pgq.task(name="echo")
    def echo(*values: Any) -> list[Any]:
        return list(values)

    wf = chain(echo.s("a"), echo.si("b"), echo.s("c")).enqueue()
    status = run_workflow(pgq, wf.id)
    assert status.result == [["b"], "c"]


def test_a_chord_callback_gets_the_results_in_group_order_once(pgq: PgQueue) -> None:
    pgq.engine.dispose()
    with pgq.engine.begin() as c:
        c.execute(text("CREATE TABLE callback_runs (n int)"))

    @pgq.task(name="square")
    def square(x: int) -> int:
        return x * x

    @pgq.task(name="collect")
    def collect(results: list[int]) -> int:
        with pgq.engine.begin() as c:
            c.execute(text("INSERT INTO callback_runs VALUES (:n)"), {"n": len(results)})
        assert results == [i * i for i in range(300)]
        return sum(results)

    wf = chord([square.s(i) for i in range(300)], collect.s()).enqueue()
    status = run_workflow(pgq, wf.id, concurrency=8)
    assert status.state == "succeeded"
    assert status.result == sum(i * i for i in range(300))
    with pgq.engine.connect() as c:
        assert c.execute(text("SELECT n FROM callback_runs")).scalars().all() == [300]
    # The callback's arguments were read when it was released, not copied at enqueue.
    callback = pgq.get_job(wf.job_ids[-1])
    assert callback.args == [[i * i for i in range(300)]]


def test_a_group_from_a_generator_returns_its_results_in_order(pgq: PgQueue) -> None:
    @pgq.task(name="double")
    def double(x: int) -> int:
        return 2 * x

    wf = group(double.s(i) for i in range(50)).enqueue()
    status = run_workflow(pgq, wf.id)
    assert status.state == "succeeded"
    assert status.result == [2 * i for i in range(50)]
    assert len(status.jobs) == 50


def test_a_nested_chain_of_a_group_passes_the_list_on(pgq: PgQueue) -> None:
    @pgq.task(name="start")
    def start() -> int:
        return 3

    @pgq.task(name="plus")
    def plus(x: int, y: int) -> int:
        return x + y

    @pgq.task(name="total")
    def total(values: list[int]) -> int:
        return sum(values)

    wf = chain(start.s(), group(plus.s(1), plus.s(2)), total.s()).enqueue()
    status = run_workflow(pgq, wf.id)
    assert status.state == "succeeded"
    assert status.result == (3 + 1) + (3 + 2)


def test_a_rollback_of_the_callers_session_leaves_nothing(pgq: PgQueue) -> None:
    @pgq.task(name="noop")
    def noop(*_: Any) -> None:
        return None

    with Session(pgq.engine) as session:
        chain(noop.s(), group(noop.s(), noop.s()), noop.s()).configure(session=session).enqueue()
        session.rollback()
    counts = table_counts(pgq.engine)
    assert counts["pgqueue_jobs"] == 0
    assert counts["pgqueue_message_queue"] == 0
    with pgq.engine.connect() as c:
        assert c.execute(text("SELECT count(*) FROM pgqueue_workflows")).scalar() == 0


def test_a_commit_of_the_callers_session_makes_the_whole_workflow(pgq: PgQueue) -> None:
    @pgq.task(name="noop")
    def noop(*_: Any) -> None:
        return None

    with Session(pgq.engine) as session:
        wf = chain(noop.s(), group(noop.s(), noop.s()), noop.s()).enqueue(session=session)
        # Nothing is visible before the commit.
        with pgq.engine.connect() as c:
            assert c.execute(text("SELECT count(*) FROM pgqueue_jobs")).scalar() == 0
        session.commit()
    status = pgq.get_workflow(wf.id)
    assert status.state == "running"
    assert len(status.jobs) == 4
    assert table_counts(pgq.engine)["pgqueue_message_queue"] == 1  # only the first step
    assert run_workflow(pgq, wf.id).state == "succeeded"


def test_a_failed_member_fails_the_workflow_and_runs_on_failure_once(pgq: PgQueue) -> None:
    pgq.engine.dispose()
    with pgq.engine.begin() as c:
        c.execute(text("CREATE TABLE failures_seen (failures json)"))

    @pgq.task(name="maybe", max_attempts=1)
    def maybe(x: int) -> int:
        if x % 10 == 3:
            raise RuntimeError(f"member {x} broke")
        return x

    @pgq.task(name="merge")
    def merge(results: list[int]) -> int:
        return len(results)

    @pgq.task(name="alert")
    def alert(failures: list[dict[str, Any]]) -> None:
        import json

        with pgq.engine.begin() as c:
            c.execute(text("INSERT INTO failures_seen VALUES (:f)"), {"f": json.dumps(failures)})

    wf = chord([maybe.s(i) for i in range(40)], merge.s(), on_failure=alert.s()).enqueue()
    status = run_workflow(pgq, wf.id, concurrency=8)
    assert status.state == "failed"
    callback = pgq.get_job(wf.job_ids[40])
    assert callback.state is JobState.CANCELLED
    on_failure = status.on_failure_job_id
    assert on_failure is not None
    final = run_until_final(pgq, [on_failure])
    assert final[on_failure] is JobState.SUCCEEDED
    with pgq.engine.connect() as c:
        rows = c.execute(text("SELECT failures FROM failures_seen")).scalars().all()
    assert len(rows) == 1
    failed_ids = [wf.job_ids[i] for i in range(40) if i % 10 == 3]
    assert [f["id"] for f in rows[0]] == failed_ids
    assert all("broke" in f["error"] for f in rows[0])


def test_on_failure_does_not_run_when_the_workflow_succeeds(pgq: PgQueue) -> None:
    @pgq.task(name="ok")
    def ok() -> int:
        return 1

    @pgq.task(name="alert")
    def alert(failures: list[Any]) -> None:
        raise AssertionError("must not run")

    wf = chain(ok.s(), ok.si(), on_failure=alert.s()).enqueue()
    status = run_workflow(pgq, wf.id)
    assert status.state == "succeeded"
    assert status.on_failure_job_id is not None
    assert pgq.get_job(status.on_failure_job_id).state is JobState.CANCELLED


def test_a_failed_step_cancels_the_rest_of_the_chain(pgq: PgQueue) -> None:
    @pgq.task(name="boom", max_attempts=1)
    def boom() -> None:
        raise RuntimeError("boom")

    @pgq.task(name="after")
    def after(_: Any) -> None:
        return None

    wf = chain(boom.s(), after.s(), after.s(), after.s()).enqueue()
    status = run_workflow(pgq, wf.id)
    assert status.state == "failed"
    assert [j.state for j in status.jobs] == [JobState.FAILED] + [JobState.CANCELLED] * 3


def test_cancel_workflow_cancels_what_has_not_started(pgq: PgQueue) -> None:
    @pgq.task(name="noop")
    def noop(*_: Any) -> None:
        return None

    @pgq.task(name="alert")
    def alert(failures: list[Any]) -> None:
        return None

    wf = chain(noop.s(), group(noop.s() for _ in range(5)), noop.s(), on_failure=alert.s())
    enqueued = wf.enqueue()
    assert pgq.cancel_workflow(enqueued.id) is True
    status = pgq.get_workflow(enqueued.id)
    assert status.state == "cancelled"
    assert {j.state for j in status.jobs} == {JobState.CANCELLED}
    assert pgq.get_job(status.on_failure_job_id or 0).state is JobState.CANCELLED
    assert table_counts(pgq.engine)["pgqueue_message_queue"] == 0
    # Ended: waiting returns at once, and a second cancel changes nothing.
    assert pgq.wait_for_workflow(enqueued.id, timeout=5).state == "cancelled"
    assert pgq.cancel_workflow(enqueued.id) is False


def test_unknown_workflow_raises(pgq: PgQueue) -> None:
    with pytest.raises(WorkflowNotFound):
        pgq.get_workflow(12345)
    with pytest.raises(WorkflowNotFound):
        pgq.cancel_workflow(12345)


def test_bad_signatures_are_refused_before_any_sql(pgq: PgQueue) -> None:
    @pgq.task(name="one")
    def one(x: int) -> int:
        return x

    with pytest.raises(ValidationError, match="arguments do not match"):
        chain(one.s(1), one.s(2)).enqueue()  # the second gets the first's result too
    with pytest.raises(ValidationError, match="at least one"):
        group([])
    with pytest.raises(ValidationError, match="options"):
        one.s(1).set(depends_on=[1])
    with pytest.raises(ValidationError):
        one.s(1).set(priority="high")
    assert table_counts(pgq.engine)["pgqueue_jobs"] == 0


def test_set_options_reach_the_jobs(pgq: PgQueue) -> None:
    @pgq.task(name="one")
    def one(x: int) -> int:
        return x

    wf = chain(one.s(1).set(queue="fast", priority=5), one.s().set(max_attempts=7)).enqueue()
    first, second = (pgq.get_job(j) for j in wf.job_ids)
    assert (first.queue, first.priority) == ("fast", 5)
    assert second.max_attempts == 7


@pytest.mark.slow
def test_a_group_of_10000_runs_every_member(pgq: PgQueue) -> None:
    @pgq.task(name="ident")
    def ident(x: int) -> int:
        return x

    wf = group(ident.s(i) for i in range(10_000)).enqueue()
    assert table_counts(pgq.engine)["pgqueue_message_queue"] == 10_000
    status = run_workflow(pgq, wf.id, timeout=120, concurrency=16)
    assert status.state == "succeeded"
    assert status.result == list(range(10_000))


@pytest.mark.slow
def test_a_chord_of_10000_calls_back_once_with_every_result_in_order(pgq: PgQueue) -> None:
    pgq.engine.dispose()
    with pgq.engine.begin() as c:
        c.execute(text("CREATE TABLE callback_runs (n int, ordered bool)"))

    @pgq.task(name="ident")
    def ident(x: int) -> int:
        return x

    @pgq.task(name="check")
    def check(results: list[int]) -> int:
        with pgq.engine.begin() as c:
            c.execute(
                text("INSERT INTO callback_runs VALUES (:n, :o)"),
                {"n": len(results), "o": results == list(range(10_000))},
            )
        return len(results)

    wf = chord([ident.s(i) for i in range(10_000)], check.s()).enqueue()
    status = run_workflow(pgq, wf.id, timeout=120, concurrency=16)
    assert status.state == "succeeded"
    assert status.result == 10_000
    with pgq.engine.connect() as c:
        assert c.execute(text("SELECT n, ordered FROM callback_runs")).all() == [(10_000, True)]
    # The countdown ended at 0: every member's end was counted exactly once.
    assert pgq.get_job(wf.job_ids[-1]).state is JobState.SUCCEEDED
    with pgq.engine.connect() as c:
        pending = c.execute(
            text("SELECT pending_dependencies FROM pgqueue_jobs WHERE id = :id"),
            {"id": wf.job_ids[-1]},
        ).scalar()
    assert pending == 0


def test_aenqueue_in_an_async_session_and_await_workflow(pgq: PgQueue, database_url: URL) -> None:
    @pgq.task(name="add")
    def add(x: int, y: int) -> int:
        return x + y

    async def enqueue() -> int:
        app_engine = create_async_engine(database_url.set(drivername="postgresql+psycopg_async"))
        try:
            async with AsyncSession(app_engine) as session:
                await chain(add.s(1, 2), add.s(3)).aenqueue(session=session)
                await session.rollback()
            async with AsyncSession(app_engine) as session, session.begin():
                wf = await chain(add.s(1, 2), add.s(3)).configure(session=session).aenqueue()
            return wf.id
        finally:
            await app_engine.dispose()

    async def wait(workflow_id: int) -> Any:
        try:
            return await pgq.await_workflow(workflow_id, timeout=30)
        finally:
            await pgq.adispose()

    workflow_id = asyncio.run(enqueue())
    assert table_counts(pgq.engine)["pgqueue_jobs"] == 3  # two steps and the closing marker
    worker = Worker(pgq, concurrency=2)
    with in_thread(worker, join_timeout=60):
        status = asyncio.run(wait(workflow_id))
    assert (status.state, status.result) == ("succeeded", 6)


def test_a_result_over_the_payload_limit_fails_the_member_not_the_callback(
    pgq: PgQueue,
) -> None:
    @pgq.task(name="big", max_attempts=1)
    def big() -> str:
        return "x" * (pgq.settings.max_payload_bytes + 10)

    @pgq.task(name="merge")
    def merge(results: list[Any]) -> int:
        return len(results)

    wf = chord([big.s()], merge.s()).enqueue()
    status = run_workflow(pgq, wf.id)
    assert status.state == "failed"
    member = pgq.get_job(wf.job_ids[0])
    assert member.state is JobState.FAILED
    assert "result could not be stored" in (member.last_error or "")
    assert pgq.get_job(wf.job_ids[1]).state is JobState.CANCELLED


def test_explain_names_what_a_waiting_member_waits_for(pgq: PgQueue) -> None:
    @pgq.task(name="noop")
    def noop(*_: Any) -> None:
        return None

    wf = chord([noop.s() for _ in range(30)], noop.s()).enqueue()
    callback = wf.job_ids[-1]
    explanation = pgq.explain_job(callback)
    [blocker] = [b for b in explanation.blockers if b.kind is BlockerKind.DEPENDENCIES]
    assert blocker.message.startswith(f"waiting for 30 of 30 dependencies of workflow {wf.id}")
    assert str(wf.job_ids[0]) in blocker.message
    assert blocker.data["pending"] == 30
    assert blocker.data["workflow_id"] == wf.id


def test_the_workflow_command_prints_the_workflow_and_cancels_it(pgq: PgQueue) -> None:
    import json

    from click.testing import CliRunner

    from pgqueue.cli import main

    @pgq.task(name="noop")
    def noop(*_: Any) -> None:
        return None

    wf = chain(noop.s(), noop.s()).enqueue()
    url = pgq.url.render_as_string(hide_password=False)
    runner = CliRunner()
    shown = runner.invoke(main, ["workflow", str(wf.id), "--database-url", url])
    assert shown.exit_code == 0, shown.output
    lines = shown.output.splitlines()
    assert lines[0] == f"workflow {wf.id}  running  (2 jobs: 1 queued, 1 waiting)"
    assert lines[2] == f"  job {wf.job_ids[1]}  noop  waiting  after {wf.job_ids[0]}"
    as_json = runner.invoke(main, ["workflow", str(wf.id), "--json", "--database-url", url])
    record = json.loads(as_json.output)
    assert [j["state"] for j in record["jobs"]] == ["queued", "waiting"]
    cancelled = runner.invoke(main, ["workflow", str(wf.id), "--cancel", "--database-url", url])
    assert cancelled.output.strip() == f"workflow {wf.id}: cancelled"
    assert pgq.get_workflow(wf.id).state == "cancelled"
    missing = runner.invoke(main, ["workflow", "999999", "--database-url", url])
    assert missing.exit_code != 0
    assert "no workflow with id 999999" in missing.output


def test_pruning_the_closing_marker_deletes_the_workflow_row(pgq: PgQueue) -> None:
    @pgq.task(name="noop")
    def noop(*_: Any) -> None:
        return None

    ended = chain(noop.s(), noop.s()).enqueue()
    assert run_workflow(pgq, ended.id).state == "succeeded"
    running = chain(noop.s(), noop.s()).enqueue()
    with pgq.engine.begin() as c:
        c.execute(text("UPDATE pgqueue_jobs SET finished_at = now() - interval '30 days'"))
    assert pgq.prune() == 3  # the ended workflow's two steps and its marker
    with pgq.engine.connect() as c:
        rows = c.execute(text("SELECT id FROM pgqueue_workflows")).scalars().all()
    assert rows == [running.id]
    with pytest.raises(WorkflowNotFound):
        pgq.get_workflow(ended.id)


def test_atomic_keyed_and_prioritised_members(pgq: PgQueue) -> None:
    """An atomic member commits its writes with its outcome and gets its parent's result; the
    members of a keyed task respect its key's limit; a member's priority orders its claim."""
    runs: list[tuple[str, int]] = []
    running = {"now": 0, "most": 0}
    lock = threading.Lock()

    @pgq.task(name="keyed_part", concurrency_key=lambda n: "one-key", key_limit=1)
    def keyed_part(n: int) -> int:
        with lock:
            running["now"] += 1
            running["most"] = max(running["most"], running["now"])
        time.sleep(0.05)
        with lock:
            running["now"] -= 1
        return n

    @pgq.task(name="atomic_total", atomic=True, pass_context=True)
    def atomic_total(ctx: Any, results: list[int]) -> int:
        ctx.session.execute(
            text("INSERT INTO wf_atomic_rows (total) VALUES (:t)"), {"t": sum(results)}
        )
        return sum(results)

    @pgq.task(name="ordered", queue="ordered")
    def ordered(label: str) -> None:
        runs.append((label, 0))

    with pgq.engine.begin() as connection:
        connection.execute(text("CREATE TABLE wf_atomic_rows (total int)"))
    keyed = chord([keyed_part.s(n) for n in range(6)], atomic_total.s()).enqueue()
    prioritised = group(
        ordered.si("low").set(priority=10), ordered.si("high").set(priority=-10)
    ).enqueue()
    status = run_workflow(pgq, keyed.id, queues=["default"])
    assert (status.state, status.result) == ("succeeded", 15)
    assert running["most"] == 1
    with pgq.engine.connect() as connection:
        assert connection.execute(text("SELECT total FROM wf_atomic_rows")).scalars().all() == [15]
    pgq.run_worker(drain=True, queues=["ordered"], concurrency=1)
    assert pgq.get_workflow(prioritised.id).state == "succeeded"
    assert [label for label, _ in runs] == ["high", "low"]


def test_members_count_toward_a_bounded_queues_depth(pgq: PgQueue) -> None:
    """A workflow goes to a bounded queue when all its jobs fit: its members count toward the
    depth while they wait, and so does its closing marker (in its first job's queue). One that
    does not fit raises QueueFull naming the queue and writes nothing."""

    @pgq.task(name="bounded_step", queue="tight")
    def bounded_step(x: int) -> int:
        return x + 1

    pgq.set_queue_max_depth("tight", 4)
    fits = chain(bounded_step.s(1), bounded_step.s(), bounded_step.s()).enqueue()  # 3 + marker
    with pytest.raises(QueueFull) as full:
        group(bounded_step.s(1)).enqueue()
    assert "tight" in str(full.value)
    with pytest.raises(QueueFull):
        bounded_step.enqueue(0)
    with pgq.engine.connect() as connection:
        counts = connection.execute(
            text(
                "SELECT (SELECT count(*) FROM pgqueue_workflows),"
                " (SELECT count(*) FROM pgqueue_jobs WHERE queue = 'tight')"
            )
        ).one()
    assert tuple(counts) == (1, 4)
    status = run_workflow(pgq, fits.id)
    assert (status.state, status.result) == ("succeeded", 4)
    second = chain(bounded_step.s(10), bounded_step.s(), bounded_step.s()).enqueue()
    assert run_workflow(pgq, second.id).result == 13


def test_a_limited_and_rate_limited_queue_holds_its_members_to_its_limits(pgq: PgQueue) -> None:
    """Members of a group in a queue limited to 1 running job never overlap; members of a
    chord in a queue limited to 2 starts per second start no faster, and the callback runs."""
    spans: dict[str, list[tuple[float, float]]] = {"limited": [], "rated": []}
    lock = threading.Lock()

    @pgq.task(name="limited_part", queue="limited")
    def limited_part(n: int) -> int:
        started = time.monotonic()
        time.sleep(0.05)
        with lock:
            spans["limited"].append((started, time.monotonic()))
        return n

    @pgq.task(name="rated_part", queue="rated")
    def rated_part(n: int) -> int:
        with lock:
            spans["rated"].append((time.monotonic(), 0.0))
        return n

    @pgq.task(name="rated_total", queue="rated")
    def rated_total(values: list[int]) -> int:
        return sum(values)

    pgq.set_queue_limit("limited", 1)
    pgq.set_rate_limit("rated", 2, per=1.0)
    limited = group(limited_part.s(n) for n in range(6)).enqueue()
    rated = chord([rated_part.s(n) for n in range(4)], rated_total.s()).enqueue()
    assert run_workflow(pgq, limited.id, concurrency=6).result == list(range(6))
    ordered = sorted(spans["limited"])
    assert all(end <= next_start for (_, end), (next_start, _) in itertools.pairwise(ordered))
    assert run_workflow(pgq, rated.id, concurrency=6).result == 6
    starts = sorted(start for start, _ in spans["rated"])
    # 4 members and the callback at 2 per second: the third start waits for the window.
    assert starts[2] - starts[0] >= 0.9
