"""OpenTelemetry tracing of enqueues and job runs (the ``otel`` extra); the only module of
pgqueue that imports opentelemetry.

Tracing is on when ``Settings.tracing`` is true (``PGQUEUE_TRACING=1``); asking for it without
opentelemetry-api installed raises one ``ConfigurationError`` naming the install command. Off,
the queue object and the executor hold None instead of a ``Tracing`` and test it once per
enqueue or run: nothing else runs, and no trace context is written.

On, each enqueue call (one job, or one ``enqueue_many`` batch) runs in a PRODUCER span, and
the context of that span, as the global propagator writes it (W3C ``traceparent`` and
``tracestate`` by default), is stored with every job it inserts (``pgqueue_jobs.trace_context``).
A workflow's enqueue (a chain, group or chord) is one such span, "pgqueue enqueue workflow",
carrying the workflow's id: every member's runs are its children.
Each run of a job (an attempt) is a CONSUMER span that is a child of that stored context and
links to it, as the OpenTelemetry messaging conventions allow for single-message processing:
the run appears inside the enqueuing request's trace, and backends that follow links find the
producer too. The run span is current while the handler runs, so the handler's own spans (its
SQLAlchemy queries, its HTTP calls) are its children. A stored context that is missing or
unreadable makes the run a new trace; it never fails the job.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable, Iterator, Sequence
from typing import Any, Final

from pgqueue.config import Settings
from pgqueue.distribution import installed_version
from pgqueue.errors import ConfigurationError, error_line
from pgqueue.jobs import ClaimedJob, NewJob, Outcome
from pgqueue.metrics import CANCELLED, FAILED, RETRIED, SUCCEEDED
from pgqueue.states import OutcomeKind

INSTALL_HINT: Final = 'tracing needs opentelemetry-api: pip install "sqlalchemy-pgqueue[otel]"'

# Attribute names: the OpenTelemetry messaging semantic conventions, then pgqueue's own.
SYSTEM: Final = "messaging.system"
DESTINATION: Final = "messaging.destination.name"
OPERATION_TYPE: Final = "messaging.operation.type"
OPERATION_NAME: Final = "messaging.operation.name"
MESSAGE_ID: Final = "messaging.message.id"
BATCH_COUNT: Final = "messaging.batch.message_count"
TASK: Final = "pgqueue.task"
ATTEMPT: Final = "pgqueue.job.attempt"
MAX_ATTEMPTS: Final = "pgqueue.job.max_attempts"
OUTCOME: Final = "pgqueue.job.outcome"
WORKFLOW_ID: Final = "pgqueue.workflow.id"

SYSTEM_NAME: Final = "pgqueue"
TIMED_OUT: Final = "timed_out"
# The ``pgqueue.job.outcome`` of each kind of outcome (the metrics' outcome labels).
OUTCOME_LABELS: Final = {
    OutcomeKind.COMPLETE: SUCCEEDED,
    OutcomeKind.RETRY: RETRIED,
    OutcomeKind.FAIL: FAILED,
    OutcomeKind.CANCELLED: CANCELLED,
    OutcomeKind.RELEASE: "released",
    OutcomeKind.SNOOZE: "snoozed",
    OutcomeKind.SUSPEND: "suspended",
}
# Attempts that failed: their span's status is ERROR. A cancelled attempt did what an operator
# asked; its outcome attribute says so.
_FAILED_KINDS: Final = frozenset((OutcomeKind.RETRY, OutcomeKind.FAIL))


def tracing_for(settings: Settings) -> Tracing | None:
    """The ``Tracing`` for ``settings``, or None when tracing is off."""
    return Tracing() if settings.tracing else None


class EnqueueSpan:
    """An enqueue's span: the context its jobs store, and where their ids are recorded."""

    def __init__(self, span: Any, trace_context: str | None) -> None:
        self._span = span
        self.trace_context = trace_context

    def inserted(self, ids: list[int]) -> list[int]:
        """Record the inserted ids (a single job's id on the span); returns ``ids``."""
        if len(ids) == 1:
            self._span.set_attribute(MESSAGE_ID, str(ids[0]))
        return ids

    def workflow_inserted(self, workflow_id: int) -> None:
        """Record the id of the workflow the span's jobs belong to."""
        self._span.set_attribute(WORKFLOW_ID, str(workflow_id))


