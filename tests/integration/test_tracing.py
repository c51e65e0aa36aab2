"""Tracing of enqueues (real PostgreSQL, the OpenTelemetry SDK exporting to memory): every
insert path stores the enqueue span's context with its jobs, COPY included; tracing off writes
none and starts no span; in-process runs of atomic and async handlers are children of it, and
cancelled and timed-out runs say so."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode
from sqlalchemy import event, text
from sqlalchemy.engine import URL
from sqlalchemy.ext.asyncio import AsyncSession, create_async_engine
from sqlalchemy.orm import Session
from support.polling import wait_until
from support.tracing_spans import memory_exporter
from support.workers import in_thread

from pgqueue import JobContext, JobState, PgQueue, Settings, chain, chord, core, group
from pgqueue.data import enqueue as enqueue_data
from pgqueue.testing import wait_for_states
from pgqueue.worker import Worker

tracer = trace.get_tracer("tests.tracing")


@pytest.fixture
def spans() -> InMemorySpanExporter:
    return memory_exporter()


@pytest.fixture
def traced(database_url: URL, settings: Settings) -> Iterator[PgQueue]:
    queue = PgQueue(
        database_url.render_as_string(hide_password=False), settings=settings.replace(tracing=True)
    )
    yield queue
    queue.dispose()


def traceparent(span: ReadableSpan) -> str:
    context = span.get_span_context()
    assert context is not None
    return f"00-{context.trace_id:032x}-{context.span_id:016x}-{int(context.trace_flags):02x}"


def stored_contexts(pgq: PgQueue, ids: list[int]) -> list[Any]:
    with pgq.engine.connect() as connection:
        rows = connection.execute(
            text("SELECT trace_context FROM pgqueue_jobs WHERE id = ANY(:ids) ORDER BY id"),
            {"ids": ids},
        )
        return [row[0] for row in rows]


def named(spans: InMemorySpanExporter, name: str) -> list[ReadableSpan]:
    return [span for span in spans.get_finished_spans() if span.name == name]


def one_job(pgq: PgQueue, task: Any) -> list[int]:
    return [task.enqueue(1)]


def one_job_through_sqlalchemy(pgq: PgQueue, task: Any) -> list[int]:
    # A statement listener sends pgqueue's units of work through SQLAlchemy, not the driver.
    event.listen(pgq.engine, "before_cursor_execute", lambda *args: None)
    assert not pgq.database.uses_driver
    return [task.enqueue(1)]


def in_caller_session(pgq: PgQueue, task: Any) -> list[int]:
    with Session(pgq.engine) as session, session.begin():
        return [task.configure(session=session).enqueue(1)]


def small_batch(pgq: PgQueue, task: Any) -> list[int]:
    return task.enqueue_many([[1], [2], [3]])


def unique_key(pgq: PgQueue, task: Any) -> list[int]:
    return [task.configure(unique_key="only-one").enqueue(1)]


def with_dependency(pgq: PgQueue, task: Any) -> list[int]:
    first = task.configure(delay=3600).enqueue(0)
    return [task.configure(depends_on=[first]).enqueue(1)]


def asyncio_one_job(pgq: PgQueue, task: Any) -> list[int]:
    async def main() -> list[int]:
        try:
            return [await task.aenqueue(1)]
        finally:
            await pgq.adispose()

    return asyncio.run(main())


def asyncio_in_caller_session(pgq: PgQueue, task: Any) -> list[int]:
    async def main() -> list[int]:
        engine = create_async_engine(pgq.url)
        try:
            async with AsyncSession(engine) as session, session.begin():
                return await task.configure(session=session).aenqueue_many([[1], [2]])
        finally:
            await engine.dispose()
            await pgq.adispose()

    return asyncio.run(main())


@pytest.mark.parametrize(
    "enqueue",
    [
        one_job,
        one_job_through_sqlalchemy,
        in_caller_session,
        small_batch,
        unique_key,
        with_dependency,
        asyncio_one_job,
        asyncio_in_caller_session,
    ],
)
def test_each_insert_path_stores_the_enqueue_spans_context(
    traced: PgQueue, spans: InMemorySpanExporter, enqueue: Callable[[PgQueue, Any], list[int]]
) -> None:
    @traced.task(name="greet", queue="mail")
    def greet(n: int) -> None:
        pass

    with tracer.start_as_current_span("request") as request:
        ids = enqueue(traced, greet)
    enqueue_span = named(spans, "pgqueue enqueue greet")[-1]  # the call that returned ``ids``
    assert enqueue_span.parent is not None
    assert enqueue_span.parent.span_id == request.get_span_context().span_id
    assert enqueue_span.kind is trace.SpanKind.PRODUCER
    attributes = dict(enqueue_span.attributes or {})
    assert attributes["messaging.system"] == "pgqueue"
    assert attributes["messaging.destination.name"] == "mail"
    assert attributes["messaging.operation.type"] == "send"
    assert attributes["pgqueue.task"] == "greet"
    if len(ids) == 1:
        assert attributes["messaging.message.id"] == str(ids[0])
    else:
        assert attributes["messaging.batch.message_count"] == len(ids)
    assert stored_contexts(traced, ids) == [{"traceparent": traceparent(enqueue_span)}] * len(ids)


def test_a_copy_batch_stores_the_context_on_every_job(
    traced: PgQueue, spans: InMemorySpanExporter, monkeypatch: pytest.MonkeyPatch
) -> None:
    copies: list[int] = []
    real_copy = enqueue_data.copy_jobs

    def copy_jobs(*args: Any) -> None:
        copies.append(len(args[2]))
        real_copy(*args)

    monkeypatch.setattr(enqueue_data, "copy_jobs", copy_jobs)

    @traced.task(name="bulk")
    def bulk(n: int) -> None:
        pass

    count = core.COPY_THRESHOLD
    with tracer.start_as_current_span("import"):
        ids = bulk.enqueue_many([[n] for n in range(count)])
    assert copies == [count]  # the COPY path ran
    [batch_span] = named(spans, "pgqueue enqueue bulk")
    assert dict(batch_span.attributes or {})["messaging.batch.message_count"] == count
    assert stored_contexts(traced, ids) == [{"traceparent": traceparent(batch_span)}] * count


def test_tracing_off_stores_no_context_and_starts_no_span(
    pgq: PgQueue, traced: PgQueue, spans: InMemorySpanExporter
) -> None:
    assert pgq.tracing is None and not pgq.settings.tracing

    def noop(n: int) -> None:
        pass

    plain = pgq.task(name="noop")(noop)
    traced_task = traced.task(name="noop")(noop)
    with tracer.start_as_current_span("request"):
        plain_ids = [
            plain.enqueue(1),
            *plain.enqueue_many([[n] for n in range(core.COPY_THRESHOLD)]),
        ]
        traced_id = traced_task.enqueue(2)
    assert set(stored_contexts(pgq, plain_ids)) == {None}
    assert stored_contexts(pgq, [traced_id]) != [None]  # the same database, tracing on
    Worker(pgq, concurrency=2).run(drain=True)
    names = [span.name for span in spans.get_finished_spans()]
    assert names == ["pgqueue enqueue noop", "request"]  # the traced queue's only


def test_atomic_and_async_runs_are_children_of_the_enqueue_span_and_parents_of_handler_spans(
    traced: PgQueue, spans: InMemorySpanExporter
) -> None:
    @traced.task(name="atomic_step", atomic=True)
    def atomic_step() -> None:
        with tracer.start_as_current_span("atomic inner"):
            pass

    @traced.task(name="async_step")
    async def async_step() -> None:
        with tracer.start_as_current_span("async inner"):
            await asyncio.sleep(0)

    with tracer.start_as_current_span("request"):
        atomic_step.enqueue()
        async_step.enqueue()
    stats = Worker(traced, concurrency=2).run(drain=True)
    assert stats.succeeded == 2
    for task in ("atomic_step", "async_step"):
        [producer] = named(spans, f"pgqueue enqueue {task}")
        [run] = named(spans, f"pgqueue run {task}")
        [inner] = named(spans, f"{task.split('_')[0]} inner")
        assert run.kind is trace.SpanKind.CONSUMER
        assert run.parent is not None and run.parent.span_id == producer.context.span_id
        assert [link.context.span_id for link in run.links] == [producer.context.span_id]
        assert inner.parent is not None and inner.parent.span_id == run.context.span_id
        assert inner.context.trace_id == producer.context.trace_id
        assert dict(run.attributes or {})["pgqueue.job.outcome"] == "succeeded"


def test_cancelled_and_timed_out_runs_say_so(traced: PgQueue, spans: InMemorySpanExporter) -> None:
    @traced.task(name="stoppable", pass_context=True, max_attempts=5)
    def stoppable(ctx: JobContext) -> None:
        deadline = time.monotonic() + 30
        while not ctx.cancel_requested and time.monotonic() < deadline:
            time.sleep(0.02)

    @traced.task(name="overrun", max_attempts=1, timeout=0.3)
    def overrun() -> None:
        time.sleep(1.0)

    cancelled_id = stoppable.enqueue()
    overrun_id = overrun.enqueue()
    with in_thread(Worker(traced, concurrency=2, lease_seconds=1.5)):
        wait_for_states(traced, [cancelled_id], {JobState.RUNNING}, timeout=30)
        traced.cancel_job(cancelled_id)
        wait_for_states(traced, [cancelled_id], {JobState.CANCELLED}, timeout=30)
        wait_for_states(traced, [overrun_id], {JobState.FAILED}, timeout=30)
        # The overrun's span ends when its handler returns.
        wait_until(lambda: named(spans, "pgqueue run overrun"), 30, "the overrun's span")
    [cancelled] = named(spans, "pgqueue run stoppable")
    assert dict(cancelled.attributes or {})["pgqueue.job.outcome"] == "cancelled"
    assert cancelled.status.status_code is StatusCode.UNSET
    [timed_out] = named(spans, "pgqueue run overrun")
    assert dict(timed_out.attributes or {})["pgqueue.job.outcome"] == "timed_out"
    assert timed_out.status.status_code is StatusCode.ERROR


def _workflow_in_own_transaction(pgq: PgQueue, add: Any, total: Any) -> Any:
    return chord([add.s(n, n) for n in range(3)], total.s()).enqueue()


def _workflow_by_copy(pgq: PgQueue, add: Any, total: Any) -> Any:
    return chord([add.s(n, n) for n in range(core.COPY_THRESHOLD)], total.s()).enqueue()


def _workflow_in_caller_session(pgq: PgQueue, add: Any, total: Any) -> Any:
    with Session(pgq.engine) as session, session.begin():
        return chain(add.s(1, 1), total.s()).configure(session=session).enqueue()


def _workflow_asyncio(pgq: PgQueue, add: Any, total: Any) -> Any:
    async def main() -> Any:
        try:
            return await group(add.s(1, 1), add.s(2, 2)).aenqueue()
        finally:
            await pgq.adispose()

    return asyncio.run(main())


@pytest.mark.parametrize(
    "enqueue",
    [
        _workflow_in_own_transaction,
        _workflow_by_copy,
        _workflow_in_caller_session,
        _workflow_asyncio,
    ],
)
def test_a_workflow_enqueue_is_one_span_whose_context_every_member_stores(
    traced: PgQueue, spans: InMemorySpanExporter, enqueue: Callable[..., Any]
) -> None:
    @traced.task(name="add")
    def add(a: int, b: int) -> int:
        return a + b

    @traced.task(name="total")
    def total(values: Any) -> int:
        return sum(values) if isinstance(values, list) else int(values)

    with tracer.start_as_current_span("request") as request:
        workflow = enqueue(traced, add, total)
    [producer] = named(spans, "pgqueue enqueue workflow")
    assert producer.parent is not None
    assert producer.parent.span_id == request.get_span_context().span_id
    assert producer.kind is trace.SpanKind.PRODUCER
    attributes = dict(producer.attributes or {})
    assert attributes["pgqueue.workflow.id"] == str(workflow.id)
    assert attributes["messaging.batch.message_count"] == len(workflow.job_ids)
    ids = list(workflow.job_ids)
    expected = {"traceparent": traceparent(producer)}
    assert stored_contexts(traced, ids) == [expected] * len(ids)
    if len(ids) > 10:
        return  # the COPY case: the stored contexts are what this test is for
    Worker(traced, concurrency=2).run(drain=True)
    runs = [span for span in spans.get_finished_spans() if span.name.startswith("pgqueue run")]
    assert len(runs) == len(ids)
    for run in runs:
        assert run.parent is not None and run.parent.span_id == producer.context.span_id
