"""A large workflow is written with ``COPY``: its rows must be the rows the ``INSERT`` path writes
for the same plan, whatever text its arguments hold and however its jobs differ in task,
options and role."""

from __future__ import annotations

from typing import Any

from sqlalchemy import text
from sqlalchemy.orm import Session
from test_workflows import run_workflow

from pgqueue import PgQueue, chain, chord
from pgqueue.data import workflows
from pgqueue.data.insert_choice import COPY_THRESHOLD
from pgqueue.db import executor_for

# Text COPY's format would read as syntax (backslash, tab, newline, carriage return, \N) or
# that JSON escapes, in arguments, kwargs and a task name.
AWKWARD = ["back\\slash", "tab\there", "new\nline", "cr\rhere", "\\N", 'quote"d', "ünï"]

COLUMNS = (
    "task_name, queue, args::text, kwargs::text, priority, max_attempts, atomic, state,"
    " depends_on, dependents, pending_dependencies, workflow_role, trace_context::text"
)


def _rows(pgq: PgQueue, workflow_id: int, ids: tuple[int, ...]) -> list[tuple[Any, ...]]:
    """The workflow's job rows in insert order, each id and edge as its index among ``ids``
    (two inserts draw different ids)."""
    index = {job_id: i for i, job_id in enumerate(ids)}
    with pgq.engine.connect() as c:
        found = c.execute(
            text(f"SELECT id, {COLUMNS} FROM pgqueue_jobs WHERE workflow_id = :w ORDER BY id"),
            {"w": workflow_id},
        ).all()
    rows = []
    for job_id, *rest in found:
        depends_on, dependents = rest[8], rest[9]
        rest[8] = None if depends_on is None else [index[i] for i in depends_on]
        rest[9] = None if dependents is None else [index[i] for i in dependents]
        rows.append((index[job_id], *rest))
    return rows


def test_a_workflow_written_by_copy_has_the_rows_an_insert_writes(pgq: PgQueue) -> None:
    @pgq.task(name="first")
    def first(*xs: str) -> str:
        return xs[-1]

    @pgq.task(name="odd:name", queue="other", priority=3, max_attempts=9)
    def odd(*xs: str, **kwargs: Any) -> str:
        return xs[-1]

    @pgq.task(name="merge")
    def merge(results: list[str], label: str) -> int:
        return len(results)

    def members() -> list[Any]:
        return [
            first.s(AWKWARD[i % len(AWKWARD)]) if i % 3 else odd.s(str(i), note=AWKWARD[i % 7])
            for i in range(COPY_THRESHOLD + 200)
        ]

    plan_of = chain(first.si("start"), chord(members(), merge.s("tab\tlabel")))
    _, plan = plan_of._planned()
    written: dict[bool, list[tuple[Any, ...]]] = {}
    for may_copy in (True, False):
        with Session(pgq.engine) as session, session.begin():
            inserted = workflows.insert_workflow(executor_for(session), plan, may_copy=may_copy)
        written[may_copy] = _rows(pgq, inserted.id, inserted.job_ids)
        with pgq.engine.connect() as c:
            tickets = c.execute(
                text("SELECT count(*) FROM pgqueue_message_queue WHERE job_id = ANY(:ids)"),
                {"ids": list(inserted.job_ids)},
            ).scalar()
        assert tickets == 1  # the first step only
    assert len(written[True]) == COPY_THRESHOLD + 200 + 3
    assert written[True] == written[False]
    # What the rows say, beyond being equal: the members wait for the first step, the callback
    # for every member, the closing marker for every job.
    by_index = {row[0]: row for row in written[True]}
    assert by_index[1][8:12] == (
        "waiting",
        [0],
        [1 + COPY_THRESHOLD + 200, 2 + COPY_THRESHOLD + 200],
        1,
    )
    assert by_index[2][1:3] == ("first", "default")
    assert by_index[2][3] == '["tab\\there"]'
    assert by_index[1][1:3] == ("odd:name", "other")


def test_a_copied_workflow_runs_with_its_arguments_intact(pgq: PgQueue) -> None:
    @pgq.task(name="echo")
    def echo(x: str) -> str:
        return x

    @pgq.task(name="gather")
    def gather(results: list[str]) -> list[str]:
        return results

    expected = [AWKWARD[i % len(AWKWARD)] + str(i) for i in range(COPY_THRESHOLD)]
    wf = chord([echo.s(x) for x in expected], gather.s()).enqueue()
    status = run_workflow(pgq, wf.id, timeout=120, concurrency=16)
    assert status.state == "succeeded"
    assert status.result == expected
