"""The chaos run's invariants of the operator's edits (``edits``): jobs rescheduled, run now
and given another priority, and the periodic schedule paused, resumed and run now.

Each edited job runs once whatever the faults, and never before the run_at the latest edit
committed before its claim wrote; every accepted edit has exactly one audit record saying what
it wrote, and a refused one none; a paused schedule enqueues no tick, and a run-now enqueues
one job per call.

What an edit wrote is known from the call (the run_at it returned) and from its audit record,
read in the snapshot that reads the jobs: an edit whose answer a fault took (``FAILED``) is
taken as committed exactly when its record exists. A call that returned after the snapshot was
read (or had not returned) may or may not be in it: such a call counts as one of unknown
outcome. The harness's clock and the database's are the same host's.
"""

from __future__ import annotations

import datetime as dt
from collections import Counter, defaultdict
from typing import TYPE_CHECKING, Any

from .app import TICK_KIND, TICK_SCHEDULE
from .edits import ACCEPTED, ATOMIC_KIND, FAILED, PENDING, REFUSED, Call
from .pool_checks import _frozen_or_killed
from .snapshot import AuditRow, Run, Snapshot, clock, interrupted

if TYPE_CHECKING:
    from .invariants import Facts, Violation

JOB_EDITS = {"reschedule", "run_now", "set_priority"}
RUN_AT_EDITS = {"reschedule", "run_now"}
SCHEDULE_SWITCHES = {"pause_schedule", "resume_schedule"}
# Seconds before the snapshot's read a call must have returned for its outcome to be in it.
SETTLE = 0.2
# Faults that may cost a leased attempt its outcome after its work committed (so it runs
# again), and how long after the run they may still do so.
OUTCOME_FAULTS = {"terminate", "server_restart", "bouncer_restart", "unexpected_exit"}
AFTER_RUN = 10.0
# Float seconds of two equal database times may differ by this much.
EPSILON = 1e-5


def _settled(call: Call, outcome: str, s: Snapshot) -> bool:
    """Whether ``call``, answered ``outcome``, returned before ``s`` was read."""
    return outcome != PENDING and call.after is not None and call.after < s.now - SETTLE


def _records(s: Snapshot) -> dict[str, list[AuditRow]]:
    found: dict[str, list[AuditRow]] = defaultdict(list)
    for row in s.audit:
        found[row.actor].append(row)
    return found


def _committed(call: Call, outcome: str, records: list[AuditRow], s: Snapshot) -> bool | None:
    """Whether ``call`` took effect before ``s`` was read: True, False, or None (unknown)."""
    if records or (outcome == ACCEPTED and _settled(call, outcome, s)):
        return True
    if outcome == REFUSED or (outcome == FAILED and _settled(call, outcome, s)):
        # A failed call that committed has its record (the action and it commit together).
        return False
    return None


def edited_jobs_run_once(s: Snapshot, facts: Facts) -> list[Violation]:
    """26. A job the operator edits runs once: an atomic one commits one run at most, a leased
    one completes a second run only when a fault cost the first its outcome (its process killed
    or frozen, its attempt's error recorded, its connection cut); one that left the tables had
    completed its run (pruned or deleted once it succeeded); and once the workers drained each
    has succeeded, or failed with every attempt's error recorded (the faults used them up)."""
    from .invariants import Violation

    found = []
    for job in list(facts.edited_jobs.values()):
        if job.enqueued >= s.now - SETTLE:
            continue  # its row may be newer than the snapshot
        row = s.jobs.get(job.id)
        txs = s.txs.get(job.id, [])
        if job.kind == ATOMIC_KIND and len(txs) > 1:
            found.append(
                Violation(
                    "26 edited jobs run once",
                    job.id,
                    f"{len(txs)} committed runs of an atomic job",
                    [t.id for t in txs],
                )
            )
        elif len(txs) > 1:
            # One completed run may be the one whose outcome counted; each other one must
            # have lost its outcome to a fault (in whatever order they committed).
            unexplained = [
                run
                for tx in txs
                for run in s.runs.get(job.id, [])
                if run.attempt == tx.attempt
                and run.pid == tx.pid
                and not _lost_its_outcome(s, facts, job.id, run)
            ]
            if len(unexplained) > 1:
                found.append(
                    Violation(
                        "26 edited jobs run once",
                        job.id,
                        f"completed {len(txs)} runs; those of attempts "
                        f"{[run.attempt for run in unexplained]} lost their outcome to no fault",
                        [t.id for t in txs],
                    )
                )
        if row is None:
            if not txs:
                found.append(
                    Violation(
                        "26 edited jobs run once", job.id, "gone from the tables, never completed"
                    )
                )
            continue
        if not facts.final or row.state == "succeeded":
            continue
        failed_by_faults = row.state == "failed" and all(
            s.errors_for(job.id, attempt) for attempt in range(1, row.attempts + 1)
        )
        if not failed_by_faults:
            found.append(
                Violation(
                    "26 edited jobs run once",
                    job.id,
                    f"{row.state} at the end (attempts {row.attempts}/{row.max_attempts}, "
                    f"run_at {clock(row.run_at.timestamp())})",
                )
            )
    return found


