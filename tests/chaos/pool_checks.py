"""The chaos run's invariants of timeouts and of the process pool (``--pool process``).

A run of a job never overlaps another run of it unless the first one's lease expired (its
process frozen or cut off past its lease, which the attempt's recorded error shows); an attempt
that hung past its timeout or crashed its process commits nothing through ``ctx.session``, and
a process-pool child stopped at its timeout does nothing after it; the pool's children stay
under their memory cap (a child that reached it runs no further job, and none is seen over it
while idle) and run at most ``--max-tasks-per-child`` jobs; a crash fails only its attempt,
with its exit code or signal named, and the worker goes on.

The runs' extents come from the ledger: a run's start, its end mark, and for a hanging handler
its beats (``alive_at``, every 0.2 s while it hangs), the only trace of a run that was stopped.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .app import HANG_TIMEOUT, MEMORY_CAP_MB, TASKS_PER_CHILD
from .snapshot import FINAL, LEASE_EXPIRED, Run, Snapshot, clock

if TYPE_CHECKING:
    from .invariants import Facts, Violation

ATOMIC_TASKS = {"chaos.atomic", "chaos.atomic_solo"}
# ``chaos.hang``'s kinds: on the process-only queue, and on a shared one (a thread or a child).
HANG_KINDS = {"hang", "hang_shared"}
# The kinds only the process pool's children may run (the process-only queue's).
PROCESS_ONLY_KINDS = {"hang", "hog", "crash"}
# Seconds a process-pool child may still beat past its timeout: the stop is a SIGTERM sent at
# the deadline (the run's ledger start comes after the deadline's start, so this is all slack
# for the deadlines thread's wake-up and the signal's delivery, which a machine loaded several
# times over delays by seconds); a child never stopped beats 20-40 s on.
LATE_MARGIN = 3.0
# MB between a child's own measure of its memory (the ledger's) and the pool's, taken a moment
# later, after the attempt's outcome.
RSS_SLACK = 8.0
# Seconds a child over its cap may live on after its run returned: its outcome is written (the
# handler's session commits), then the pool tells it to exit.
RETIRE_GRACE = 5.0
# How a recorded error names the end of an attempt a fault (not the handler) decided: the
# rescue of an expired lease, an outcome the database refused, a child the faults killed.
FAULT_ERRORS = (LEASE_EXPIRED, "OutcomeNotRecorded")
KILLED_CHILD = "ChildProcessDied: the process running the handler killed by signal SIGKILL (9)"
# What a handler's traceback names when the faults ended its connection (a backend terminated,
# the server restarted): nothing else in the harness loses a connection.
LOST_CONNECTION = (
    "psycopg.errors.AdminShutdown",
    "psycopg.OperationalError",
    "sqlalchemy.exc.OperationalError",
)


@dataclass
class PoolSample:
    """A process-pool child's resident memory seen over the cap by the harness (from /proc)."""

    at: float
    pid: int
    holder: int  # its worker
    megabytes: float


def _errors_cut(s: Snapshot, job_id: int, attempt: int) -> bool:
    """Whether attempt ``attempt``'s errors fell out of the job's last ten."""
    entries = s.jobs[job_id].errors or []
    return len(entries) >= 10 and min(e.get("attempt", 0) for e in entries) > attempt


def _attempt_over(job: Any, attempt: int) -> bool:
    return bool(job.attempts > attempt or job.state in FINAL)


def _frozen_or_killed(facts: Facts, pids: set[int], since: float, until: float) -> str | None:
    """The fault that froze or killed one of ``pids`` (a run's process and its worker) between
    ``since`` and ``until`` (None: none did)."""
    for event in list(facts.events):
        if event.kind not in ("sigstop", "sigkill") or event.pid not in pids:
            continue
        ended = event.until if event.until is not None else event.at
        if event.at <= until and ended >= since:
            return f"{event.kind} of pid {event.pid} at {clock(event.at)}"
    for pid in pids:
        killed = facts.killed.get(pid)
        if killed is not None and since - 1 <= killed <= until:
            return f"pid {pid} killed at {clock(killed)}"
    return None


