"""The chaos run's invariants of the partitioned history (``history="partitioned"``): the
maintenance move takes finished jobs out of ``pgqueue_jobs`` while workers claim, settle
dependents, end workflows and get rescued around them, and while faults restart the server.

A job is in exactly one table, only a finished job outside a running workflow is moved, and once
moved it still reads through pgqueue's API as it was: ``get_job`` gives its state and an ended
workflow's ``get_workflow`` its result. The history's own content (that each moved job keeps
its runs' record) is checked by every other invariant, which reads both tables.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pgqueue import JobNotFound

from .snapshot import FINAL, Snapshot

if TYPE_CHECKING:
    from .invariants import Facts, Violation

# Moved jobs read back one by one through ``get_job`` at the final check (the lowest ids: the
# earliest moved, past the most faults).
READ_BACK = 200


def moved_once(s: Snapshot, facts: Facts) -> list[Violation]:
    """17. A job is in one table at a time, and the history holds only finished jobs whose
    workflow (if any) has ended."""
    from .invariants import Violation

    found = [
        Violation("17 moved once", job_id, "read from pgqueue_jobs and from the history at once")
        for job_id in s.in_both
    ]
    for job in s.jobs.values():
        if not job.moved:
            continue
        if job.state not in FINAL:
            found.append(Violation("17 moved once", job.id, f"moved while {job.state}"))
        elif job.workflow_id is not None and s.workflows.get(job.workflow_id) == "running":
            running = f"moved while its workflow {job.workflow_id} was running"
            found.append(Violation("17 moved once", job.id, running))
    return found


def moved_jobs_read_back(s: Snapshot, facts: Facts) -> list[Violation]:
    """18. Moved jobs read through pgqueue's API as the snapshot has them: ``get_job`` gives a
    moved job's state and attempts, ``get_workflow`` of every succeeded workflow gives its
    callback's result, wherever its jobs are by then (moves go on while this reads), and a
    new job may depend on moved jobs (invariant 8 checks that it goes by their states)."""
    from .invariants import Violation

    pgq: Any = facts.pgq
    if pgq is None:
        return []
    found = []
    moved = sorted(job.id for job in s.jobs.values() if job.moved)
    if facts.history and not moved:
        found.append(Violation("18 moved jobs read back", None, "no job was moved"))
    # A new job may depend on moved jobs: its enqueue finds them in the history.
    found += [
        Violation("18 moved jobs read back", None, f"a dependent was refused: {refusal}")
        for refusal in list(facts.late_dependents_refused)
    ]
    if facts.history and not facts.late_dependents_of_moved:
        found.append(
            Violation("18 moved jobs read back", None, "no dependent was enqueued on moved jobs")
        )
    moved = moved[:READ_BACK]
    for job_id in moved:
        job = s.jobs[job_id]
        try:
            read = pgq.get_job(job_id)
        except JobNotFound:
            read = None
        state = None if read is None else str(getattr(read.state, "value", read.state))
        if read is None or (state, read.attempts) != (job.state, job.attempts):
            seen = "JobNotFound" if read is None else f"{state} at attempt {read.attempts}"
            found.append(
                Violation(
                    "18 moved jobs read back",
                    job_id,
                    f"get_job gave {seen}; the history has {job.state} at attempt {job.attempts}",
                )
            )
    for workflow_id, state in s.workflows.items():
        if state != "succeeded":
            continue
        callback = next(
            (
                j
                for j in s.jobs.values()
                if j.workflow_id == workflow_id and j.task_name == "chaos.gather"
            ),
            None,
        )
        if callback is None:
            continue
        result = pgq.get_workflow(workflow_id).result
        if result != callback.result:
            found.append(
                Violation(
                    "18 moved jobs read back",
                    callback.id,
                    f"get_workflow({workflow_id}) gave result {result!r}; its callback "
                    f"returned {callback.result!r} ({'moved' if callback.moved else 'not moved'})",
                )
            )
    return found