def _lost_its_outcome(s: Snapshot, facts: Facts, job_id: int, run: Run) -> bool:
    """Whether a fault may have cost leased ``run``, which completed its work, its outcome."""
    if interrupted(run, facts.killed) or s.errors_for(job_id, run.attempt):
        return True
    ended = (run.ended or run.started) + AFTER_RUN
    if _frozen_or_killed(facts, run.pids, run.started, ended) is not None:
        return True
    if job_id in s.jobs:
        return False  # its attempts' errors are there to say
    return any(
        e.kind in OUTCOME_FAULTS and e.at <= ended and (e.until or e.at) >= run.started
        for e in list(facts.events)
    )


def edits_respected(s: Snapshot, facts: Facts) -> list[Violation]:
    """27. An edited job's attempt is claimed no earlier than the run_at written by the latest
    reschedule or run-now before the claim, nor than its row's run_at then (the claim's time
    and the row's run_at are the job's ``started_at`` and ``run_at`` as its run began, kept in
    the ledger); a reschedule writes the run_at it was asked for; and the job's priority is the
    one the latest set_priority wrote (or the enqueue's).

    The latest edit before the claim is the latest whose transaction began before the run did:
    an edit is accepted only while the job waits with its ticket, and a claim that took the
    ticket first leaves it none (the edit is refused), so every accepted edit that began before
    the run committed before the claim took the ticket. Not the latest that began before the
    claim's time: that is its transaction's start, and its snapshot comes later (after
    planning it), so it may see an edit that began after it."""
    from .invariants import Violation

    records = _records(s)
    calls: dict[int, list[Call]] = defaultdict(list)
    for call in list(facts.edit_calls):
        if call.action in JOB_EDITS and call.job_id is not None:
            calls[call.job_id].append(call)
    found = []
    for job in list(facts.edited_jobs.values()):
        # (its transaction began, the run_at it wrote, the call) of each run_at edit known to
        # have committed before the snapshot: those with their audit record (invariant 28
        # sees an accepted one without).
        edits: list[tuple[float, float, Call]] = []
        priorities: set[int | None] = {job.priority}
        for call in calls.get(job.id, []):
            outcome = call.outcome
            own = records.get(call.actor, [])
            committed = _committed(call, outcome, own, s)
            if call.action == "set_priority":
                if committed:
                    priorities = {call.priority}
                elif committed is None:
                    priorities.add(call.priority)
                continue
            if (
                call.action == "reschedule"
                and outcome == ACCEPTED
                and call.run_at != call.requested
            ):
                found.append(
                    Violation(
                        "27 edits respected",
                        job.id,
                        f"reschedule {call.number} asked for {call.requested} and wrote "
                        f"{call.run_at}",
                    )
                )
            written = _written_run_at(call, outcome, own)
            if written is not None and own:
                edits.append((own[0].at, written, call))
        edits.sort(key=lambda edit: edit[0])
        for run in s.runs.get(job.id, []):
            if run.claimed is None:
                continue  # rescued before its run began: when it was claimed is not known
            latest = [edit for edit in edits if edit[0] <= run.started]
            early = []
            if latest and run.claimed < latest[-1][1] - EPSILON:
                call = latest[-1][2]
                early.append(
                    f"{clock(latest[-1][1])}, the run_at {call.action} {call.number} wrote"
                )
            if run.due is not None and run.claimed < run.due - EPSILON:
                early.append(f"{clock(run.due)}, its row's run_at")
            if early:
                found.append(
                    Violation(
                        "27 edits respected",
                        job.id,
                        f"attempt {run.attempt} claimed at {clock(run.claimed)}, before "
                        + " and before ".join(early)
                        + "; its edits: "
                        + "; ".join(_described(c, records) for c in calls[job.id]),
                        [run.id],
                    )
                )
        row = s.jobs.get(job.id)
        if row is not None and job.enqueued < s.now - SETTLE and row.priority not in priorities:
            found.append(
                Violation(
                    "27 edits respected",
                    job.id,
                    f"priority {row.priority}; its edits wrote "
                    f"{sorted(p for p in priorities if p is not None)}",
                )
            )
    return found