def _stop_by(facts: Facts, run: Run) -> tuple[float, list[str]]:
    """The latest moment a hung run's timeout may still be undecided (a child still alive):
    ``LATE_MARGIN`` s past its deadline (at the latest its start plus its timeout), or past the
    end of what held that moment back: a freeze of its worker (which stops it; a database
    outage holds nothing back, the worker's deadlines thread needing no statement); at the
    latest ``LATE_MARGIN`` s past its worker's death (a child ends with its worker). Also what
    held it back."""
    stop_by = run.started + HANG_TIMEOUT + LATE_MARGIN
    held: list[str] = []
    events = sorted(list(facts.events), key=lambda e: e.at)
    for event in events:
        ended = event.until if event.until is not None else event.at
        if event.kind == "sigstop" and event.pid == run.holder:
            resumed = ended
        else:
            continue
        if event.at <= stop_by and resumed >= run.started:
            stop_by = max(stop_by, resumed + LATE_MARGIN)
            held.append(f"{event.kind} {clock(event.at)}-{clock(ended)}")
    killed = facts.killed.get(run.holder) if run.holder is not None else None
    if killed is not None and run.started - 1 <= killed <= stop_by:
        stop_by = min(stop_by, killed + LATE_MARGIN)
    return stop_by, held


def runs_never_overlap(s: Snapshot, facts: Facts) -> list[Violation]:
    """22. Two runs of one leased job never overlap (a run from its start to its end mark, or to
    its last beat while it hung), unless the earlier attempt's lease expired (its process was
    frozen or cut off past its lease: the rescue records it) and the later run is a later
    attempt. A timed-out sync handler keeps its job until it is gone (a thread returned, a child
    stopped), so its retry never starts beside it."""
    from .invariants import Violation

    found = []
    for job in s.jobs.values():
        if job.task_name in ATOMIC_TASKS:
            continue
        runs = sorted(s.runs.get(job.id, []), key=lambda r: (r.started, r.id))
        for index, later in enumerate(runs):
            for earlier in runs[:index]:
                if earlier.last_alive <= later.started:
                    continue
                first, second = sorted((earlier, later), key=lambda r: (r.attempt, r.started))
                if second.attempt > first.attempt and (
                    s.rescued(first) or _errors_cut(s, job.id, first.attempt)
                ):
                    continue
                found.append(
                    Violation(
                        "22 runs never overlap",
                        job.id,
                        f"run of attempt {later.attempt} (pid {later.pid}) began at "
                        f"{clock(later.started)} while the run of attempt {earlier.attempt} "
                        f"(pid {earlier.pid}) was alive until {clock(earlier.last_alive)}, "
                        f"and no lease of attempt {first.attempt} expired",
                        [earlier.id, later.id],
                    )
                )
                break
            else:
                continue
            break
    return found


def _fault_ended(error: str, run: Run, facts: Facts) -> bool:
    """Whether ``error`` (of ``run``'s attempt) is a fault's: a lease the rescue took back, an
    outcome the database refused, a handler's own write whose connection the faults ended
    (before the handler reached its crash or its hang), or the SIGKILL the faults sent the
    run's child."""
    if error.startswith(FAULT_ERRORS):
        return True
    if error.startswith("Traceback") and any(lost in error for lost in LOST_CONNECTION):
        return True
    killed = facts.killed.get(run.pid)
    return error.startswith(KILLED_CHILD) and killed is not None and killed >= run.started - 1


def _hang_explained(error: str, run: Run, facts: Facts) -> bool:
    if _fault_ended(error, run, facts):
        return True
    if not error.startswith("JobTimeout"):
        return False
    # A child is stopped at its deadline: SIGTERM, or SIGKILL when it did not end 2 s later.
    return not run.in_child or "by signal SIGTERM" in error or "by signal SIGKILL" in error


