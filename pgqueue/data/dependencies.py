"""Jobs that depend on others (``depends_on``): when such a job may run, and settling it.

The rule: a job runs once every dependency SUCCEEDED; a dependency that FAILED or was
CANCELLED cancels it (and, transitively, what waits on it) with the reason; until then it
WAITS with no ticket. ``initial_state`` applies the rule when the job is enqueued;
``settle`` applies it after its dependencies end, through ``sql.outcomes.settle_dependents``
(the same rule in SQL, idempotent under concurrent runs). A deleted dependency can never
succeed: ``abandon_orphans`` cancels what waited on it, in the delete's transaction.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from pgqueue.db import Executor, SessionOrExecutor, executor_for
from pgqueue.sql import outcomes
from pgqueue.states import JobState

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


def ended_dependents(rows: Iterable[Any], column: int) -> set[int]:
    """The dependents listed in ``column`` of the rows of an outcome statement."""
    found: set[int] = set()
    for row in rows:
        if row[column]:
            found.update(row[column])
    return found


def settle(db: Executor, job_ids: Iterable[int]) -> dict[int, JobState]:
    """Queue or cancel the WAITING jobs ``job_ids`` whose dependencies ended; their new states.

    Runs right after the statement that ended the dependencies, in the same transaction but its
    own statements, so that it sees dependents enqueued while that statement waited (see
    ``pgqueue.sql.common`` on the follow-ups); the dependents are locked first so that two
    transactions ending two dependencies of one job cannot each miss the other's outcome
    (``sql.outcomes.lock_waiting_dependents``)."""
    ids = sorted(set(job_ids))
    if not db.rows(outcomes.lock_waiting_dependents(), {"ids": ids}):
        return {}
    rows = db.rows(outcomes.settle_dependents(), {"ids": ids})
    return {row[0]: JobState(row[1]) for row in rows}


def abandon_orphans(db: Executor, deleted: Iterable[int], orphans: Iterable[int]) -> None:
    """Cancel the WAITING jobs ``orphans`` that depend on the just deleted jobs ``deleted``,
    then settle what waits on them (cancelled in turn).

    Its own statement after the delete's, in the same transaction, for the reason ``settle``
    is: a dependent enqueued while the delete waited for its row lock is in the deleted row's
    ``dependents`` but invisible to the delete statement's snapshot."""
    orphan_ids = sorted(set(orphans))
    if not orphan_ids:
        return
    rows = db.rows(outcomes.abandon_orphans(), {"ids": orphan_ids, "deleted": sorted(set(deleted))})
    cancelled_dependents = ended_dependents(rows, 1)
    if cancelled_dependents:
        settle(db, cancelled_dependents)


def settle_dependents(db: SessionOrExecutor, job_ids: Iterable[int]) -> dict[int, JobState]:
    """Queue or cancel WAITING jobs whose dependencies ended (``settle``)."""
    return settle(executor_for(db), job_ids)