def _described(call: Call, records: dict[str, list[AuditRow]]) -> str:
    """One edit of a job, for a violation's message: what it asked and wrote, and when."""
    own = records.get(call.actor, [])
    asked = call.priority if call.action == "set_priority" else call.requested
    wrote = clock(call.run_at.timestamp()) if call.run_at is not None else "-"
    began = clock(own[0].at) if own else "no record"
    asked_at = clock(asked.timestamp()) if isinstance(asked, dt.datetime) else asked
    return (
        f"{call.action} {call.number} {call.outcome} at {clock(call.before)}-"
        f"{clock(call.after)} asked {asked_at} wrote {wrote} ({began})"
    )


def _written_run_at(call: Call, outcome: str, records: list[AuditRow]) -> float | None:
    """The run_at a reschedule or run-now wrote, if it committed (None: not, or unknown)."""
    if outcome == ACCEPTED and call.run_at is not None:
        return call.run_at.timestamp()
    if records and "run_at" in records[0].target:
        return dt.datetime.fromisoformat(records[0].target["run_at"]).timestamp()
    return None


def edits_audited(s: Snapshot, facts: Facts) -> list[Violation]:
    """28. Every accepted edit (of a job or of the schedule) has exactly one audit record, by
    its actor, of its action, saying what it wrote; a refused one has none (nothing written);
    one that failed or was still going has at most one; no record names an actor no call had."""
    from .invariants import Violation

    records = _records(s)
    calls = list(facts.edit_calls)
    actors = {call.actor for call in calls}
    found = [
        Violation(
            "28 edits audited",
            None,
            f"audit record {row.id} ({row.action} by {row.actor}) of no call",
        )
        for row in s.audit
        if row.actor not in actors
    ]
    for call in calls:
        outcome = call.outcome
        own = records.get(call.actor, [])
        problem = None
        if outcome == REFUSED and own:
            problem = f"refused ({call.detail}) yet audited as {own[0].action} {own[0].target}"
        elif outcome == ACCEPTED and _settled(call, outcome, s) and len(own) != 1:
            problem = f"accepted with {len(own)} audit records"
        elif len(own) > 1:
            problem = f"{outcome} with {len(own)} audit records"
        else:
            problem = next((p for row in own if (p := _mismatch(call, outcome, row))), None)
        if problem is not None:
            found.append(
                Violation(
                    "28 edits audited", call.job_id, f"{call.action} {call.number}: {problem}"
                )
            )
    return found


def _mismatch(call: Call, outcome: str, row: AuditRow) -> str | None:
    """What ``row`` gets wrong about ``call`` (None: nothing)."""
    if (row.action, row.source, row.count) != (call.action, "api", 1):
        return f"audited as {row.action} from {row.source}, count {row.count}"
    target: dict[str, Any] = dict(row.target)
    expected: dict[str, Any]
    if call.action in SCHEDULE_SWITCHES:
        expected = {"schedule": TICK_SCHEDULE}
    elif call.action == "run_schedule":
        expected = {"schedule": TICK_SCHEDULE, "job_id": target.get("job_id")}
        if outcome == ACCEPTED:
            expected["job_id"] = call.job_id
    elif call.action == "set_priority":
        expected = {"job_id": call.job_id, "priority": call.priority}
    else:
        expected = {"job_id": call.job_id, "run_at": target.get("run_at")}
        if outcome == ACCEPTED and call.run_at is not None:
            run_at = target.get("run_at")
            written = dt.datetime.fromisoformat(run_at) if isinstance(run_at, str) else None
            if written != call.run_at:
                return f"audit says run_at {run_at}; the call wrote {call.run_at.isoformat()}"
    if target != expected:
        return f"audit record says {target}, expected {expected}"
    return None


def schedule_controls_kept(s: Snapshot, facts: Facts) -> list[Violation]:
    """29. The periodic schedule enqueues no tick while paused: no tick falls due, nor is
    recorded, between a call that saw it paused (a pause accepted, or refused as paused
    already) and the next resume that may have run (one refused as running, or a pause
    accepted while paused, contradicts what is known); each run-now accepted enqueued one job,
    and every job of the schedule's task is a tick's or an audited run-now's; and by the end it
    ticked."""
    from .invariants import Violation

    calls = list(facts.edit_calls)
    found = []
    windows, contradictions = _paused_windows(calls, s.now)
    found += [Violation("29 schedule controls", None, c) for c in contradictions]
    for tick in s.ticks:
        for start, end, opened in windows:
            due = start < tick.scheduled < end
            recorded = start < tick.created < end and not _frozen_across(facts, end)
            if due or recorded:
                what = "fell due" if due else "was recorded"
                found.append(
                    Violation(
                        "29 schedule controls",
                        tick.job_id,
                        f"tick {clock(tick.scheduled)} {what} (recorded from "
                        f"{clock(tick.created)}) while the schedule was paused, from "
                        f"{clock(start)} ({opened.action} {opened.number}) to {clock(end)}",
                    )
                )
    found += _run_now_checked(s, calls)
    if facts.final and not any(tick.job_id is not None for tick in s.ticks):
        found.append(Violation("29 schedule controls", None, "the schedule never ticked"))
    return found


