"""Jobs as COPY text, for the bulk enqueue (``data.enqueue.copy_jobs``); pure.

psycopg's ``write_row`` adapts every value on its own, several times slower than an f-string
per row, so the rows are formatted here. Text columns are escaped (``copy_text``); the others
are ints, one timestamp and booleans, whose text needs no escaping. Lines are joined into
chunks of ``CHUNK_ROWS``: one write per line costs more Python than the line, one write for the
whole batch holds it all in memory twice.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from typing import Final

from pgqueue.jobs import NewJob

CHUNK_ROWS: Final = 5000

_COPY_ESCAPES: Final[dict[int, str]] = {
    ord("\\"): "\\\\",
    ord("\t"): "\\t",
    ord("\n"): "\\n",
    ord("\r"): "\\r",
}


def copy_text(value: str) -> str:
    """``value`` as a field of COPY's text format: backslash, tab, newline and carriage return
    escaped (``\\N`` in a value thus stays text, never NULL). JSON text from ``validation``
    holds no raw control characters, so usually only a backslash needs it, or nothing."""
    if "\\" in value or "\t" in value or "\n" in value or "\r" in value:
        return value.translate(_COPY_ESCAPES)
    return value


def job_lines(
    ids: Sequence[int], jobs: Sequence[NewJob], run_at: str, trace_context: str | None = None
) -> Iterator[str]:
    """Lines of ``sql.enqueue.COPY_JOB_COLUMNS`` for ``jobs`` with their ``ids``, all due at
    ``run_at`` (ISO text); with a ``trace_context`` (JSON text), that as one more column of
    every line (``sql.enqueue.copy_jobs(traced=True)``).

    ``jobs`` share their task, queue, priority, attempts and atomic flag (a copy batch, see
    ``insert_choice.uniform``): those columns are formatted once, and each line adds only its
    id and arguments."""
    text = copy_text
    first = jobs[0]
    middle = f"\t{text(first.task_name)}\t{text(first.queue)}\t"
    end = "\n" if trace_context is None else f"\t{text(trace_context)}\n"
    tail = (
        f"\t{first.priority}\t{first.max_attempts}\t{run_at}\t{'t' if first.atomic else 'f'}{end}"
    )
    for job_id, job in zip(ids, jobs, strict=True):
        yield f"{job_id}{middle}{text(job.args_json)}\t{text(job.kwargs_json)}{tail}"


def chunks(lines: Iterable[str]) -> Iterator[str]:
    """``lines`` joined ``CHUNK_ROWS`` at a time (the last chunk may be shorter, or empty)."""
    rows: list[str] = []
    for line in lines:
        rows.append(line)
        if len(rows) == CHUNK_ROWS:
            yield "".join(rows)
            rows.clear()
    yield "".join(rows)


def workflow_lines(
    columns: Sequence[Sequence[object]], text_columns: frozenset[int], run_at: str
) -> Iterator[str]:
    """Lines of ``sql.workflow_inserts.COPY_JOB_COLUMNS`` for a workflow's jobs given column by column
    (``columns``, run_at left out: every job has ``run_at``, ISO text): None is ``\\N``, the
    columns at ``text_columns`` are escaped, a bool is ``t``/``f``."""
    # Column by column: each value is formatted by one comprehension per column, and each line
    # joined from the formatted columns, with no list per line (a group of 10,000 would
    # otherwise make 10,000 short-lived lists for the garbage collector to walk).
    formatted = [
        _copy_column(values, index in text_columns) for index, values in enumerate(columns)
    ]
    formatted.insert(7, [run_at] * len(columns[0]))
    for fields in zip(*formatted, strict=True):
        yield "\t".join(fields) + "\n"


def _copy_column(values: Sequence[object], escaped: bool) -> list[str]:
    """``values`` as COPY text: None is ``\\N``, a bool ``t``/``f``, text escaped when
    ``escaped``."""
    text = copy_text
    return [
        "\\N"
        if value is None
        else ("t" if value else "f")
        if value is True or value is False
        else text(str(value))
        if escaped
        else str(value)
        for value in values
    ]
