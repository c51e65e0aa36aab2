"""Durable steps (``ctx.step``) on real PostgreSQL: a completed step runs once per job across
attempts, atomic steps commit and roll back with their writes, bad steps are refused, a lost
lease saves nothing, jobs without steps pay nothing, and steps go with their job."""

from __future__ import annotations

import datetime as dt
import json
import re
import uuid
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest
from click.testing import CliRunner
from sqlalchemy import Engine, event, text
from sqlalchemy.engine import URL
from support.dashboard import dashboard_app

from pgqueue import JobContext, JobState, PgQueue, Settings, backoff, steps
from pgqueue.cli import main as cli_main
from pgqueue.contrib.flask import PgQueue as FlaskPgQueue
from pgqueue.data import claim as claim_data
from pgqueue.data import steps as steps_data
from pgqueue.db import executor_for
from pgqueue.errors import LeaseLost, ValidationError
from pgqueue.job_filter import JobFilter
from pgqueue.testing import immediate, table_counts

LEDGER = "CREATE TABLE ledger (id bigserial PRIMARY KEY, job_id bigint, tag text)"


@pytest.fixture
def ledger(pgq: PgQueue) -> Engine:
    with pgq.engine.begin() as connection:
        connection.execute(text(LEDGER))
    return pgq.engine


def ledger_tags(engine: Engine) -> list[str]:
    with engine.connect() as connection:
        return list(connection.execute(text("SELECT tag FROM ledger ORDER BY id")).scalars())


def step_count(engine: Engine) -> int:
    with engine.connect() as connection:
        return int(connection.execute(text("SELECT count(*) FROM pgqueue_job_steps")).scalar_one())


def saved_steps(engine: Engine, job_id: int) -> dict[str, Any]:
    with engine.connect() as connection:
        rows = connection.execute(
            text("SELECT name, result FROM pgqueue_job_steps WHERE job_id = :id"), {"id": job_id}
        )
        return {name: result for name, result in rows}


def test_a_retry_after_step_three_fails_does_not_run_steps_one_and_two_again(
    pgq: PgQueue, database_url: URL
) -> None:
    calls: Counter[str] = Counter()
    seen: list[tuple[int, Any, Any, str]] = []

    def charge(amount: int, key: str) -> dict[str, Any]:
        calls["charge"] += 1
        return {"charge": f"ch_{calls['charge']}", "amount": amount, "key": key}

    def receipt(charge_id: str) -> list[Any]:
        calls["receipt"] += 1
        return [charge_id, calls["receipt"]]

    def crm(ctx: JobContext) -> str:
        calls["crm"] += 1
        if ctx.attempt == 1:
            raise RuntimeError("crm is down")
        return "synced"

    @pgq.task(name="checkout", pass_context=True, max_attempts=3, retry=backoff.constant(0))
    def checkout(ctx: JobContext, amount: int) -> list[Any]:
        first = ctx.step("charge", charge, amount, key=ctx.step_key("charge"))
        second = ctx.step("receipt", receipt, first["charge"])
        seen.append((ctx.attempt, first, second, ctx.step_key("charge")))
        return [first, second, ctx.step("crm", crm, ctx)]

    with immediate(pgq):
        job_id = checkout.enqueue(500)
    job = pgq.get_job(job_id)
    assert (job.state, job.attempts) == (JobState.SUCCEEDED, 2), job.errors
    assert calls == {"charge": 1, "receipt": 1, "crm": 2}
    # Both attempts saw the first run's values.
    key = steps.step_key(job_id, "charge")
    first = {"charge": "ch_1", "amount": 500, "key": key}
    assert seen == [(1, first, ["ch_1", 1], key), (2, first, ["ch_1", 1], key)]
    assert job.result == [first, ["ch_1", 1], "synced"]
    assert [(s.name, s.result) for s in job.steps] == [
        ("charge", first),
        ("receipt", ["ch_1", 1]),
        ("crm", "synced"),
    ]
    assert all(isinstance(s.completed_at, dt.datetime) for s in job.steps)
    assert job.steps[0].completed_at < job.steps[2].completed_at

    shown = CliRunner().invoke(
        cli_main,
        ["show", str(job_id), "--json"],
        env={"PGQUEUE_DATABASE_URL": database_url.render_as_string(hide_password=False)},
    )
    assert shown.exit_code == 0, shown.output
    record = json.loads(shown.output)
    assert [s["name"] for s in record["steps"]] == ["charge", "receipt", "crm"]
    assert all(dt.datetime.fromisoformat(s["completed_at"]) for s in record["steps"])


