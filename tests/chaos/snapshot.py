"""One consistent read of the jobs and the ledger, and what the checks derive from it.

The jobs are those of ``pgqueue_jobs`` and those moved to the partitioned history (a run with
``history="partitioned"``), each marked ``moved`` or not.

Read in one REPEATABLE READ transaction, so an atomic job's state and its in-transaction ledger
row (which commit together) are seen together. Runs are the ledger's ``run`` rows (one per
handler run, committed when the run began); ``tx`` rows are the runs that completed their work;
``step`` rows are the runs of a durable step's body; ``session`` rows were written through
``ctx.session`` as a run began (they exist only where that session committed). The same read
takes the periodic schedule's ticks and the audit records of the operator's edits
(``edits.ACTOR_PREFIX``), so an edit and its record are seen together.
A run's marks are written by its handler, after its claim and before its outcome, so its
interval lies within the time its job held a key's or a queue's slot (even when a frozen
process writes a mark late): more overlapping intervals than a limit means the slots were
exceeded, never a harness artefact.
"""

from __future__ import annotations

import datetime as dt
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import Engine, text

from .app import TICK_SCHEDULE
from .edits import ACTOR_PREFIX

FINAL = {"succeeded", "failed", "cancelled"}
ACTIVE = {"queued", "retrying", "running"}
LEASE_EXPIRED = "lease expired"
TRANSACTION_LOST = ("AtomicTransactionLost",)

# The jobs of both tables: ``pgqueue_jobs`` and, under ``history="partitioned"``, the finished
# jobs moved to ``pgqueue_job_history`` (``moved``), read in the same snapshot.
_JOB_COLUMNS = (
    "id, task_name, queue, kwargs::jsonb ->> 'kind' AS kind, state, attempts,"
    " max_attempts, run_at, priority, created_at, started_at, finished_at, errors, last_error,"
    " unique_key, concurrency_key, depends_on, lease_expires_at, snoozes, atomic,"
    " cancel_requested, workflow_id, workflow_role, kwargs::jsonb ->> 'wf_tag' AS wf_tag,"
    " CASE WHEN task_name IN ('chaos.waiter', 'chaos.gather') THEN result END AS result,"
    " (kwargs::jsonb ->> 'hang_until')::int AS hang_until,"
    " (kwargs::jsonb ->> 'crash_until')::int AS crash_until"
)
JOBS = text(
    f"SELECT {_JOB_COLUMNS}, false AS moved FROM pgqueue_jobs"
    f" UNION ALL SELECT {_JOB_COLUMNS}, true AS moved FROM pgqueue_job_history ORDER BY id"
)
# When each durable sleep of the waiter jobs ends (its step's saved time, database clock).
SLEEPS = text(
    "SELECT job_id, (result ->> 'until')::float8 FROM pgqueue_job_steps"
    " WHERE name = 'pgqueue:sleep:1'"
)
LEDGER = text(
    "SELECT id, job_id, attempt, kind, tag, pid, started_at, ended_at, outcome, holder, proc,"
    " rss_start, rss_end, alive_at, claimed_at, due_at FROM ledger ORDER BY started_at, id"
)
TICKS = text(
    "SELECT scheduled_at, job_id, created_at FROM pgqueue_periodic_ticks"
    " WHERE schedule_name = :name ORDER BY scheduled_at"
)
AUDIT = text(
    "SELECT id, at, actor, source, action, filter, count FROM pgqueue_audit"
    " WHERE starts_with(actor, :prefix) ORDER BY id"
)


@dataclass
class Run:
    """One ledger row."""

    id: int
    job_id: int
    attempt: int
    kind: str
    tag: str
    pid: int
    started: float
    ended: float | None
    outcome: str | None
    # The worker process holding the job's lease: ``pid`` itself, or the worker of a
    # process-pool child (None for rows other than runs).
    holder: int | None = None
    proc: str | None = None  # the process's own token (pids are reused in a long run)
    rss_start: float | None = None  # MB, as the run began
    rss_end: float | None = None  # MB, as it returned
    alive_at: float | None = None  # a hanging run's last beat
    # When its attempt was claimed and when it was due (the job's ``started_at`` and
    # ``run_at`` as the run began); None when the job's row showed another attempt by then.
    claimed: float | None = None
    due: float | None = None

    @property
    def in_child(self) -> bool:
        """Whether the run ran in a process-pool child (not in its worker's own process)."""
        return self.holder is not None and self.holder != self.pid

    @property
    def pids(self) -> set[int]:
        """The processes whose freeze or death stops or cuts off the run: its own and, for a
        process-pool child, its worker's (which holds its lease and stops it at its timeout)."""
        return {self.pid} if self.holder is None else {self.pid, self.holder}

    @property
    def last_alive(self) -> float:
        """The latest moment the run is known to have been running."""
        return max(t for t in (self.started, self.ended, self.alive_at) if t is not None)


@dataclass
class Tick:
    """One recorded tick of the periodic schedule: its cron instant, its job (None: dropped
    as missed) and when the scheduler's transaction began (database clock)."""

    scheduled: float
    job_id: int | None
    created: float


@dataclass
class AuditRow:
    """One audit record of the operator's edits."""

    id: int
    at: float  # the action's transaction began (database clock)
    actor: str
    source: str
    action: str
    target: dict[str, Any]
    count: int


