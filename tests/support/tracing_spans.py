"""The test process's OpenTelemetry SDK: one tracer provider for the whole session (the global
provider can be set only once per process) exporting to memory, for the tracing tests; spans
ended in a forked child (a process pool's) are written to the file ``child_spans`` names, as
JSON lines, since the child's memory is its own."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

_exporter: InMemorySpanExporter | None = None
_child_file: Path | None = None


class _ChildSpanFile(SpanExporter):
    """Appends the spans a forked child ends to ``_child_file`` (nothing in the test process)."""

    def __init__(self) -> None:
        self._pid = os.getpid()

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        if os.getpid() != self._pid and _child_file is not None:
            with _child_file.open("a") as file:
                for span in spans:
                    file.write(span.to_json(indent=None) + "\n")
        return SpanExportResult.SUCCESS


@contextmanager
def child_spans(path: Path) -> Iterator[Path]:
    """While the block runs (and in children forked meanwhile), forked children's spans go to
    ``path``."""
    global _child_file
    memory_exporter()
    _child_file = path
    try:
        yield path
    finally:
        _child_file = None


def read_child_spans(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines()]


def memory_exporter() -> InMemorySpanExporter:
    """The session's in-memory exporter (installed on first use), emptied."""
    global _exporter
    if _exporter is None:
        _exporter = InMemorySpanExporter()
        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(_exporter))
        provider.add_span_processor(SimpleSpanProcessor(_ChildSpanFile()))
        trace.set_tracer_provider(provider)
    _exporter.clear()
    return _exporter