def test_a_step_key_is_a_stable_uuid_per_job_and_name() -> None:
    key = steps.step_key(7, "charge")
    assert str(uuid.UUID(key)) == key and len(key) == 36
    assert re.fullmatch(r"[0-9a-f-]{36}", key)  # a plain token: safe in any HTTP header
    assert steps.step_key(7, "charge") == key
    assert len({key, steps.step_key(8, "charge"), steps.step_key(7, "refund")}) == 3
    # The job id and the name cannot run into each other.
    assert steps.step_key(1, "2/x") != steps.step_key(12, "x")


@pytest.mark.parametrize("atomic", [False, True], ids=["leased", "atomic"])
def test_steps_of_an_async_handler_run_once_across_attempts(
    pgq: PgQueue, ledger: Engine, atomic: bool
) -> None:
    calls: Counter[str] = Counter()

    def plain(n: int) -> int:
        calls["plain"] += 1
        return n * 2

    @pgq.task(
        name="async_steps",
        pass_context=True,
        atomic=atomic,
        max_attempts=3,
        retry=backoff.constant(0),
    )
    async def async_steps(ctx: JobContext) -> list[Any]:
        async def fetch(n: int) -> dict[str, int]:
            calls["fetch"] += 1
            ctx.session.execute(
                text("INSERT INTO ledger (job_id, tag) VALUES (:id, 'fetch')"), {"id": ctx.job_id}
            )
            return {"n": n}

        fetched = await ctx.astep("fetch", fetch, 21)
        doubled = await ctx.astep("plain", plain, fetched["n"])
        if ctx.attempt == 1:
            raise RuntimeError("later failure")
        return [fetched, doubled]

    with immediate(pgq):
        job_id = async_steps.enqueue()
    job = pgq.get_job(job_id)
    assert (job.state, job.attempts, job.result) == (JobState.SUCCEEDED, 2, [{"n": 21}, 42])
    if atomic:  # rolled back with the failed attempt, so run again; its write is not doubled
        assert calls == {"fetch": 2, "plain": 2}
    else:  # saved at once, not run again; its write in ctx.session went with the failed handler
        assert calls == {"fetch": 1, "plain": 1}
    assert ledger_tags(ledger) == (["fetch"] if atomic else [])
    assert [s.name for s in job.steps] == ["fetch", "plain"]


def test_an_atomic_step_rolled_back_with_its_failing_handler_runs_again_without_doubled_writes(
    pgq: PgQueue, ledger: Engine
) -> None:
    calls: Counter[str] = Counter()

    @pgq.task(
        name="atomic_steps",
        pass_context=True,
        atomic=True,
        max_attempts=3,
        retry=backoff.constant(0),
    )
    def atomic_steps(ctx: JobContext) -> int:
        def write() -> int:
            calls["write"] += 1
            ctx.session.execute(
                text("INSERT INTO ledger (job_id, tag) VALUES (:id, 'write')"), {"id": ctx.job_id}
            )
            return calls["write"]

        value: int = ctx.step("write", write)
        if ctx.attempt == 1:
            raise RuntimeError("the handler fails after its step")
        return value

    with immediate(pgq):
        job_id = atomic_steps.enqueue()
    job = pgq.get_job(job_id)
    assert (job.state, job.attempts, job.result) == (JobState.SUCCEEDED, 2, 2)
    # The first run's write and saved result rolled back with its attempt: run again, once.
    assert calls == {"write": 2}
    assert ledger_tags(ledger) == ["write"]
    assert saved_steps(ledger, job_id) == {"write": 2}


def test_an_atomic_step_that_raises_rolls_back_its_own_writes_and_saves_nothing(
    pgq: PgQueue, ledger: Engine
) -> None:
    @pgq.task(name="caught", pass_context=True, atomic=True, max_attempts=1)
    def caught(ctx: JobContext) -> str:
        def write_then_fail(tag: str) -> None:
            ctx.session.execute(
                text("INSERT INTO ledger (job_id, tag) VALUES (:id, :tag)"),
                {"id": ctx.job_id, "tag": tag},
            )
            raise RuntimeError("half done")

        def write(tag: str) -> str:
            ctx.session.execute(
                text("INSERT INTO ledger (job_id, tag) VALUES (:id, :tag)"),
                {"id": ctx.job_id, "tag": tag},
            )
            return tag

        ctx.session.execute(
            text("INSERT INTO ledger (job_id, tag) VALUES (:id, 'before')"), {"id": ctx.job_id}
        )
        with pytest.raises(RuntimeError, match="half done"):
            ctx.step("flaky", write_then_fail, "flaky")
        # A step whose function raised may run again in the same attempt.
        return str(ctx.step("flaky", write, "flaky-again"))

    with immediate(pgq):
        job_id = caught.enqueue()
    job = pgq.get_job(job_id)
    assert (job.state, job.result) == (JobState.SUCCEEDED, "flaky-again")
    assert ledger_tags(ledger) == ["before", "flaky-again"]
    assert saved_steps(ledger, job_id) == {"flaky": "flaky-again"}