@dataclass
class Snapshot:
    """Jobs by id, their runs and tx rows, the paused queues and the database's clock."""

    now: float
    jobs: dict[int, Any]
    runs: dict[int, list[Run]] = field(default_factory=lambda: defaultdict(list))
    txs: dict[int, list[Run]] = field(default_factory=lambda: defaultdict(list))
    steps: dict[int, list[Run]] = field(default_factory=lambda: defaultdict(list))
    # Rows written through ``ctx.session`` as a run began (``chaos.hang``, ``chaos.crash``):
    # present only for attempts whose session committed.
    sessions: dict[int, list[Run]] = field(default_factory=lambda: defaultdict(list))
    paused: set[str] = field(default_factory=set)
    sleeps_until: dict[int, float] = field(default_factory=dict)
    workflows: dict[int, str] = field(default_factory=dict)  # workflow id -> state
    # Ids read from both tables at once (a move must take a job out as it puts it in).
    in_both: list[int] = field(default_factory=list)
    ticks: list[Tick] = field(default_factory=list)  # the periodic schedule's, oldest first
    audit: list[AuditRow] = field(default_factory=list)  # the operator's edits', oldest first

    def errors_for(self, job_id: int, attempt: int) -> list[str]:
        """The recorded errors of ``job_id``'s attempt ``attempt`` (its last ten attempts')."""
        job = self.jobs.get(job_id)  # None: deleted or pruned by the operator once it ended
        entries = (job.errors or []) if job is not None else []
        return [str(e.get("error", "")) for e in entries if e.get("attempt") == attempt]

    def transaction_lost(self, run: Run) -> bool:
        """Whether the run's attempt is an atomic one whose transaction was lost (counted as a
        failed attempt by pgqueue, ``AtomicTransactionLost`` and its subclass)."""
        return any(e.startswith(TRANSACTION_LOST) for e in self.errors_for(run.job_id, run.attempt))

    def attempt_ended(self, run: Run) -> float | None:
        """When the outcome of the run's attempt was written (the attempt left RUNNING, giving
        back its job's slots): its recorded error's time, or the job's ``finished_at`` when the
        job ended with that attempt; None while it is unknown (the attempt is running, or ended
        without a record: a snooze, a release)."""
        job = self.jobs.get(run.job_id)
        if job is None:
            return None  # deleted or pruned by the operator once it ended
        times = [
            dt.datetime.fromisoformat(e["at"]).timestamp()
            for e in job.errors or []
            if e.get("attempt") == run.attempt and e.get("at")
        ]
        if job.state in FINAL and job.attempts == run.attempt and job.finished_at is not None:
            times.append(job.finished_at.timestamp())
        return min(times, default=None)

    def rescued(self, run: Run) -> bool:
        """Whether the run's attempt ended by lease expiry (the rescuer took the job back)."""
        return any(e.startswith(LEASE_EXPIRED) for e in self.errors_for(run.job_id, run.attempt))


def clock(epoch: float | None) -> str:
    """A time of day (UTC, milliseconds) as traces and messages print it; ``-`` for none."""
    if epoch is None:
        return "-"
    return dt.datetime.fromtimestamp(epoch, dt.UTC).strftime("%H:%M:%S.%f")[:-3]


def _epoch(value: dt.datetime | None) -> float | None:
    return None if value is None else value.timestamp()


def read(engine: Engine) -> Snapshot:
    with engine.connect() as connection:
        connection.execute(text("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ"))
        now = connection.execute(text("SELECT clock_timestamp()")).scalar_one().timestamp()
        jobs: dict[int, Any] = {}
        in_both = []
        for row in connection.execute(JOBS):
            if row.id in jobs:
                in_both.append(row.id)
            jobs[row.id] = row
        ledger = connection.execute(LEDGER).all()
        paused = set(
            connection.execute(text("SELECT name FROM pgqueue_queues WHERE paused")).scalars()
        )
        sleeps = {row[0]: row[1] for row in connection.execute(SLEEPS)}
        workflows = dict(connection.execute(text("SELECT id, state FROM pgqueue_workflows")).all())
        ticks = [
            Tick(row.scheduled_at.timestamp(), row.job_id, row.created_at.timestamp())
            for row in connection.execute(TICKS, {"name": TICK_SCHEDULE})
        ]
        audit = [
            # By position: a row's ``count`` is the tuple's method.
            AuditRow(id_, at.timestamp(), actor, source, action, dict(target or {}), count)
            for id_, at, actor, source, action, target, count in connection.execute(
                AUDIT, {"prefix": ACTOR_PREFIX}
            )
        ]
        connection.rollback()
    snapshot = Snapshot(
        now,
        jobs,
        paused=paused,
        sleeps_until=sleeps,
        workflows=workflows,
        in_both=in_both,
        ticks=ticks,
        audit=audit,
    )
    by_tag = {
        "run": snapshot.runs,
        "tx": snapshot.txs,
        "step": snapshot.steps,
        "session": snapshot.sessions,
    }
    for row in ledger:
        run = Run(
            row.id,
            row.job_id,
            row.attempt,
            row.kind,
            row.tag,
            row.pid,
            row.started_at.timestamp(),
            _epoch(row.ended_at),
            row.outcome,
            row.holder,
            row.proc,
            row.rss_start,
            row.rss_end,
            _epoch(row.alive_at),
            _epoch(row.claimed_at),
            _epoch(row.due_at),
        )
        by_tag[run.tag][run.job_id].append(run)
    for runs in snapshot.runs.values():
        # By attempt first: a process frozen between its claim and its first ledger write
        # records a run that began before a later attempt's as starting after it.
        runs.sort(key=lambda r: (r.attempt, r.started, r.id))
    return snapshot


def interrupted(run: Run, killed: dict[int, float]) -> bool:
    """A run cut short by its process's death: its PID was killed (or its supervisor was, or
    its process pool's worker) after the run began, and the handler had not returned well
    before."""
    when = killed.get(run.pid)
    if when is None or when < run.started - 1:
        return False
    return run.ended is None or run.ended > when - 0.5