def timeouts_stop_handlers(s: Snapshot, facts: Facts) -> list[Violation]:
    """23. An attempt that hung past its timeout (``chaos.hang``) or crashed its process
    (``chaos.crash``) commits nothing it wrote through ``ctx.session``; a process-pool child
    running a hung attempt is stopped at the deadline (no beat of it later than
    ``LATE_MARGIN`` s past its timeout); each hung attempt failed with a ``JobTimeout`` (naming
    the signal that stopped a child) or a fault's error; and a job never succeeds at an attempt
    that hangs. What pgqueue's worker cannot do is excused (``timeout_excuses`` lists it for the
    report): stop anything while it is frozen; nor does it stop a thread's run of an attempt
    whose lease expired (the rescuer took the job back, as after any lost lease). A child beating
    on past its deadline has no other excuse than its worker's freeze: a live worker stops it
    at the deadline whatever became of the lease, and a dead worker's children end with it."""
    from .invariants import Violation

    found = []
    for job, run, problem, excuse in _timeout_problems(s, facts):
        if excuse is None:
            found.append(Violation("23 timeouts stop handlers", job.id, problem, [run.id]))
    for job in s.jobs.values():
        if job.kind not in HANG_KINDS and job.kind != "crash":
            continue
        runs = s.runs.get(job.id, [])
        for row in s.sessions.get(job.id, []):
            wrote = [r for r in runs if r.attempt == row.attempt and r.pid == row.pid]
            if (wrote and all(r.outcome == "ok" for r in wrote)) or any(
                r.outcome == "hung" for r in wrote
            ):
                continue  # a hung run's row: ``_timeout_problems``
            outcome = ", ".join(repr(r.outcome) for r in wrote) or "no run"
            found.append(
                Violation(
                    "23 timeouts stop handlers",
                    job.id,
                    f"attempt {row.attempt}'s write through ctx.session committed, though its "
                    f"run did not return (outcome {outcome})",
                    [row.id, *(r.id for r in wrote)],
                )
            )
        if job.kind not in HANG_KINDS:
            continue
        for run in runs:
            if run.outcome not in ("hung", None) or run.attempt > (job.hang_until or 0):
                continue
            if not _attempt_over(job, run.attempt) or _errors_cut(s, job.id, run.attempt):
                continue
            if job.state == "cancelled" and job.attempts == run.attempt:
                continue  # a cancel asked while it hung ends the job instead of its retry
            errors = s.errors_for(job.id, run.attempt)
            if not any(_hang_explained(e, run, facts) for e in errors):
                found.append(
                    Violation(
                        "23 timeouts stop handlers",
                        job.id,
                        f"attempt {run.attempt} hung past its timeout "
                        f"({'in a child' if run.in_child else 'in a thread'}); its errors: "
                        f"{[e[:120] for e in errors]}",
                        [run.id],
                    )
                )
    return found


def _timeout_problems(s: Snapshot, facts: Facts) -> list[tuple[Any, Run, str, str | None]]:
    """Each hung run whose timeout did not hold: a child beating on past it, a write through
    its session committed, its job succeeding with it; with its excuse (None: none)."""
    problems = []
    for job in s.jobs.values():
        if job.kind not in HANG_KINDS:
            continue
        committed = {(row.attempt, row.pid) for row in s.sessions.get(job.id, [])}
        for run in s.runs.get(job.id, []):
            if run.outcome not in ("hung", None) or run.attempt > (job.hang_until or 0):
                continue
            stop_by, held = _stop_by(facts, run)
            lost = s.rescued(run)
            excuse = "its lease expired" if lost else None
            deadline = run.started + HANG_TIMEOUT + LATE_MARGIN
            if run.in_child and deadline < run.last_alive <= stop_by:
                # Within what a freeze or an outage held back: reported, not a violation.
                late = run.last_alive - deadline + LATE_MARGIN
                problem = (
                    f"attempt {run.attempt} ran on in process-pool child {run.pid} {late:.1f} s "
                    f"past its timeout of {HANG_TIMEOUT:g} s"
                )
                problems.append((job, run, problem, f"held back by {'; '.join(held)}"))
            if run.in_child and run.last_alive > stop_by:
                # Never excused, not even by a lease that expired meanwhile: a live worker stops
                # its child at the deadline whatever became of the lease (its deadlines thread
                # sends no statement), and a dead one's children end with it.
                problem = (
                    f"attempt {run.attempt} ran on in process-pool child {run.pid} until "
                    f"{clock(run.last_alive)}, {run.last_alive - run.started:.1f} s after it "
                    f"began (timeout {HANG_TIMEOUT:g} s), "
                    f"{run.last_alive - stop_by + LATE_MARGIN:.1f} s after its worker "
                    f"{run.holder} should have stopped it"
                    + (f" (held back by {'; '.join(held)})" if held else "")
                )
                problems.append((job, run, problem, None))
            # A thread that returned before its worker could decide its timeout.
            returned_early = bool(held) and run.ended is not None and run.ended <= stop_by
            if excuse is None and returned_early:
                excuse = f"held back by {'; '.join(held)}"
            if (run.attempt, run.pid) in committed:
                problem = (
                    f"attempt {run.attempt}'s write through ctx.session committed, though its "
                    f"run hung past its timeout (outcome {run.outcome!r})"
                )
                problems.append((job, run, problem, excuse))
            if job.state == "succeeded" and job.attempts == run.attempt:
                problem = (
                    f"succeeded at attempt {job.attempts}, one that hangs (hang_until "
                    f"{job.hang_until})"
                )
                problems.append((job, run, problem, excuse))
    return problems