def test_a_step_result_that_is_not_json_fails_the_attempt_and_saves_nothing(
    pgq: PgQueue, settings: Settings
) -> None:
    calls: Counter[str] = Counter()

    def opaque() -> object:
        calls["opaque"] += 1
        return object()

    def huge() -> str:
        calls["huge"] += 1
        return "x" * (settings.max_payload_bytes + 1)

    @pgq.task(name="not_json", pass_context=True, max_attempts=1)
    def not_json(ctx: JobContext, which: str) -> None:
        ctx.step("ok", lambda: "fine")
        ctx.step(which, {"opaque": opaque, "huge": huge}[which])

    with immediate(pgq):
        job_ids = [not_json.enqueue("opaque"), not_json.enqueue("huge")]
    opaque_job, huge_job = (pgq.get_job(job_id) for job_id in job_ids)
    assert (opaque_job.state, huge_job.state) == (JobState.FAILED, JobState.FAILED)
    assert opaque_job.last_error is not None and huge_job.last_error is not None
    assert (
        f"SerializationError: step 'opaque' of job {opaque_job.id} returned a value that "
        "cannot be saved" in opaque_job.last_error
    )
    assert f"PayloadTooLarge: step 'huge' of job {huge_job.id}" in huge_job.last_error
    # The earlier step stays saved; the refused one is not.
    assert [s.name for s in opaque_job.steps] == ["ok"]
    assert [s.name for s in huge_job.steps] == ["ok"]
    assert calls == {"opaque": 1, "huge": 1}


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("", "step name must not be empty"),
        (5, "step name must be a string, got int"),
        ("x" * 201, "is longer than 200 characters"),
        ("a\x00b", "has control characters"),
        ("a\ud800", "lone surrogates"),
    ],
)
def test_a_bad_step_name_is_refused_before_the_step_runs(
    pgq: PgQueue, name: Any, message: str
) -> None:
    errors: list[str] = []
    calls: Counter[str] = Counter()

    def count() -> int:
        calls["count"] += 1
        return 1

    @pgq.task(name="bad_name", pass_context=True, max_attempts=1)
    def bad_name(ctx: JobContext) -> None:
        for call in (lambda: ctx.step(name, count), lambda: ctx.step_key(name)):
            try:
                call()
            except ValidationError as exc:
                errors.append(str(exc))

    with immediate(pgq):
        job_id = bad_name.enqueue()
    assert pgq.get_job(job_id).state is JobState.SUCCEEDED
    assert len(errors) == 2 and all(message in e for e in errors), errors
    assert len(errors[0].splitlines()) == 1
    assert calls == {}
    assert step_count(pgq.engine) == 0


def test_a_step_name_completes_once_per_attempt_and_async_misuse_is_refused(
    pgq: PgQueue,
) -> None:
    errors: list[str] = []
    calls: Counter[str] = Counter()

    def count() -> int:
        calls["count"] += 1
        return calls["count"]

    async def coroutine() -> int:
        calls["coroutine"] += 1
        return 1

    @pgq.task(name="misuse", pass_context=True, max_attempts=1)
    def misuse(ctx: JobContext) -> None:
        assert ctx.step("once", count) == 1
        for name, fn in (("once", count), ("co", coroutine), ("lambda", lambda: coroutine())):
            try:
                ctx.step(name, fn)
            except ValidationError as exc:
                errors.append(str(exc))

    with immediate(pgq):
        job_id = misuse.enqueue()
    assert pgq.get_job(job_id).state is JobState.SUCCEEDED
    assert errors[0] == (
        f"step 'once' of job {job_id} already completed in this attempt: step names must be "
        "unique per job"
    )
    assert "is a coroutine function; use await ctx.astep(...)" in errors[1]
    assert "returned an awaitable; use await ctx.astep(...)" in errors[2]
    assert calls == {"count": 1}  # the coroutines never started
    assert [s.name for s in pgq.get_job(job_id).steps] == ["once"]