class Tracing:
    """Starts pgqueue's spans on the tracer of the global tracer provider (looked up through
    a proxy: a provider the application installs later is still used)."""

    def __init__(self) -> None:
        try:
            from opentelemetry import context, propagate, trace
        except ImportError:
            raise ConfigurationError(INSTALL_HINT) from None
        self._context = context
        self._propagate = propagate
        self._trace = trace
        self._tracer = trace.get_tracer("pgqueue", installed_version())

    def enqueue(
        self, jobs: Sequence[NewJob], insert: Callable[[str | None], list[int]]
    ) -> list[int]:
        """``insert(trace_context)`` inside a PRODUCER span for ``jobs`` (one enqueue call);
        ``trace_context`` is that span's context as JSON text, or None when the propagator
        wrote nothing (no tracer provider installed)."""
        with self.enqueue_span(jobs) as span:
            return span.inserted(insert(span.trace_context))

    @contextlib.contextmanager
    def enqueue_span(
        self, jobs: Sequence[NewJob], *, workflow: bool = False
    ) -> Iterator[EnqueueSpan]:
        """The PRODUCER span of one enqueue call, current inside the block (``enqueue``, and
        the asyncio enqueue, which awaits its insert inside it). ``workflow``: the jobs are one
        workflow's (a chain, group or chord), named so and counted even when one."""
        first = jobs[0]
        task = first.task_name
        queue = first.queue
        if len(jobs) > 1:
            # ``enqueue_many`` batches are one task and queue; ``insert_jobs`` takes any.
            task = task if all(job.task_name == task for job in jobs) else ""
            queue = queue if all(job.queue == queue for job in jobs) else ""
        attributes: dict[str, Any] = {
            SYSTEM: SYSTEM_NAME,
            OPERATION_TYPE: "send",
            OPERATION_NAME: "enqueue",
        }
        if queue:
            attributes[DESTINATION] = queue
        if task:
            attributes[TASK] = task
        if len(jobs) > 1 or workflow:
            attributes[BATCH_COUNT] = len(jobs)
        if workflow:
            name = "pgqueue enqueue workflow"
        else:
            name = f"pgqueue enqueue {task}" if task else "pgqueue enqueue"
        with self._tracer.start_as_current_span(
            name, kind=self._trace.SpanKind.PRODUCER, attributes=attributes
        ) as span:
            carrier: dict[str, str] = {}
            self._propagate.inject(carrier)
            yield EnqueueSpan(span, json.dumps(carrier, separators=(",", ":")) if carrier else None)

    @contextlib.contextmanager
    def run(self, job: ClaimedJob) -> Iterator[RunSpan]:
        """A CONSUMER span around one attempt of ``job``, current inside the block: a child of
        the job's stored trace context and linked to it, or a new trace when it has none."""
        attributes: dict[str, Any] = {
            SYSTEM: SYSTEM_NAME,
            OPERATION_TYPE: "process",
            OPERATION_NAME: "run",
            DESTINATION: job.queue,
            MESSAGE_ID: str(job.id),
            TASK: job.task_name,
            ATTEMPT: job.attempt,
            MAX_ATTEMPTS: job.max_attempts,
        }
        parent = self._context.Context()  # never the pool thread's own current span
        links = None
        producer = self.producer_context(job.trace_context)
        if producer is not None:
            parent = producer
            links = [self._trace.Link(self._trace.get_current_span(producer).get_span_context())]
        with self._tracer.start_as_current_span(
            f"pgqueue run {job.task_name}",
            context=parent,
            kind=self._trace.SpanKind.CONSUMER,
            links=links,
            attributes=attributes,
        ) as span:
            yield RunSpan(span, self._trace.StatusCode.ERROR)

    def producer_context(self, stored: str | None) -> Any:
        """The OpenTelemetry context of a job's stored ``trace_context`` (JSON text), or None
        when there is none or it is not an object of strings holding a valid span context:
        the column may have been written by other clients, or by hand."""
        if stored is None:
            return None
        try:
            carrier = json.loads(stored)
        except (ValueError, RecursionError):
            return None
        if not isinstance(carrier, dict):
            return None
        carrier = {k: v for k, v in carrier.items() if isinstance(v, str)}
        try:
            extracted = self._propagate.extract(carrier, context=self._context.Context())
        except Exception:  # the application's propagator, given foreign input: never fatal
            return None
        if not self._trace.get_current_span(extracted).get_span_context().is_valid:
            return None
        return extracted


class RunSpan:
    """The span of one attempt while it runs: the executor reports the handler's exception
    (``failed``) and the attempt's outcome (``finish``)."""

    __slots__ = ("_error", "_error_status", "_span")

    def __init__(self, span: Any, error_status: Any) -> None:
        self._span = span
        self._error_status = error_status
        self._error: str | None = None

    def failed(self, exc: BaseException) -> None:
        """The handler (or the write of its result) raised ``exc``: an exception event."""
        self._span.record_exception(exc)
        self._error = error_line(exc)

    def finish(self, outcome: Outcome, *, timed_out: bool = False) -> Outcome:
        """Record the attempt's outcome (``timed_out``: the worker gave up on the handler
        before it returned, and wrote a timeout instead of ``outcome``); returns ``outcome``."""
        span = self._span
        if timed_out:
            span.set_attribute(OUTCOME, TIMED_OUT)
            span.set_status(self._error_status, "the handler ran past its task's timeout")
            return outcome
        span.set_attribute(OUTCOME, OUTCOME_LABELS[outcome.kind])
        if outcome.kind in _FAILED_KINDS:
            description = self._error
            if description is None:
                lines = outcome.error.strip().splitlines()
                description = lines[0] if lines else str(outcome.kind)
            span.set_status(self._error_status, description)
        return outcome
