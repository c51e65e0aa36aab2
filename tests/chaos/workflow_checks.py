"""The chaos run's invariants of workflows (chords of leased members and a gather callback):
each callback runs once, nothing of a cancelled workflow starts after the cancel, a
workflow refused for a held unique key wrote nothing, an operator's hand retry or cancel of a
workflow's job is refused, and a workflow's state agrees with its jobs'."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .snapshot import FINAL, Run, Snapshot, interrupted

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
    every member succeeded in a workflow not cancelled and the workers drained, exactly one
    (a cancelled callback some of whose members were deleted once its workflow ended is not
    judged: a deleted member may have failed)."""
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
        # A callback cancelled because a member failed, whose workflow then ended and lost
        # that member to the operator's delete, is not judged by the members left. (A member
        # deleted while its workflow ran shows: the callback runs short of it and fails.)
        unjudged = job.state == "cancelled" and len(members) < len(job.depends_on or [])
        if facts.final and all_done and not cancelled and not unjudged and job.state != "succeeded":
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
    returned (a running member may see its cancel flag, or be run again if rescued; a claimed
    one whose process was frozen across the cancel starts as it resumes)."""
    from .invariants import Violation

    found = []
    for job in s.jobs.values():
        cancelled_at = facts.workflow_cancels.get(job.workflow_id)
        if cancelled_at is None:
            continue
        runs = s.runs.get(job.id, [])
        if any(r.started <= cancelled_at for r in runs):
            continue
        late = [
            r
            for r in runs
            if r.started > cancelled_at + CLAIM_SLACK
            and not _claimed_before(job, r, cancelled_at)
            and not _frozen_across(facts, r, cancelled_at)
        ]
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


def _frozen_across(facts: Facts, run: Run, moment: float) -> bool:
    """Whether ``run``'s process (or its process pool's worker) was SIGSTOPped across
    ``moment`` and the run began as it resumed: an attempt claimed before ``moment`` (a later
    attempt's claim hides when), whose handler the freeze kept from starting."""
    return any(
        event.kind == "sigstop"
        and event.pid in run.pids
        and event.until is not None
        and event.at <= moment <= event.until
        and run.started <= event.until + CLAIM_SLACK
        for event in list(facts.events)
    )


def _claimed_before(job: Any, run: Run, moment: float) -> bool:
    """Whether pgqueue claimed ``run``'s attempt before ``moment``: its ledger row may be written
    later than the claim (the handler's first write waits out a pooler's restart)."""
    return (
        run.attempt == job.attempts
        and job.started_at is not None
        and job.started_at.timestamp() <= moment
    )


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
        # not have yet; the final check sees every holder that no operator deleted since.
        return found
    for tag, (key, holder) in list(facts.refused_workflows.items()):
        job = s.jobs.get(holder)
        if job is None and facts.jobs_deleted:
            continue  # ended, then deleted or pruned by the operator
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


def acted_on_whole(s: Snapshot, facts: Facts) -> list[Violation]:
    """20. An operator's hand retry or cancel of a workflow's job (a member, the callback, the
    closing marker) is refused: the workflow settles its jobs."""
    from .invariants import Violation

    return [
        Violation("20 workflows acted on whole", None, f"{accepted} was accepted")
        for accepted in list(facts.hand_actions_accepted)
    ]


def state_agrees_with_jobs(s: Snapshot, facts: Facts) -> list[Violation]:
    """21. A workflow's state agrees with its jobs': none ended while one of its members is
    still to run (its closing marker ended last), a succeeded one has only succeeded members,
    and, once the workers drained, none is still running with every job ended."""
    from .invariants import Violation

    jobs_of: dict[int, list[object]] = {}
    for job in s.jobs.values():
        if job.workflow_id is not None:
            jobs_of.setdefault(job.workflow_id, []).append(job)
    found = []
    for workflow_id, state in s.workflows.items():
        jobs = jobs_of.get(workflow_id, [])
        if not jobs:
            continue
        members = [j for j in jobs if getattr(j, "workflow_role", None) != CLOSING_ROLE]
        unended = [j for j in members if getattr(j, "state", None) not in FINAL]
        first = getattr(jobs[0], "id", None)
        if state in ("succeeded", "failed") and unended:
            found.append(
                Violation(
                    "21 workflow state agrees",
                    getattr(unended[0], "id", first),
                    f"workflow {workflow_id} is {state} while {len(unended)} of its jobs have "
                    "not ended",
                )
            )
        if state == "succeeded" and any(getattr(j, "state", None) != "succeeded" for j in members):
            found.append(
                Violation(
                    "21 workflow state agrees",
                    first,
                    f"workflow {workflow_id} succeeded with a member that did not",
                )
            )
        if facts.final and state == "running" and not unended:
            found.append(
                Violation(
                    "21 workflow state agrees",
                    first,
                    f"workflow {workflow_id} is still running though every job of it ended",
                )
            )
    return found