def test_a_save_under_a_lost_lease_is_refused_and_saves_nothing(pgq: PgQueue) -> None:
    @pgq.task(name="held")
    def held() -> None: ...

    job_id = held.enqueue()
    with pgq.sessions() as session, session.begin():
        [claimed] = claim_data.claim(
            executor_for(session),
            worker_id="w",
            limit=1,
            queues=None,
            lease_seconds=30,
            task_leases={},
        )
    with pgq.sessions() as session, session.begin():
        steps_data.save(executor_for(session), job_id, claimed.lease_token, "mine", '"kept"')
        with pytest.raises(LeaseLost, match=f"step 'stale' of job {job_id} was not saved"):
            steps_data.save(executor_for(session), job_id, uuid.uuid4(), "stale", '"lost"')
    # The lease's holder saved; after the job ended nobody can, its token included.
    with pgq.engine.begin() as connection:
        connection.execute(
            text("UPDATE pgqueue_jobs SET state = 'succeeded' WHERE id = :id"), {"id": job_id}
        )
    with pgq.sessions() as session, session.begin(), pytest.raises(LeaseLost):
        steps_data.save(executor_for(session), job_id, claimed.lease_token, "late", '"late"')
    assert saved_steps(pgq.engine, job_id) == {"mine": "kept"}


@pytest.fixture
def statements(pgq: PgQueue) -> Iterator[list[str]]:
    """Every statement sent on pgqueue's engine and the handlers' engine."""
    sent: list[str] = []

    def record(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        sent.append(statement)

    engines = (pgq.engine, pgq.handler_engine)
    for engine in engines:
        event.listen(engine, "before_cursor_execute", record)
    yield sent
    for engine in engines:
        event.remove(engine, "before_cursor_execute", record)


def test_jobs_without_steps_touch_no_steps_and_an_attempt_reads_its_steps_once(
    pgq: PgQueue, statements: list[str]
) -> None:
    @pgq.task(name="plain", pass_context=True)
    def plain(ctx: JobContext) -> int:
        return ctx.job_id

    @pgq.task(name="stepped", pass_context=True, max_attempts=2, retry=backoff.constant(0))
    def stepped(ctx: JobContext) -> list[int]:
        values = [ctx.step(f"s{n}", lambda n=n: n) for n in range(3)]
        if ctx.attempt == 1:
            raise RuntimeError("again")
        return values

    with immediate(pgq):
        plain.enqueue()
        plain.configure(queue="other").enqueue()
    assert statements and not [s for s in statements if "pgqueue_job_steps" in s]

    with immediate(pgq):
        job_id = stepped.enqueue()
    assert pgq.get_job(job_id).result == [0, 1, 2]
    about_steps = [s for s in statements if "pgqueue_job_steps" in s]
    reads = [s for s in about_steps if s.lstrip().startswith("SELECT")]
    saves = [s for s in about_steps if s.lstrip().startswith("INSERT")]
    # One read per attempt (two attempts), three saves in the first, none in the second;
    # then get_job's read of the steps.
    assert (len(reads), len(saves)) == (3, 3), about_steps


def test_deleting_pruning_and_bulk_deleting_jobs_deletes_their_steps(
    pgq: PgQueue, engine: Engine
) -> None:
    @pgq.task(name="kept", pass_context=True)
    def kept(ctx: JobContext, n: int) -> None:
        ctx.step("a", lambda: n)
        ctx.step("b", lambda: n)

    with immediate(pgq):
        ids = [kept.enqueue(n) for n in range(5)]
    assert step_count(engine) == 10

    assert pgq.admin.delete_job(ids[0])
    assert saved_steps(engine, ids[0]) == {}

    result = pgq.admin.bulk_delete(JobFilter(task_name="kept", queue="default"))
    assert result.count == 4
    assert step_count(engine) == 0

    with immediate(pgq):
        ids = [kept.enqueue(n) for n in range(3)]
    with engine.begin() as connection:
        connection.execute(text("UPDATE pgqueue_jobs SET finished_at = now() - interval '30 days'"))
    assert pgq.prune() == 3
    assert step_count(engine) == 0
    assert table_counts(engine)["pgqueue_jobs"] == 0


dashboard_pgq = FlaskPgQueue()


@dashboard_pgq.task(name="steps.shown", pass_context=True)
def shown(ctx: JobContext) -> None:
    ctx.step("charge <b>card</b>", lambda: 1)
    ctx.step("email", lambda: 2)


def test_the_dashboard_job_page_lists_the_completed_steps(database_url: URL) -> None:
    with dashboard_app(dashboard_pgq, database_url, "durable_steps") as app:
        with app.app_context():
            pgq = dashboard_pgq.queue
            with immediate(pgq):
                job_id = shown.enqueue()
            [first, second] = pgq.get_job(job_id).steps
        page = app.test_client().get(f"/pgqueue/jobs/{job_id}").text
    section = page.split('id="job-steps"', 1)[1].split("</ol>", 1)[0]
    # Both names in order, each with its time; a name is text, never markup.
    assert re.findall(r'<span class="step-name">(.*?)</span>', section) == [
        "charge &lt;b&gt;card&lt;/b&gt;",
        "email",
    ]
    assert section.count('class="muted"') == 2
    assert first.completed_at <= second.completed_at