def timeout_excuses(s: Snapshot, facts: Facts) -> list[str]:
    """The report's lines on the timeouts that did not hold but were excused."""
    excused = [(run, problem, why) for _, run, problem, why in _timeout_problems(s, facts) if why]
    if not excused:
        return []
    return [
        f"timeouts not held, excused ({len(excused)}): a worker does not stop a thread's run "
        "of an attempt whose lease expired, and decides no timeout while frozen"
    ] + [f"  job {run.job_id}: {problem}; {why}" for run, problem, why in excused[:8]]


def _expected_end(outcome: str) -> str:
    """The end a crash run's ledger outcome (``crash exit 3``, ``crash segv 11``) announced,
    as the pool words it."""
    _, how, code = outcome.split()
    if how == "segv":
        return f"killed by signal SIGSEGV ({code})"
    return f"exited with code {code}"


def crashes_contained(s: Snapshot, facts: Facts) -> list[Violation]:
    """24. A handler that ends its process-pool child (``os._exit(N)``, a segfault) fails that
    attempt only: its error names the exit code or the signal (or a fault that ended the
    attempt first), the job goes on by its retry policy (never succeeding at an attempt that
    crashes), only a child runs the process-only kinds, and the pool's worker never exits by
    itself."""
    from .invariants import Violation

    found = []
    for job in s.jobs.values():
        if job.kind not in PROCESS_ONLY_KINDS:
            continue
        runs = s.runs.get(job.id, [])
        for run in runs:
            if not run.in_child:
                found.append(
                    Violation(
                        "24 crashes contained",
                        job.id,
                        f"kind {job.kind} ran in its worker's own process (pid {run.pid}), not "
                        "in a process-pool child",
                        [run.id],
                    )
                )
            if not (run.outcome or "").startswith("crash "):
                continue
            if not _attempt_over(job, run.attempt) or _errors_cut(s, job.id, run.attempt):
                continue
            errors = s.errors_for(job.id, run.attempt)
            expected = _expected_end(run.outcome or "")
            named = [e for e in errors if e.startswith("ChildProcessDied") and expected in e]
            # The faults' SIGKILL may reach the child between the crash's mark and its end.
            if not named and not any(_fault_ended(e, run, facts) for e in errors):
                found.append(
                    Violation(
                        "24 crashes contained",
                        job.id,
                        f"attempt {run.attempt} ended its child ({expected}); its errors: "
                        f"{[e[:120] for e in errors]}",
                        [run.id],
                    )
                )
        crashes = job.kind == "crash" and job.attempts <= (job.crash_until or 0)
        if crashes and job.state == "succeeded":
            found.append(
                Violation(
                    "24 crashes contained",
                    job.id,
                    f"succeeded at attempt {job.attempts}, one that crashes (crash_until "
                    f"{job.crash_until})",
                )
            )
    for event in list(facts.events):
        if event.kind == "unexpected_exit" and event.detail in facts.pool_workers:
            found.append(
                Violation(
                    "24 crashes contained",
                    None,
                    f"process-pool worker {event.detail} exited by itself at {clock(event.at)}",
                )
            )
    return found


