"""A plan's rows as COPY text, the one format of the writer's ``COPY``
(``data.enqueue.copy_jobs``); pure.

psycopg's ``write_row`` adapts every value on its own, several times slower than an f-string
per row, so the rows are formatted here. Text columns are escaped (``copy_text``); the others
are ints, id arrays, one timestamp and booleans, whose text needs no escaping. Lines are joined into
chunks of ``CHUNK_ROWS``: one write per line costs more Python than the line, one write for the
whole batch holds it all in memory twice.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from operator import attrgetter
from typing import Any, Final

from pgqueue.jobs import NEW_JOB_COLUMNS, NewJob

CHUNK_ROWS: Final = 5000

_COPY_ESCAPES: Final[dict[int, str]] = {
    ord("\\"): "\\\\",
    ord("\t"): "\\t",
    ord("\n"): "\\n",
    ord("\r"): "\\r",
}


def copy_text(value: str) -> str:
    """``value`` as a field of COPY's text format: backslash, tab, newline and carriage return
    escaped (``\\N`` in a value thus stays text, never NULL). JSON text from ``codec``
    holds no raw control characters, so usually only a backslash needs it, or nothing."""
    if "\\" in value or "\t" in value or "\n" in value or "\r" in value:
        return value.translate(_COPY_ESCAPES)
    return value


def chunks(lines: Iterable[str]) -> Iterator[str]:
    """``lines`` joined ``CHUNK_ROWS`` at a time (the last chunk may be shorter, or empty)."""
    rows: list[str] = []
    for line in lines:
        rows.append(line)
        if len(rows) == CHUNK_ROWS:
            yield "".join(rows)
            rows.clear()
    yield "".join(rows)


def lines(
    ids: Sequence[int],
    jobs: Sequence[NewJob],
    edges: Mapping[str, Sequence[Any]] | None,
    roles: Sequence[int] | None,
    workflow_id: int | None,
    run_at: str,
    trace_context: str | None = None,
) -> tuple[tuple[str, ...], Iterator[str]]:
    """The columns and the lines of a plan's rows with their ``ids``, all due at ``run_at``
    (ISO text): ``edges`` (``data.enqueue._edges``: states, ``depends_on`` and ``dependents``
    array literals, countdowns) when the plan has parents; with ``roles``, those and the
    ``workflow_id``; with a ``trace_context`` (JSON text), that on every line.

    The columns that differ from job to job come first; the rest of a line is a tail that the
    plan's jobs mostly share (a batch's all of them, a group's members theirs), formatted once
    per distinct tail."""
    head: tuple[str, ...] = ("id", "args", "kwargs")
    if edges is not None:
        head += ("depends_on", "pending_dependencies", "dependents")
    fields = [column for column in NEW_JOB_COLUMNS if column not in head]
    columns = (*head, *fields, "run_at")
    end = f"\t{run_at}"
    if edges is not None:
        columns += ("state",)
    if roles is not None:
        columns += ("workflow_role", "workflow_id")
    after = f"\t{workflow_id}" if roles is not None else ""
    if trace_context is not None:
        columns += ("trace_context",)
        after += f"\t{copy_text(trace_context)}"
    shape_of = attrgetter(*(NEW_JOB_COLUMNS[column] for column in fields))
    text = copy_text
    tails: dict[Any, str] = {}
    if edges is None:
        plain = (
            f"{job_id}\t{text(job.args_json)}\t{text(job.kwargs_json)}\t"
            f"{tails.get(shape) or tails.setdefault(shape, _tail(shape, None, None, end, after))}\n"
            for job_id, job in zip(ids, jobs, strict=True)
            for shape in (shape_of(job),)
        )
        return columns, plain
    nothing: list[Any] = [None] * len(ids)
    rows = zip(
        ids,
        jobs,
        edges["depends_on"],
        edges.get("pending_dependencies") or nothing,
        edges["dependents"],
        edges["state"],
        nothing if roles is None else roles,
        strict=True,
    )
    with_edges = (
        f"{job_id}\t{text(job.args_json)}\t{text(job.kwargs_json)}\t{_field(depends_on)}"
        f"\t{_field(pending)}\t{_field(dependents)}\t"
        f"{tails.get(key) or tails.setdefault(key, _tail(*key, end, after))}\n"
        for job_id, job, depends_on, pending, dependents, state, role in rows
        for key in ((shape_of(job), state, role),)
    )
    return columns, with_edges


def _tail(shape: tuple[Any, ...], state: Any, role: Any, end: str, after: str) -> str:
    """A line's tail: the job's ``shape`` (its fields after the head), ``end`` (its run_at),
    its state and role when the plan writes them, and ``after`` (workflow and trace)."""
    text = "\t".join(map(_field, shape)) + end
    if state is not None:
        text += f"\t{state}"
    if role is not None:
        text += f"\t{role}"
    return text + after


def _field(value: Any) -> str:
    """``value`` as a field of COPY's text format (None as NULL)."""
    if value is None:
        return _NULL
    if isinstance(value, bool):
        return "t" if value else "f"
    if isinstance(value, str):
        return copy_text(value)
    return str(value)


_NULL: Final = "\\N"
