"""``pgqueue.tracing`` without a database: it is the only module that imports opentelemetry,
asking for tracing without opentelemetry-api fails in one line, stored contexts that are not
a valid W3C context are ignored, and COPY lines carry the context as one escaped column."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

from pgqueue import Settings
from pgqueue.data import copy_rows
from pgqueue.jobs import NewJob
from pgqueue.tracing import INSTALL_HINT, Tracing, tracing_for

PACKAGE = Path(__file__).resolve().parents[2] / "pgqueue"
VALID = '{"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}'


def test_only_the_tracing_module_imports_opentelemetry() -> None:
    importers = set()
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                names = [node.module or ""]
            if any(name.split(".")[0] == "opentelemetry" for name in names):
                importers.add(path.relative_to(PACKAGE.parent).as_posix())
    assert importers == {"pgqueue/tracing.py"}


def test_tracing_is_off_unless_enabled() -> None:
    assert tracing_for(Settings()) is None
    assert isinstance(tracing_for(Settings(tracing=True)), Tracing)
    assert Settings.from_env({"PGQUEUE_TRACING": "1"}).tracing is True


def test_enabling_tracing_without_opentelemetry_names_the_install_command() -> None:
    script = (
        "import sys\n"
        "sys.modules['opentelemetry'] = None\n"  # as if opentelemetry-api were not installed
        "from pgqueue import PgQueue, Settings\n"
        "from pgqueue.errors import ConfigurationError\n"
        "try:\n"
        "    PgQueue('postgresql+psycopg://nobody@localhost/none', settings=Settings(tracing=True))\n"
        "except ConfigurationError as exc:\n"
        "    print(exc)\n"
        "PgQueue('postgresql+psycopg://nobody@localhost/none', settings=Settings())\n"
        "print('off ok')\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=True
    )
    assert done.stdout.splitlines() == [INSTALL_HINT, "off ok"]


@pytest.mark.parametrize(
    "stored",
    [
        None,
        "",
        "not json",
        '"a string"',
        "[1, 2]",
        "null",
        "{}",
        '{"traceparent": 42}',
        '{"traceparent": ["00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"]}',
        '{"traceparent": "00-00000000000000000000000000000000-b7ad6b7169203331-01"}',
        '{"traceparent": "garbage"}',
        "[" * 100_000 + "]" * 100_000,
    ],
)
def test_a_stored_context_that_is_not_a_valid_one_gives_none(stored: str | None) -> None:
    assert Tracing().producer_context(stored) is None


def test_a_valid_stored_context_gives_its_span_context() -> None:
    from opentelemetry import trace

    context = Tracing().producer_context(VALID)
    span_context = trace.get_current_span(context).get_span_context()
    assert (span_context.trace_id, span_context.span_id) == (
        0x0AF7651916CD43DD8448EB211C80319C,
        0xB7AD6B7169203331,
    )
    assert span_context.is_remote


def test_copy_lines_carry_the_trace_context_as_a_last_escaped_column() -> None:
    job = NewJob("t", "q", "[]", "{}", 0, 3, None, None, None, False)
    stamp = "2026-01-01T00:00:00+00:00"
    _, lines = copy_rows.lines([7], [job], None, None, None, stamp)
    [plain] = lines
    columns, lines = copy_rows.lines([7], [job], None, None, None, stamp, '{"a":"b\\\\c"}')
    [traced] = lines
    assert columns[-1] == "trace_context"
    assert plain.endswith(f"\t{stamp}\n")
    assert traced == plain[:-1] + '\t{"a":"b\\\\\\\\c"}\n'
