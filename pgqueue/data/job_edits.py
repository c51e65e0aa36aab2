"""An operator's edits of one job that has not started (``sql.job_edits``): a new ``run_at``
or priority on its row and its ticket, or, when the edit changed nothing, the reason raised;
over ``db.Executor``, never committing.
"""

from __future__ import annotations

import datetime as dt
from typing import NoReturn

from pgqueue.data.history import moved_state
from pgqueue.db import Executor
from pgqueue.errors import InvalidStateTransition, JobNotFound
from pgqueue.sql import job_edits
from pgqueue.states import REPRIORITIZE, RESCHEDULE, Edit, JobState, WorkflowRole


def reschedule(db: Executor, job_id: int, run_at: dt.datetime | None) -> dt.datetime:
    """Give job ``job_id`` the ``run_at`` (None: the database's ``now()``) on its row and its
    ticket; the ``run_at`` written. InvalidStateTransition or JobNotFound, nothing written,
    when it is not QUEUED, RETRYING or WAITING, is suspended, or is a closing marker."""
    params = {"target": job_id} if run_at is None else {"target": job_id, "new_run_at": run_at}
    rows = db.rows(job_edits.reschedule(now=run_at is None), params)
    if not rows:
        _refuse(db, job_id, "reschedule", RESCHEDULE)
    written: dt.datetime = rows[0][1]
    return written


def reprioritize(db: Executor, job_id: int, priority: int) -> None:
    """Give job ``job_id`` the ``priority`` on its row and its ticket; refused as
    ``reschedule`` refuses."""
    rows = db.rows(job_edits.reprioritize(), {"target": job_id, "new_priority": priority})
    if not rows:
        _refuse(db, job_id, "change the priority of", REPRIORITIZE)


def _refuse(db: Executor, job_id: int, action: str, edit: Edit) -> NoReturn:
    prefix = f"cannot {action} job {job_id}"
    rows = db.rows(job_edits.edit_refusal(), {"job_id": job_id})
    if not rows:
        moved = moved_state(db, job_id)
        if moved is not None:
            raise InvalidStateTransition(
                f"{prefix}: it finished ({moved.value}) and was moved to the history "
                "(history=partitioned), where jobs are read-only"
            )
        raise JobNotFound(f"no job with id {job_id}")
    state, role, workflow, is_suspended = rows[0]
    if role == WorkflowRole.CLOSING:
        raise InvalidStateTransition(
            f"{prefix}: it is the closing marker of workflow {workflow}, which never runs"
        )
    if is_suspended and not edit.suspended:
        raise InvalidStateTransition(
            f"{prefix}: it is suspended (ctx.sleep or ctx.wait_for_signal) until its wake "
            "time; send it the signal it waits for, or cancel it"
        )
    if JobState(state) in edit.sources:
        # In an editable state, yet nothing was edited: a QUEUED or RETRYING row without the
        # ticket the edit writes too.
        raise InvalidStateTransition(
            f"{prefix}: it {JobState(state).phrase} but has no ticket, so no worker can claim it "
            "(its row was written or edited by hand): delete it and enqueue it again"
        )
    allowed = ", ".join(sorted(s.value for s in edit.sources))
    raise InvalidStateTransition(f"{prefix}: it {JobState(state).phrase} (allowed from: {allowed})")
