"""The chaos run's invariants of workflows (chords of leased members and a gather callback):
each callback runs once, nothing of a cancelled workflow starts after the cancel, and a
workflow refused for a held unique key wrote nothing."""

from __future__ import annotations

from typing import TYPE_CHECKING

from .snapshot import FINAL, Snapshot, interrupted

if TYPE_CHECKING:
    from .invariants import Facts, Violation

GATHER = "chaos.gather"
CLOSING_ROLE = 3
# Seconds a run may start after the cancel's return and still have been claimed before it
# committed (the worker's claim answer and its ledger write come after the claim's commit).
CLAIM_SLACK = 1.0


def callback_once(s: Snapshot, facts: Facts) -> list[Violation]:
    """14. A chord's callback completed one run, with one result per member: never two runs
    that returned (unless an interruption or a recorded error explains the first), and, once
    every member succeeded in a workflow not cancelled and the workers drained, exactly one."""
    from .invariants import Violation

    found = []
    for job in s.jobs.values():
        if job.task_name != GATHER:
            continue
        completed = [
            r
            for r in s.runs.get(job.id, [])
            if r.outcome == "ok"
            and not interrupted(r, facts.killed)
            and not s.errors_for(job.id, r.attempt)
        ]
        if len(completed) > 1:
            found.append(
                Violation(
                    "14 callback once",
                    job.id,
                    f"the callback returned {len(completed)} times",
                    [r.id for r in completed],
                )
            )
        members = [s.jobs[p] for p in job.depends_on or [] if p in s.jobs]
        cancelled = s.workflows.get(job.workflow_id) == "cancelled"
        all_done = members and all(m.state == "succeeded" for m in members)
        if facts.final and all_done and not cancelled and job.state != "succeeded":
            found.append(
                Violation(
                    "14 callback once",
                    job.id,
                    f"{job.state} though its {len(members)} members succeeded",
                )
            )
        if job.state == "succeeded" and not s.runs.get(job.id):
            found.append(Violation("14 callback once", job.id, "succeeded without a run"))
    for workflow_id, state in s.workflows.items():
        closing = [
            j
            for j in s.jobs.values()
            if j.workflow_id == workflow_id and j.workflow_role == CLOSING_ROLE
        ]
        if facts.final and state == "running" and closing and closing[0].state in FINAL:
            found.append(
                Violation("14 callback once", closing[0].id, "closed but its workflow is running")
            )
    return found


def nothing_starts_after_a_cancel(s: Snapshot, facts: Facts) -> list[Violation]:
    """15. No member of a cancelled workflow that had not started starts after the cancel
    returned (a running member may see its cancel flag, or be run again if rescued)."""
    from .invariants import Violation

    found = []
    for job in s.jobs.values():
        cancelled_at = facts.workflow_cancels.get(job.workflow_id)
        if cancelled_at is None:
            continue
        runs = s.runs.get(job.id, [])
        if any(r.started <= cancelled_at for r in runs):
            continue
        late = [r for r in runs if r.started > cancelled_at + CLAIM_SLACK]
        if late:
            found.append(
                Violation(
                    "15 nothing after a cancel",
                    job.id,
                    f"started {late[0].started - cancelled_at:.1f} s after its workflow "
                    f"{job.workflow_id} was cancelled",
                    [r.id for r in late],
                )
            )
    return found


def refused_left_nothing(s: Snapshot, facts: Facts) -> list[Violation]:
    """16. A workflow refused for a held unique key (``UniqueKeyHeld``) left no row: no job
    carries its tag; and, at the final check, the holder it named exists with that key."""
    from .invariants import Violation

    found = []
    for job in s.jobs.values():
        refused = facts.refused_workflows.get(job.wf_tag) if job.wf_tag else None
        if refused is not None:
            found.append(
                Violation(
                    "16 refused workflow wrote nothing",
                    job.id,
                    f"a job of workflow {job.wf_tag}, refused as key {refused[0]!r} was held by "
                    f"job {refused[1]}",
                )
            )
    if not facts.final:
        # A refusal recorded while this snapshot was read may name a holder the snapshot does
        # not have yet; nothing deletes jobs, so the final check sees every holder.
        return found
    for tag, (key, holder) in list(facts.refused_workflows.items()):
        job = s.jobs.get(holder)
        if job is None or job.unique_key != key:
            found.append(
                Violation(
                    "16 refused workflow wrote nothing",
                    holder,
                    f"workflow {tag} was refused as key {key!r} was held by job {holder}, "
                    f"which {'does not exist' if job is None else 'has another key'}",
                )
            )
    return found