def _paused_windows(
    calls: list[Call], now: float
) -> tuple[list[tuple[float, float, Call]], list[str]]:
    """The stretches the schedule is known to have been paused (from the return of a call that
    saw it paused to the call of the next resume that may have run), and the calls that
    contradict what was known of it then."""
    windows = []
    contradictions = []
    opened: Call | None = None
    known: bool | None = False  # paused? (None: unknown, after a call of unknown outcome)
    for call in calls:
        if call.action not in SCHEDULE_SWITCHES:
            continue
        outcome = call.outcome
        pause = call.action == "pause_schedule"
        if outcome in (FAILED, PENDING):
            if not pause and opened is not None:
                windows.append((opened.after or now, call.before, opened))
                opened = None
            known = None
            continue
        paused_before = pause if outcome == REFUSED else not pause
        if known is not None and known != paused_before:
            contradictions.append(
                f"{call.action} {call.number} was {outcome}: the schedule was "
                f"{'paused' if known else 'running'}"
            )
        known = pause
        if pause and opened is None:
            opened = call
        elif not pause and opened is not None:
            # A refused one contradicts the pause (reported above): the stretch ends anyway,
            # not to report every later tick again.
            windows.append((opened.after or now, call.before, opened))
            opened = None
    if opened is not None:
        windows.append((opened.after or now, now, opened))
    return windows, contradictions


def _frozen_across(facts: Facts, moment: float) -> bool:
    """Whether some process was SIGSTOPped across ``moment``: a scheduler pass that read the
    schedule running before the pause, frozen after its tick's transaction began, records the
    tick once it resumes after the resume (its transaction's start in the pause)."""
    return any(
        e.kind == "sigstop" and e.until is not None and e.at <= moment <= e.until
        for e in list(facts.events)
    )


def _run_now_checked(s: Snapshot, calls: list[Call]) -> list[Violation]:
    from .invariants import Violation

    found = []
    of_task = {job.id for job in s.jobs.values() if job.kind == TICK_KIND}
    of_task |= {job_id for job_id, runs in s.runs.items() if any(r.kind == TICK_KIND for r in runs)}
    ticked = {tick.job_id for tick in s.ticks if tick.job_id is not None}
    returned: Counter[int] = Counter()
    for call in calls:
        if call.action != "run_schedule" or call.outcome != ACCEPTED or call.job_id is None:
            continue
        returned[call.job_id] += 1
        if call.job_id in ticked or (call.job_id not in of_task and _settled(call, ACCEPTED, s)):
            what = "a tick's job" if call.job_id in ticked else "no job of the schedule's task"
            message = f"run_schedule {call.number} returned job {call.job_id}: {what}"
            found.append(Violation("29 schedule controls", call.job_id, message))
    found += [
        Violation("29 schedule controls", job_id, f"{n} run_schedule calls returned job {job_id}")
        for job_id, n in returned.items()
        if n > 1
    ]
    audited = {row.target.get("job_id") for row in s.audit if row.action == "run_schedule"}
    for job_id in sorted(of_task - ticked - set(returned) - audited):
        found.append(
            Violation(
                "29 schedule controls",
                job_id,
                "a job of the schedule's task enqueued by no tick and no audited run-now",
            )
        )
    return found


def edits_note(s: Snapshot, facts: Facts) -> str:
    """What the operator's edits worked on, for the report: the edited jobs by kind and how
    they ended, the schedule's ticks, its paused stretches and its run-now jobs."""
    ended: dict[str, Counter[str]] = defaultdict(Counter)
    for job in list(facts.edited_jobs.values()):
        row = s.jobs.get(job.id)
        ended[job.kind]["gone" if row is None else row.state] += 1
    jobs = "; ".join(
        f"{kind} {sum(states.values())} ("
        + ", ".join(f"{n} {st}" for st, n in states.items())
        + ")"
        for kind, states in sorted(ended.items())
    )
    windows, _ = _paused_windows(list(facts.edit_calls), s.now)
    ticks = sum(1 for tick in s.ticks if tick.job_id is not None)
    run_now = sum(
        1 for c in list(facts.edit_calls) if c.action == "run_schedule" and c.outcome == ACCEPTED
    )
    return (
        f"edited jobs: {jobs}; schedule {TICK_SCHEDULE}: {ticks} ticks enqueued, "
        f"{len(windows)} paused stretches ({sum(e - b for b, e, _ in windows):.0f} s), "
        f"{run_now} run-now jobs"
    )
