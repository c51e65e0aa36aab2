"""Jobs that depend on others (``depends_on``): when such a job may run, and settling it.

The rule: a job runs once every dependency SUCCEEDED; a dependency that FAILED or was
CANCELLED cancels it (and, transitively, what waits on it) with the reason; until then it
WAITS with no ticket. ``initial_state`` applies the rule when the job is enqueued;
``settle`` applies it after its dependencies end, through ``sql.dependencies.settle_dependents``
(the same rule in SQL, idempotent under concurrent runs). A deleted dependency can never
succeed: ``abandon_orphans`` cancels what waited on it, in the delete's transaction.

Workflow jobs count their unfinished dependencies down (``sql.dependencies.count_down``):
``settle`` is given one entry per ended edge, so a dependent named twice had two of its
dependencies end, and a workflow's closing marker and ``on_failure`` job are settled by their
own statements (``sql.workflows``) when their count reaches 0.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from typing import Any

from pgqueue.db import Executor
from pgqueue.sql import dependencies as dependency_sql
from pgqueue.sql import workflows as workflow_sql
from pgqueue.states import JobState, WorkflowRole

_ENDED_BADLY = (JobState.FAILED, JobState.CANCELLED)


def initial_state(dependency_states: Mapping[int, JobState]) -> tuple[JobState, str | None]:
    """The state a new job enters given its dependencies' states (by id), and the reason when
    it is cancelled: the first dependency (in the given order) that ended badly names it."""
    for dependency, state in dependency_states.items():
        if state in _ENDED_BADLY:
            return JobState.CANCELLED, f"dependency {dependency} ended {state.value}; not run"
    if all(state is JobState.SUCCEEDED for state in dependency_states.values()):
        return JobState.QUEUED, None
    return JobState.WAITING, None


def array_text(ids: Iterable[int]) -> str | None:
    """Dependency ids as a PostgreSQL array literal (``{1,2}``), None when there are none."""
    items = ",".join(str(i) for i in ids)
    return "{" + items + "}" if items else None


def ended_dependents(rows: Iterable[Any], column: int) -> list[int]:
    """The dependents listed in ``column`` of the rows of an outcome statement, one entry per
    edge (a job listed twice had two of its dependencies end)."""
    found: list[int] = []
    for row in rows:
        if row[column]:
            found.extend(row[column])
    return found


def settle(db: Executor, dependents: Iterable[int]) -> dict[int, JobState]:
    """Queue or cancel the WAITING jobs among ``dependents`` whose dependencies ended (one
    entry per ended edge, see the module); their new states.

    Runs right after the statement that ended the dependencies, in the same transaction but its
    own statements, so that it sees dependents enqueued while that statement waited (see
    ``pgqueue.sql.common`` on the follow-ups); the dependents are locked first so that two
    transactions ending two dependencies of one job cannot each miss the other's outcome
    (``sql.dependencies.lock_waiting_dependents``). The dependents of workflow jobs it cancels
    or closes are settled in turn, until none is left."""
    counts = Counter(dependents)
    settled: dict[int, JobState] = {}
    while counts:
        ids = sorted(counts)
        if not db.rows(dependency_sql.lock_waiting_dependents(), {"ids": ids}):
            break
        reached = db.rows(
            dependency_sql.count_down(), {"ids": ids, "counts": [counts[i] for i in ids]}
        )
        rows = list(db.rows(dependency_sql.settle_dependents(), {"ids": ids}))
        roles = {row[2] for row in reached}
        if WorkflowRole.CLOSING in roles:
            rows.extend(db.rows(workflow_sql.close_workflows(), {"ids": ids}))
        if WorkflowRole.ON_FAILURE in roles:
            for job_id, state in db.rows(workflow_sql.settle_on_failure(), {"ids": ids}):
                settled[job_id] = JobState(state)
        settled.update({row[0]: JobState(row[1]) for row in rows})
        counts = Counter(ended_dependents(rows, 2))
    return settled


def abandon_orphans(db: Executor, deleted: Iterable[int], orphans: Iterable[int]) -> None:
    """Cancel the WAITING jobs ``orphans`` that depend on the just deleted jobs ``deleted``,
    then settle what waits on them (cancelled in turn).

    Its own statement after the delete's, in the same transaction, for the reason ``settle``
    is: a dependent enqueued while the delete waited for its row lock is in the deleted row's
    ``dependents`` but invisible to the delete statement's snapshot."""
    orphan_ids = sorted(set(orphans))
    if not orphan_ids:
        return
    rows = db.rows(
        dependency_sql.abandon_orphans(),
        {"ids": orphan_ids, "deleted": sorted(set(deleted))},
    )
    cancelled_dependents = ended_dependents(rows, 1)
    if cancelled_dependents:
        settle(db, cancelled_dependents)
