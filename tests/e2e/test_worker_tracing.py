"""Tracing across processes: jobs enqueued in this process (SDK exporting to memory) run in a
real ``pgqueue worker`` process whose application module exports its spans as JSON lines to a
file. The run spans join the enqueuing trace, carry the job's attributes, record a failure as
ERROR with its exception, and a job whose stored trace context is nonsense still runs."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from sqlalchemy import text
from sqlalchemy.engine import URL
from support.processes import run_pgqueue
from support.tracing_spans import memory_exporter

from pgqueue import PgQueue, Settings

WORKER_APP = '''
"""A traced application: its spans go to $SPANS_PATH, one JSON object per line."""

import os

from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import ConsoleSpanExporter, SimpleSpanProcessor

from pgqueue import PgQueue, Retry, Settings, backoff

provider = TracerProvider()
provider.add_span_processor(
    SimpleSpanProcessor(
        ConsoleSpanExporter(
            out=open(os.environ["SPANS_PATH"], "a"),
            formatter=lambda span: span.to_json(indent=None) + "\\n",
        )
    )
)
trace.set_tracer_provider(provider)
tracer = trace.get_tracer("traceapp")

pgq = PgQueue(os.environ["DB_URL"], settings=Settings.from_env())


@pgq.task(name="greet", queue="mail")
def greet(name):
    with tracer.start_as_current_span("compose greeting"):
        return f"hello {name}"


@pgq.task(name="explode", max_attempts=2, retry=backoff.constant(0))
def explode():
    raise ValueError("exploded on purpose")


@pgq.task(name="again", max_attempts=3)
def again():
    raise Retry(delay=0, reason="not yet")
'''

TASKS = ("greet", "explode", "again")


@pytest.fixture
def spans() -> InMemorySpanExporter:
    return memory_exporter()


@pytest.fixture
def producer(database_url: URL) -> Iterator[PgQueue]:
    """The enqueuing side: this process, tracing on, the worker app's task names."""
    pgq = PgQueue(
        database_url.render_as_string(hide_password=False), settings=Settings(tracing=True)
    )
    for name in TASKS:
        pgq.task(name=name, queue="mail" if name == "greet" else "default")(lambda *a: None)
    yield pgq
    pgq.dispose()


def run_worker(tmp_path: Path, url: URL, tracing: bool = True) -> list[dict[str, Any]]:
    """``pgqueue worker --drain`` with the traced app; the spans it exported."""
    (tmp_path / "traceapp.py").write_text(WORKER_APP)
    spans_path = tmp_path / "spans.jsonl"
    env = {
        "DB_URL": url.render_as_string(hide_password=False),
        "SPANS_PATH": str(spans_path),
        "PGQUEUE_TRACING": "1" if tracing else "0",
        "PATH": "/usr/bin:/bin",
    }
    done = run_pgqueue(
        "worker", "traceapp:pgq", "--drain", "-c", "2", env=env, cwd=tmp_path, process=True
    )
    assert done.returncode == 0, done.stdout + done.stderr
    if not spans_path.exists():
        return []
    return [json.loads(line) for line in spans_path.read_text().splitlines() if line]


def hex_id(value: int, width: int) -> str:
    return f"0x{value:0{width}x}"


def job_states(pgq: PgQueue) -> dict[int, str]:
    with pgq.engine.connect() as connection:
        return dict(connection.execute(text("SELECT id, state FROM pgqueue_jobs")).all())


def runs_of(exported: list[dict[str, Any]], task: str) -> list[dict[str, Any]]:
    runs = [span for span in exported if span["name"] == f"pgqueue run {task}"]
    return sorted(runs, key=lambda span: span["attributes"]["pgqueue.job.attempt"])


