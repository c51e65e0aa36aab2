"""The invariants a chaos run checks, each a named function of a :class:`Snapshot`.

Each returns the violations it found (empty: it holds). ``Facts`` carries what the database
does not know: which PIDs the harness killed and when, the limited queue's limit changes, and
how late a rescue may be. A run interrupted by its process's death, or whose attempt ended by
lease expiry (the rescuer took the job back), is what the README allows to repeat work; every
other repetition or overlap is a violation.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from . import edit_checks, history_checks, pool_checks, workflow_checks
from .app import KEY_LIMIT, NEWER_TASK, QUEUE_KEYED, QUEUE_LIMITED, QUEUE_MAIN
from .edits import Call, EditedJob
from .snapshot import ACTIVE, FINAL, LEASE_EXPIRED, Run, Snapshot, clock, interrupted
from .workflow_checks import CLOSING_ROLE
from .workload import KEY_OVERRIDES, Event, LimitChange

ATOMIC_TASKS = {"chaos.atomic", "chaos.atomic_solo"}
# A run that ended without these needs a reason to be followed by another run of its job.
SELF_ENDED = {
    "snooze",
    "raised",
    "saw_cancel",
    "cancelled",
    "misuse",
    "poison",
    "suspended",
    "interrupt",
}
# Seconds a returned run's outcome may take to be written with no fault to explain it (the
# completer writes within a batch's time; a queue whose rows are held retries within 2 s).
OUTCOME_DELAY = 10.0
# Seconds an outcome of another queue may take while a control or key row is held: the held
# row blocks its own queue's outcomes only, the others are written apart (after a short lock
# wait) at once.
NEIGHBOUR_DELAY = 6.0
# Faults that delay every outcome of the processes they touch, and how long after they end.
DELAYING = {"server_restart", "bouncer_restart", "unexpected_exit"}
AFTER_FAULT = 10.0
# The error recorded in place of an outcome the database refused (``pgqueue.worker.executor``).
NOT_RECORDED = "OutcomeNotRecorded"
# The states whose jobs hold their unique key: every state but the final ones.
KEY_HOLDING = ACTIVE | {"waiting"}
# Seconds a job's creation (its transaction's start) may precede the end of its key's previous
# holder: the enqueue's transaction may begin before that end commits and insert after it.
KEY_SLACK = 1.0


@dataclass
class Facts:
    killed: dict[int, float] = field(default_factory=dict)
    limits: list[LimitChange] = field(default_factory=list)
    stale_after: float = 10.0  # seconds past lease expiry a RUNNING job may wait for rescue
    final: bool = False  # the workers drained: nothing may be left ready
    newer_pids: set[int] = field(default_factory=set)  # the processes registering chaos.newer
    events: list[Event] = field(default_factory=list)  # the faults so far (a live list)
    # Workflow id -> when its cancel returned (a live dict of the workload's).
    workflow_cancels: dict[int, float] = field(default_factory=dict)
    # The tag of each workflow refused for a held unique key -> (the key, the holder's id)
    # (a live dict of the workload's).
    refused_workflows: dict[str, tuple[str, int]] = field(default_factory=dict)
    # The harness's own PgQueue (the workers' settings), for the final check's reads through
    # pgqueue's API; None leaves those reads out.
    pgq: Any = None
    history: bool = False  # the run moves finished jobs to the partitioned history
    # Dependents enqueued on parents all moved by then, and the enqueues of dependents refused
    # with JobNotFound though their parents exist (live lists of the workload's).
    late_dependents_of_moved: list[int] = field(default_factory=list)
    late_dependents_refused: list[str] = field(default_factory=list)
    # Hand retries and cancels of a workflow's jobs that were not refused (a live list).
    hand_actions_accepted: list[str] = field(default_factory=list)
    # When each operator's delete or prune of ended jobs returned (a live list).
    jobs_deleted: list[float] = field(default_factory=list)
    # The process-pool workers' names, and their children seen over the memory cap (a live
    # list the harness fills from /proc).
    pool_workers: set[str] = field(default_factory=set)
    pool_samples: list[pool_checks.PoolSample] = field(default_factory=list)
    # The operator's edit calls, and the jobs enqueued for it to edit, by id (live).
    edit_calls: list[Call] = field(default_factory=list)
    edited_jobs: dict[int, EditedJob] = field(default_factory=dict)


@dataclass
class Violation:
    invariant: str
    job_id: int | None
    message: str
    run_ids: list[int] = field(default_factory=list)
    first_seen: float | None = None  # the database clock of the check that first found it
    # The database clock of the latest check that found it: the one ``message`` is worded for
    # (a check seeing it again rewords it, "lease expired 22.0 s ago" after "12.0 s ago").
    last_seen: float | None = None


Check = Callable[[Snapshot, Facts], list[Violation]]


def final_or_waiting(s: Snapshot, facts: Facts) -> list[Violation]:
    """1. Every job is final or legitimately waiting: a future run_at, a paused queue, or a
    dependency that has not finished."""
    found = []
    for job in s.jobs.values():
        why = not_done_reason(s, job)
        if why is not None:
            found.append(Violation("1 final or waiting", job.id, why))
    return found


def not_done_reason(s: Snapshot, job: object) -> str | None:
    """Why ``job`` is neither final nor legitimately waiting (None: it is one of them)."""
    state = job.state  # type: ignore[attr-defined]
    if state in FINAL:
        return None
    if state in ("queued", "retrying"):
        if job.run_at.timestamp() > s.now or job.queue in s.paused:  # type: ignore[attr-defined]
            return None
        return f"{state} and ready since {job.run_at} but not run"  # type: ignore[attr-defined]
    if state == "waiting":
        parents = [s.jobs.get(p) for p in job.depends_on or []]  # type: ignore[attr-defined]
        if any(p is not None and p.state not in FINAL for p in parents):
            return None
        return f"waiting, but its dependencies are all final: {[p.state for p in parents if p]}"
    return f"{state} after the workers drained"


def attempts_within_max(s: Snapshot, facts: Facts) -> list[Violation]:
    """2. attempts <= max_attempts for every job."""
    return [
        Violation("2 attempts <= max", j.id, f"attempts {j.attempts} > max {j.max_attempts}")
        for j in s.jobs.values()
        if j.attempts > j.max_attempts
    ]


def atomic_exactly_once(s: Snapshot, facts: Facts) -> list[Violation]:
    """3. Atomic jobs: one committed tx row per SUCCEEDED job, none otherwise; handler runs
    <= max, those cut short by their process's death included (each claim commits its
    attempt before the handler starts)."""
    found = []
    for job in s.jobs.values():
        if job.task_name not in ATOMIC_TASKS:
            continue
        txs = s.txs.get(job.id, [])
        expected = 1 if job.state == "succeeded" else 0
        if len(txs) != expected:
            found.append(
                Violation(
                    "3 atomic exactly once",
                    job.id,
                    f"{job.state} with {len(txs)} committed tx rows (expected {expected})",
                    [t.id for t in txs],
                )
            )
        runs = s.runs.get(job.id, [])
        if len(runs) > job.max_attempts:
            found.append(
                Violation(
                    "3 atomic exactly once",
                    job.id,
                    f"handler runs {len(runs)} > max_attempts {job.max_attempts} "
                    f"(attempts {job.attempts}, state {job.state})",
                    [r.id for r in runs],
                )
            )
    return found


def leased_runs_explained(s: Snapshot, facts: Facts) -> list[Violation]:
    """4. Leased jobs: a SUCCEEDED job completed a run; a run followed by another run of its
    job ended by itself (failed, snoozed, saw a cancel), was interrupted by its process's
    death, or its attempt has a recorded error (a lease expiry, a lost commit)."""
    found = []
    for job in s.jobs.values():
        if job.task_name in ATOMIC_TASKS or job.workflow_role == CLOSING_ROLE:
            continue  # a workflow's closing marker never runs
        runs = s.runs.get(job.id, [])
        if job.state == "succeeded" and not s.txs.get(job.id):
            found.append(Violation("4 leased runs", job.id, "succeeded without a completed run"))
        for run in runs[:-1]:
            if run.outcome in SELF_ENDED or interrupted(run, facts.killed):
                continue
            if s.errors_for(job.id, run.attempt) or _history_cut(s, job.id, run.attempt):
                continue
            found.append(
                Violation(
                    "4 leased runs",
                    job.id,
                    f"run of attempt {run.attempt} ended {run.outcome!r} and the job ran again "
                    f"with no error recorded for that attempt ({len(runs)} runs, attempts "
                    f"{job.attempts})",
                    [r.id for r in runs],
                )
            )
    return found


def _history_cut(s: Snapshot, job_id: int, attempt: int) -> bool:
    entries = s.jobs[job_id].errors or []
    return len(entries) >= 10 and min(e.get("attempt", 0) for e in entries) > attempt


def limits_respected(s: Snapshot, facts: Facts) -> list[Violation]:
    """5. No concurrency key, queue limit or unique key ever had more overlapping runs than
    its limit, from the ledger's intervals; runs whose attempt ended by lease expiry are
    allowed to overlap (README: duplicates happen only after a lease expired), and so are
    atomic runs whose transaction was lost (the handler runs on to its end, but nothing it does
    can commit, and its slot is given back once the loss is counted)."""
    groups: dict[tuple[str, str], list[Run]] = defaultdict(list)
    for job in s.jobs.values():
        atomic = job.task_name in ATOMIC_TASKS
        names = []
        if job.concurrency_key and not atomic:
            names.append(("key", job.concurrency_key))
        # Atomic jobs count against their queue's limit like leased ones.
        if job.queue == QUEUE_LIMITED:
            names.append(("queue", job.queue))
        if job.unique_key and not atomic:
            names.append(("unique", job.unique_key))
        runs = [r for r in s.runs.get(job.id, []) if not (s.rescued(r) or s.transaction_lost(r))]
        for name in names:
            groups[name].extend(runs)
    found = []
    for (what, name), runs in sorted(groups.items()):
        violation = _overlap(s, facts, what, name, runs)
        if violation is not None:
            found.append(violation)
    return found


def _end(s: Snapshot, facts: Facts, run: Run) -> float:
    if run.ended is not None:
        return run.ended
    # A run without its end mark (its handler's last write failed, or its process died) ended
    # before its attempt's outcome was written, and before the job's next run began, in this
    # process or another (a job runs one attempt at a time, or the overlap is invariant 3's or
    # 4's). The outcome bounds it first: the next run may start long after it (a retry's
    # backoff, a wait for room in the queue), and the run no longer held a slot in between.
    bounds = [r.started for r in s.runs[run.job_id] if r.started > run.started]
    killed = facts.killed.get(run.pid)
    if killed is not None and killed >= run.started:
        bounds.append(killed)
    outcome = s.attempt_ended(run)
    if outcome is not None:
        bounds.append(max(outcome, run.started))
    if bounds:
        return min(bounds)
    job = s.jobs.get(run.job_id)  # None: deleted or pruned once it ended
    if job is not None and job.state == "running":
        return s.now  # still running
    return run.started  # end unknown (its end mark was lost): counted as an instant


def _limit(facts: Facts, what: str, name: str, started: float) -> int:
    if what == "unique":
        return 1
    if what == "key":
        return KEY_OVERRIDES.get(name, KEY_LIMIT)
    # The queue's limit could be any in force from 2 s before the run's start (claimed under
    # one limit, started after a change) to its start. A change whose call failed may or may
    # not have taken effect: the limit before it stays possible until a change that surely did.
    changes = facts.limits
    allowed = []
    for i, change in enumerate(changes):
        if change.before > started:
            continue
        replaced = next((c for c in changes[i + 1 :] if c.took_effect), None)
        if replaced is None or replaced.after >= started - 2:
            allowed.append(change.limit)
    return max(allowed, default=max((c.limit for c in changes), default=1))


def _overlap(s: Snapshot, facts: Facts, what: str, name: str, runs: list[Run]) -> Violation | None:
    intervals = sorted(((r.started, _end(s, facts, r), r) for r in runs), key=lambda i: i[0])
    open_: list[tuple[float, float, Run]] = []
    for start, end, run in intervals:
        open_ = [o for o in open_ if o[1] > start]
        open_.append((start, end, run))
        limit = max(_limit(facts, what, name, o[2].started) for o in open_)
        distinct = {o[2].job_id for o in open_}
        # One job's own runs never overlap but through a rescue, excluded above.
        if len(open_) > limit and (what != "unique" or len(distinct) > 1):
            return Violation(
                "5 limits",
                run.job_id,
                f"{len(open_)} overlapping runs of {what} {name} (limit {limit}): jobs "
                f"{sorted(distinct)}",
                [o[2].id for o in open_],
            )
    return None


def no_stale_running(s: Snapshot, facts: Facts) -> list[Violation]:
    """6. No RUNNING job whose lease expired more than ``stale_after`` seconds ago, unless its
    own queue's or key's control row was held meanwhile: its outcome and its rescue both update
    that row, so they wait for whoever holds it (an operator's ``SELECT ... FOR UPDATE``).

    An atomic job's row is held by its run's transaction until the run ends, and the rescue
    skips it until then: a SIGSTOP of the process running it keeps that transaction open, so
    the seconds its process was stopped since the run began are added to its allowance. The
    message gives the lease's expiry and the claim's start as times, not only as an age that
    belongs to one check."""
    found = []
    for j in s.jobs.values():
        if j.state != "running" or j.lease_expires_at is None:
            continue
        expired = j.lease_expires_at.timestamp()
        stopped = _atomic_run_stopped(s, j, facts)
        if expired >= s.now - facts.stale_after - stopped:
            continue
        if _own_row_held(j, facts, expired, s.now):
            continue
        found.append(
            Violation(
                "6 no stale running",
                j.id,
                f"running, lease expired {s.now - expired:.1f} s ago "
                f"(at {clock(expired)}; attempt {j.attempts} claimed at "
                f"{clock(j.started_at.timestamp() if j.started_at else None)}"
                + (f"; its process stopped {stopped:.1f} s meanwhile" if stopped else "")
                + ")",
            )
        )
    return found


def _atomic_run_stopped(s: Snapshot, job: Any, facts: Facts) -> float:
    """Seconds, up to the check, that the process running atomic ``job``'s current attempt
    spent SIGSTOPped since the attempt's claim (that process claimed it too); 0 for a leased
    job (its rescue needs nothing of its process) or a run not in the ledger yet."""
    if not job.atomic or job.started_at is None:
        return 0.0
    pids = {r.pid for r in s.runs.get(job.id, ()) if r.attempt == job.attempts}
    claimed = job.started_at.timestamp()
    stopped = 0.0
    for event in list(facts.events):
        if event.kind != "sigstop" or event.pid not in pids or event.until is None:
            continue
        stopped += max(0.0, min(event.until, s.now) - max(event.at, claimed))
    return stopped


def _own_row_held(job: object, facts: Facts, since: float, now: float) -> bool:
    """Whether a fault held ``job``'s queue's or key's control row after its lease expired
    (``since``) and let go of it less than ``stale_after`` seconds before ``now``."""
    for event in list(facts.events):
        if not _holds_row_of(event, job) or event.at > now:
            continue
        until = event.until if event.until is not None else event.at
        if since <= until and now <= until + facts.stale_after:
            return True
    return False


def _holds_row_of(event: Event, job: object) -> bool:
    """Whether ``event`` is a fault holding ``job``'s queue's or key's control row."""
    if event.kind != "lock_control":
        return False
    names = {job.queue, job.concurrency_key}  # type: ignore[attr-defined]
    return any(f" {name}'s row" in event.detail for name in names if name)


def unique_active(s: Snapshot, facts: Facts) -> list[Violation]:
    """7. At most one job that has not ended (queued, retrying, running, or waiting: a workflow
    job waiting for its parents holds its key) per unique key: in the snapshot, and over the
    run, no job with a key was created while another with that key had not yet ended (its
    creation to its end, ``KEY_SLACK`` aside), so a holder seen by no snapshot counts too."""
    holders: dict[str, list[int]] = defaultdict(list)
    by_key: dict[str, list[Any]] = defaultdict(list)
    for job in s.jobs.values():
        if job.unique_key:
            by_key[job.unique_key].append(job)
            if job.state in KEY_HOLDING:
                holders[job.unique_key].append(job.id)
    found = [
        Violation("7 unique active", ids[0], f"unique key {key!r} held by jobs {ids}")
        for key, ids in holders.items()
        if len(ids) > 1
    ]
    for key, jobs in by_key.items():
        jobs.sort(key=lambda j: (j.created_at, j.id))
        holder = None  # the job whose holding ends last so far, and when (None: not yet)
        ends_at: float | None = 0.0
        for job in jobs:
            created = job.created_at.timestamp()
            if holder is not None and (ends_at is None or created < ends_at - KEY_SLACK):
                found.append(
                    Violation(
                        "7 unique active",
                        job.id,
                        f"unique key {key!r}: job {job.id} created at {clock(created)} while "
                        f"job {holder} held it ("
                        + ("not ended" if ends_at is None else f"ended {clock(ends_at)}")
                        + ")",
                    )
                )
            end = None if job.finished_at is None else job.finished_at.timestamp()
            if holder is None or (ends_at is not None and (end is None or end > ends_at)):
                holder, ends_at = job.id, end
    return found


def dependencies_respected(s: Snapshot, facts: Facts) -> list[Violation]:
    """8. A dependent runs only after every parent SUCCEEDED (its run starts after each
    parent's finished_at); a dependent of a failed or cancelled parent is cancelled (a
    workflow job once all its parents ended)."""
    found = []
    for job in s.jobs.values():
        parents = [s.jobs[p] for p in job.depends_on or [] if p in s.jobs]
        for run in s.runs.get(job.id, []):
            early = [
                p.id
                for p in parents
                if p.state != "succeeded"
                or p.finished_at is None
                or run.started <= p.finished_at.timestamp()
            ]
            if early:
                found.append(
                    Violation(
                        "8 dependencies", job.id, f"ran before parents {early} succeeded", [run.id]
                    )
                )
                break
        lost = [p.id for p in parents if p.state in ("failed", "cancelled")]
        # A workflow job is settled once all its parents ended (it counts them down), and a
        # workflow's closing marker ends FAILED when a member did (it closes the workflow).
        settled = job.workflow_id is None or all(p.state in FINAL for p in parents)
        if lost and settled and job.state != "cancelled" and job.workflow_role != CLOSING_ROLE:
            found.append(
                Violation("8 dependencies", job.id, f"{job.state} though parents {lost} ended")
            )
    return found


# (check, run every few seconds during the run as well as at the end)
def registered_tasks_only(s: Snapshot, facts: Facts) -> list[Violation]:
    """9. a job runs only on a worker that registers its task, and is never failed for a
    task the worker does not know."""
    found = []
    for job in s.jobs.values():
        unknown = [e for e in job.errors or [] if "no task named" in str(e.get("error", ""))]
        if unknown:
            found.append(
                Violation(
                    "9 registered only", job.id, f"failed for an unregistered task: {unknown[0]}"
                )
            )
        if job.task_name != NEWER_TASK:
            continue
        strangers = [r for r in s.runs.get(job.id, []) if r.pid not in facts.newer_pids]
        if strangers:
            found.append(
                Violation(
                    "9 registered only",
                    job.id,
                    f"run by pid {strangers[0].pid}, which does not register {NEWER_TASK}",
                    [r.id for r in strangers],
                )
            )
    return found


def returned_outcome_kept(s: Snapshot, facts: Facts) -> list[Violation]:
    """10. What a leased handler returned is its attempt's outcome: a run that returned
    normally and whose work committed (its ``tx`` row, written in the handler's session, which
    pgqueue commits after the return) never has its outcome replaced by a failed attempt
    because the outcome could not be written (``OutcomeNotRecorded``), unless its lease expired
    or its process died. A neighbour (a long transaction holding a row, an atomic job of the
    same queue, a slow queue) may delay an outcome, never turn it into a failed attempt. (A
    session whose commit lost its answer with its connection failed for a reason of its own:
    the attempt fails though its work committed, as README says of leased handlers.)"""
    found = []
    for job in s.jobs.values():
        if job.task_name in ATOMIC_TASKS:
            continue
        committed = {tx.attempt for tx in s.txs.get(job.id, [])}
        for run in s.runs.get(job.id, []):
            if run.outcome != "ok" or run.attempt not in committed:
                continue
            if interrupted(run, facts.killed) or s.rescued(run):
                continue
            errors = [e for e in s.errors_for(job.id, run.attempt) if e.startswith(NOT_RECORDED)]
            if errors:
                found.append(
                    Violation(
                        "10 returned outcome kept",
                        job.id,
                        f"attempt {run.attempt} returned but was recorded failed: "
                        f"{errors[0][:160]}",
                        [run.id],
                    )
                )
    return found


def outcomes_not_held_up(s: Snapshot, facts: Facts) -> list[Violation]:
    """11. A neighbour never holds up an outcome: a leased job that succeeded has it written
    within ``OUTCOME_DELAY`` s of its handler's return, and within ``NEIGHBOUR_DELAY`` s when
    it returned while another queue's control row (or a key's row, which only the keyed queue's
    outcomes update) was held, or while an atomic job of its own queue ran (whose transaction
    holds its job's row only), unless a fault explains the wait (a server or PgBouncer restart,
    its own process frozen or killed, a row of its own queue or key held by another
    transaction; beside a neighbour, also held rows of waiting jobs, which the outcomes of
    their parents' queue settle)."""
    found = []
    atomic_runs = _atomic_runs_by_queue(s)
    for job in s.jobs.values():
        if job.state != "succeeded" or job.task_name in ATOMIC_TASKS or job.finished_at is None:
            continue
        finished = job.finished_at.timestamp()
        runs = [
            r for r in s.runs.get(job.id, []) if r.attempt == job.attempts and r.outcome == "ok"
        ]
        if not runs or runs[-1].ended is None:
            continue
        run = runs[-1]
        waited = finished - run.ended
        if waited <= NEIGHBOUR_DELAY or interrupted(run, facts.killed):
            continue
        events = list(facts.events)
        beside = _neighbour(events, atomic_runs.get(job.queue, []), job, run.ended)
        if beside is None and waited <= OUTCOME_DELAY:
            continue
        if any(_delays(event, job, run, finished) for event in events):
            continue
        if beside is not None and any(
            _locks_dependents(e, job, run.ended, finished) for e in events
        ):
            continue
        found.append(
            Violation(
                "11 outcomes not held up",
                job.id,
                f"outcome written {waited:.1f} s after the handler returned{beside or ''}, "
                "with no fault of its own to explain it",
                [run.id],
            )
        )
    return found


def _atomic_runs_by_queue(s: Snapshot) -> dict[str, list[Run]]:
    """The atomic jobs' runs that returned, by their job's queue."""
    found: dict[str, list[Run]] = defaultdict(list)
    for job in s.jobs.values():
        if job.task_name in ATOMIC_TASKS:
            found[job.queue].extend(r for r in s.runs.get(job.id, []) if r.ended is not None)
    return found


def _neighbour(events: list[Event], atomic: list[Run], job: object, at: float) -> str | None:
    """What a neighbour was doing when ``job``'s run returned at ``at`` (None: nothing): holding
    another queue's control row, or running an atomic job of ``job``'s queue."""
    held = next((e for e in events if _neighbours_hold(e, job, at)), None)
    if held is not None:
        return f" while {held.detail} was held (another queue's)"
    running = next((r for r in atomic if r.started <= at <= (r.ended or at)), None)
    if running is not None:
        return f" while atomic job {running.job_id} of its queue ran"
    return None


def _neighbours_hold(event: Event, job: object, at: float) -> bool:
    """Whether ``event`` held, at ``at``, the control row of a queue other than ``job``'s, or
    a key's row while ``job`` is not of the keyed queue."""
    if event.kind != "lock_control" or event.until is None:
        return False
    if not event.at <= at <= event.until:
        return False
    queue = job.queue  # type: ignore[attr-defined]
    if event.detail.startswith("key "):
        return bool(queue != QUEUE_KEYED)
    return f" {queue}'s row" not in event.detail


def _locks_dependents(event: Event, job: object, ended: float, finished: float) -> bool:
    """Whether ``event`` held waiting jobs' rows between a run's end and its outcome, and the
    run's job is of the queue of the parents whose outcomes settle such jobs (a wait of that
    queue's own, not the neighbour's)."""
    if event.kind != "lock" or job.queue != QUEUE_MAIN:  # type: ignore[attr-defined]
        return False
    until = event.until if event.until is not None else event.at
    return event.at <= finished and until >= ended


def _delays(event: Event, job: object, run: Run, finished: float) -> bool:
    """Whether ``event`` explains a late outcome of ``run`` (written at ``finished``)."""
    until = event.until if event.until is not None else event.at
    if event.at > finished or until + AFTER_FAULT < run.ended:
        return False
    if event.kind in DELAYING:
        return True
    if event.kind in {"sigstop", "sigkill"}:
        # A process-pool child's outcome goes through its worker: either one's freeze delays it.
        return event.pid in run.pids
    return _holds_row_of(event, job)


# The kinds whose handler returns a result pgqueue cannot store (``app.POISONS``).
POISON_KINDS = frozenset({"poison", "atomic_poison"})


def poison_refused(s: Snapshot, facts: Facts) -> list[Violation]:
    """12. A job whose handler returns a result pgqueue cannot store never succeeds: each
    such attempt is a failed attempt with its error recorded, and at the end the job is FAILED
    (or CANCELLED by an admin move), never stuck RUNNING or retried without end."""
    found = []
    for job in s.jobs.values():
        if job.kind not in POISON_KINDS:
            continue
        if job.state == "succeeded":
            found.append(Violation("12 poison refused", job.id, "succeeded with a poison result"))
        elif facts.final and job.state not in {"failed", "cancelled"}:
            found.append(
                Violation(
                    "12 poison refused",
                    job.id,
                    f"{job.state} at the end (attempts {job.attempts}/{job.max_attempts})",
                )
            )
    return found


# The exceptions of kind ``async_interrupt`` (``app.INTERRUPTS``), and the errors a fault may
# record for its attempt instead.
INTERRUPTS = ("KeyboardInterrupt", "SystemExit")
FAULT_ENDS = (LEASE_EXPIRED, NOT_RECORDED)


def _interrupt_recorded(error: str) -> bool:
    """Whether a recorded error is an interrupt's: its traceback's last line names one."""
    lines = error.strip().splitlines()
    return bool(lines) and lines[-1].startswith(INTERRUPTS)


def interrupts_fail_their_attempt(s: Snapshot, facts: Facts) -> list[Violation]:
    """19. An async handler raising ``KeyboardInterrupt`` or ``SystemExit`` (kind
    ``async_interrupt``, on its first one or two of three attempts) fails that attempt only:
    the attempt's error names the interrupt (or a fault that cut it short), and the job goes
    on to succeed unless a fault used up its attempts; its worker is not wedged, which checks
    1 and 6 see."""
    found = []
    for job in s.jobs.values():
        if job.kind != "async_interrupt":
            continue
        for run in s.runs.get(job.id, []):
            if run.outcome != "interrupt" or interrupted(run, facts.killed):
                continue
            errors = s.errors_for(job.id, run.attempt)
            if job.state in ACTIVE and not errors:
                continue  # its outcome may still be on its way
            explained = any(_interrupt_recorded(e) or e.startswith(FAULT_ENDS) for e in errors)
            if not explained and not _history_cut(s, job.id, run.attempt):
                found.append(
                    Violation(
                        "19 interrupts fail their attempt",
                        job.id,
                        f"attempt {run.attempt} raised an interrupt; its errors: {errors}",
                        [run.id],
                    )
                )
        if facts.final and job.state == "failed":
            faults = [
                a
                for a in range(1, job.attempts + 1)
                if not any(_interrupt_recorded(e) for e in s.errors_for(job.id, a))
            ]
            if not faults:
                found.append(
                    Violation(
                        "19 interrupts fail their attempt",
                        job.id,
                        f"failed after {job.attempts} attempts, every one an interrupt",
                    )
                )
    return found


def durable_waits_kept(s: Snapshot, facts: Facts) -> list[Violation]:
    """13. Durable steps, sleeps and signals (``chaos.waiter``): the step before the sleep ran
    again only after a run that did not save it (one that died or raised, never one that
    suspended or returned); a run got past its sleep only once the sleep's time had come
    (database clock); a wait returned this job's own signal or timed out; and suspensions used
    no attempt (every attempt but the last has a recorded error)."""
    found = []
    for job in s.jobs.values():
        if job.task_name != "chaos.waiter":
            continue
        runs = s.runs.get(job.id, [])
        unsaved = sum(1 for r in runs if r.outcome not in ("suspended", "ok"))
        steps = len(s.steps.get(job.id, []))
        if steps > 1 + unsaved:
            found.append(
                Violation(
                    "13 durable waits",
                    job.id,
                    f"the step before the sleep ran {steps} times in {len(runs)} runs, "
                    f"{unsaved} of which could have died before saving it",
                    [r.id for r in runs],
                )
            )
        until = s.sleeps_until.get(job.id)
        for run in runs:
            if run.outcome != "ok" or until is None:
                continue
            past = _past_sleep_at(s, run)
            if past < until - 0.01:
                found.append(
                    Violation(
                        "13 durable waits",
                        job.id,
                        f"run {run.id} got past its sleep at {clock(past)}, before the "
                        f"sleep's end {clock(until)}",
                        [run.id],
                    )
                )
        if job.state != "succeeded":
            continue
        payload = (job.result or {}).get("payload")
        if payload not in (None, "timed out", {"job": job.id}):
            found.append(Violation("13 durable waits", job.id, f"the wait returned {payload!r}"))
        errors = job.errors or []
        failed_attempts = {e.get("attempt") for e in errors}
        if len(errors) < 10 and job.attempts > 1 + len(failed_attempts):
            found.append(
                Violation(
                    "13 durable waits",
                    job.id,
                    f"succeeded at attempt {job.attempts} with errors recorded for attempts "
                    f"{sorted(a for a in failed_attempts if a is not None)} only: a suspension "
                    "used an attempt",
                    [r.id for r in runs],
                )
            )
    return found


def _past_sleep_at(s: Snapshot, run: Run) -> float:
    """The latest moment ``run`` (one that returned) can have got past its sleep: it began after
    the sleep's end, or else the row it wrote after the sleep and the wait says when. A run that
    began before the end (one stopped and then resumed after its lease was lost, while the next
    attempt slept) got past it only when it wrote that row."""
    written = [
        tx.started
        for tx in s.txs.get(run.job_id, [])
        if tx.attempt == run.attempt
        and tx.pid == run.pid
        and tx.started >= run.started
        and (run.ended is None or tx.started <= run.ended)
    ]
    return max(run.started, min(written, default=run.started))


INVARIANTS: list[tuple[Check, bool]] = [
    (final_or_waiting, False),
    (attempts_within_max, True),
    (atomic_exactly_once, True),
    (leased_runs_explained, True),
    (limits_respected, True),
    (no_stale_running, True),
    (unique_active, True),
    (dependencies_respected, True),
    (registered_tasks_only, True),
    (returned_outcome_kept, True),
    (outcomes_not_held_up, True),
    (poison_refused, True),
    (durable_waits_kept, True),
    (interrupts_fail_their_attempt, True),
    (workflow_checks.callback_once, True),
    (workflow_checks.nothing_starts_after_a_cancel, True),
    (workflow_checks.refused_left_nothing, True),
    (workflow_checks.acted_on_whole, True),
    (workflow_checks.state_agrees_with_jobs, True),
    (history_checks.moved_once, True),
    (history_checks.moved_jobs_read_back, False),
    (pool_checks.runs_never_overlap, True),
    (pool_checks.timeouts_stop_handlers, True),
    (pool_checks.crashes_contained, True),
    (pool_checks.memory_under_cap, True),
    (edit_checks.edited_jobs_run_once, True),
    (edit_checks.edits_respected, True),
    (edit_checks.edits_audited, True),
    (edit_checks.schedule_controls_kept, True),
]
