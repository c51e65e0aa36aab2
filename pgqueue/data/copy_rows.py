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
from pgqueue.states import JobState

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
    ids: Sequence[int],
    jobs: Sequence[NewJob],
    parents: Sequence[tuple[int, ...]],
    dependents: Sequence[str | None],
    roles: Sequence[int],
    run_at: str,
    workflow_id: int,
    trace_context: str | None = None,
) -> Iterator[str]:
    """Lines of ``sql.workflow_inserts.COPY_JOB_COLUMNS`` for a workflow's ``jobs`` with their
    ``ids``, all due at ``run_at`` (ISO text): a job with ``parents`` (indexes into ``jobs``)
    waits for them (its ``depends_on`` their ids, as many pending), one without is queued;
    ``dependents`` are array literals (or None), ``roles`` the ``WorkflowRole`` values; with a
    ``trace_context`` (JSON text), that as one more column of every line."""
    text = copy_text
    end = (
        f"\t{workflow_id}\n"
        if trace_context is None
        else f"\t{workflow_id}\t{text(trace_context)}\n"
    )
    waiting, queued = JobState.WAITING.value, JobState.QUEUED.value
    # A line's tail (task, queue, priority, attempts, run_at, atomic, state, role, workflow) is
    # formatted once per distinct tail: a group's members share one.
    tails: dict[tuple[str, str, int, int, bool, bool, int], str] = {}
    for job_id, job, its_parents, its_dependents, role in zip(
        ids, jobs, parents, dependents, roles, strict=True
    ):
        shape = (
            job.task_name,
            job.queue,
            job.priority,
            job.max_attempts,
            job.atomic,
            not its_parents,
            role,
        )
        tail = tails.get(shape)
        if tail is None:
            tail = tails[shape] = (
                f"{text(job.task_name)}\t{text(job.queue)}\t{job.priority}\t{job.max_attempts}"
                f"\t{run_at}\t{'t' if job.atomic else 'f'}\t{waiting if its_parents else queued}"
                f"\t{role}{end}"
            )
        edges = (
            f"{{{','.join([str(ids[i]) for i in its_parents])}}}\t{len(its_parents)}"
            if its_parents
            else _NO_EDGES
        )
        yield (
            f"{job_id}\t{text(job.args_json)}\t{text(job.kwargs_json)}\t{edges}"
            f"\t{its_dependents or _NULL}\t{tail}"
        )


_NULL: Final = "\\N"
# A job with no parents: no ``depends_on``, nothing pending.
_NO_EDGES: Final = "\\N\t\\N"