def test_worker_runs_join_the_enqueuing_trace_with_their_attributes(
    producer: PgQueue, spans: InMemorySpanExporter, tmp_path: Path, database_url: URL
) -> None:
    greet = producer.registry.get("greet")
    with trace.get_tracer("tests").start_as_current_span("checkout request") as request:
        job_id = greet.enqueue("ada")
    [enqueue_span] = [s for s in spans.get_finished_spans() if s.name == "pgqueue enqueue greet"]
    exported = run_worker(tmp_path, database_url)
    assert job_states(producer) == {job_id: "succeeded"}

    [run] = runs_of(exported, "greet")
    trace_id = hex_id(request.get_span_context().trace_id, 32)
    producer_span_id = hex_id(enqueue_span.context.span_id, 16)
    assert run["kind"] == "SpanKind.CONSUMER"
    assert run["context"]["trace_id"] == trace_id
    assert run["parent_id"] == producer_span_id
    assert [link["context"]["span_id"] for link in run["links"]] == [producer_span_id]
    assert run["attributes"] == {
        "messaging.system": "pgqueue",
        "messaging.operation.type": "process",
        "messaging.operation.name": "run",
        "messaging.destination.name": "mail",
        "messaging.message.id": str(job_id),
        "pgqueue.task": "greet",
        "pgqueue.job.attempt": 1,
        "pgqueue.job.max_attempts": 3,
        "pgqueue.job.outcome": "succeeded",
    }
    assert run["status"]["status_code"] == "UNSET"
    # The handler's own span is a child of the run, in the same trace.
    [inner] = [span for span in exported if span["name"] == "compose greeting"]
    assert inner["parent_id"] == run["context"]["span_id"]
    assert inner["context"]["trace_id"] == trace_id


def test_failed_attempts_are_errors_with_their_exception(
    producer: PgQueue, spans: InMemorySpanExporter, tmp_path: Path, database_url: URL
) -> None:
    explode_id = producer.registry.get("explode").configure(max_attempts=2).enqueue()
    again_id = producer.registry.get("again").configure(max_attempts=2).enqueue()
    exported = run_worker(tmp_path, database_url)
    assert job_states(producer) == {explode_id: "failed", again_id: "failed"}

    first, last = runs_of(exported, "explode")
    assert [
        first["attributes"]["pgqueue.job.outcome"],
        last["attributes"]["pgqueue.job.outcome"],
    ] == [
        "retried",
        "failed",
    ]
    for run in (first, last):
        assert run["status"] == {
            "status_code": "ERROR",
            "description": "ValueError: exploded on purpose",
        }
        [exception] = [event for event in run["events"] if event["name"] == "exception"]
        assert exception["attributes"]["exception.type"] == "ValueError"
        assert exception["attributes"]["exception.message"] == "exploded on purpose"
        assert "raise ValueError" in exception["attributes"]["exception.stacktrace"]
    # Both attempts belong to the one trace of the enqueue (which had no parent here).
    [enqueue_span] = [s for s in spans.get_finished_spans() if s.name == "pgqueue enqueue explode"]
    assert {run["context"]["trace_id"] for run in (first, last)} == {
        hex_id(enqueue_span.context.trace_id, 32)
    }
    retried = runs_of(exported, "again")
    assert [run["attributes"]["pgqueue.job.outcome"] for run in retried] == ["retried", "failed"]
    assert retried[0]["status"]["description"] == "Retry: retry requested: not yet"


def test_a_job_with_a_nonsense_trace_context_runs_as_a_new_trace(
    producer: PgQueue, tmp_path: Path, database_url: URL
) -> None:
    greet = producer.registry.get("greet")
    nonsense = [
        '"just a string"',
        "[1, 2, 3]",
        '{"traceparent": 42}',
        '{"traceparent": "00-not-a-trace-01"}',
        '{"traceparent": ["00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"]}',
        "null",
        "{}",
    ]
    ids = [greet.enqueue(f"row {n}") for n in range(len(nonsense))]
    with producer.engine.begin() as connection:
        for job_id, value in zip(ids, nonsense, strict=True):
            connection.execute(
                text("UPDATE pgqueue_jobs SET trace_context = CAST(:value AS json) WHERE id = :id"),
                {"value": value, "id": job_id},
            )
    exported = run_worker(tmp_path, database_url)
    assert job_states(producer) == dict.fromkeys(ids, "succeeded")
    runs = runs_of(exported, "greet")
    assert sorted(int(run["attributes"]["messaging.message.id"]) for run in runs) == ids
    for run in runs:
        assert run["parent_id"] is None
        assert run["links"] == []
        assert run["attributes"]["pgqueue.job.outcome"] == "succeeded"