def memory_under_cap(s: Snapshot, facts: Facts) -> list[Violation]:
    """25. The process pool's children stay under ``--max-memory-per-child``: a child whose
    memory reached the cap (``chaos.hog`` leaks 40 to 300 MB a run) runs no further job (it is
    replaced), none is seen over the cap (from /proc, every half second) unless it is running a
    job or has just returned from it (or it or its worker was frozen), and none runs more than
    ``--max-tasks-per-child`` jobs."""
    from .invariants import Violation

    found = []
    by_child: dict[str, list[Run]] = defaultdict(list)
    for runs in s.runs.values():
        for run in runs:
            if run.in_child and run.proc:
                by_child[run.proc].append(run)
    for child_runs in by_child.values():
        child_runs.sort(key=lambda r: (r.started, r.id))
        if len(child_runs) > TASKS_PER_CHILD:
            found.append(
                Violation(
                    "25 memory under the cap",
                    child_runs[-1].job_id,
                    f"child {child_runs[0].pid} ran {len(child_runs)} jobs, more than "
                    f"--max-tasks-per-child {TASKS_PER_CHILD}",
                    [r.id for r in child_runs[TASKS_PER_CHILD:]][:5],
                )
            )
        for index, run in enumerate(child_runs):
            if (run.rss_start or 0) < MEMORY_CAP_MB + RSS_SLACK:
                continue
            before = child_runs[:index]
            grown = max(before, key=lambda r: r.rss_end or 0) if before else None
            why = (
                f"it was not replaced after job {grown.job_id} ({grown.kind}) left it at "
                f"{grown.rss_end or 0:.0f} MB"
                if grown is not None
                else "its first run (the cap is below what the app needs)"
            )
            found.append(
                Violation(
                    "25 memory under the cap",
                    run.job_id,
                    f"child {run.pid} began job {run.job_id}'s run at {run.rss_start:.0f} MB, "
                    f"over the cap of {MEMORY_CAP_MB} MB: {why}",
                    [*([grown.id] if grown else []), run.id],
                )
            )
            break
    by_pid: dict[int, list[Run]] = defaultdict(list)
    for runs in s.runs.values():
        for run in runs:
            if run.in_child:
                by_pid[run.pid].append(run)
    for sample in list(facts.pool_samples):
        running = [
            r
            for r in by_pid.get(sample.pid, [])
            if r.started <= sample.at and (r.ended is None or sample.at <= r.ended + RETIRE_GRACE)
        ]
        if running:
            continue
        pids = {sample.pid, sample.holder}
        if _frozen_or_killed(facts, pids, sample.at - RETIRE_GRACE, sample.at):
            continue
        found.append(
            Violation(
                "25 memory under the cap",
                None,
                f"child {sample.pid} of worker {sample.holder} held {sample.megabytes:.0f} MB "
                f"at {clock(sample.at)}, over the cap of {MEMORY_CAP_MB} MB, while it ran no "
                "job: it was not replaced",
            )
        )
    return found


def pool_notes(s: Snapshot, facts: Facts) -> list[str]:
    """What the process pool went through, for the report."""
    children: dict[str, list[Run]] = defaultdict(list)
    for runs in s.runs.values():
        for run in runs:
            if run.in_child and run.proc:
                children[run.proc].append(run)
    if not children:
        return ["process pool: no run in a child"]
    over = sum(
        1 for runs in children.values() if max(r.rss_end or 0 for r in runs) >= MEMORY_CAP_MB
    )
    peak = max((r.rss_end or 0) for runs in children.values() for r in runs)
    errors = [
        str(e.get("error", ""))
        for job in s.jobs.values()
        for e in job.errors or []
        if str(e.get("error", "")).startswith(("JobTimeout", "ChildProcessDied"))
    ]
    timeouts = sum(1 for e in errors if e.startswith("JobTimeout"))
    stopped = sum(1 for e in errors if e.startswith("JobTimeout") and "stopped" in e)
    died = sum(1 for e in errors if e.startswith("ChildProcessDied"))
    ran = {(r.job_id, r.attempt) for runs in s.runs.values() for r in runs}
    unstarted = sum(
        1
        for job in s.jobs.values()
        for e in job.errors or []
        if str(e.get("error", "")).startswith("ChildProcessDied")
        and (job.id, e.get("attempt")) not in ran
    )
    sampled = max((p.megabytes for p in facts.pool_samples), default=None)
    summary = (
        f"process pool: {sum(len(r) for r in children.values())} runs in {len(children)} "
        f"children, {over} of them brought to the {MEMORY_CAP_MB} MB cap (peak {peak:.0f} MB "
        f"at a run's end"
        + (f", {sampled:.0f} MB seen over the cap from /proc" if sampled else "")
        + f"); {timeouts} attempts timed out ({stopped} of them in a child, stopped), "
        f"{died} failed with a dead child "
        f"({unstarted} of them with no handler run: the child died before the attempt)"
    )
    return [summary, *timeout_excuses(s, facts)]
