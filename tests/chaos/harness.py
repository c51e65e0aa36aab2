"""One chaos run, start to end: set up, run the workload under faults, drain, check, report.

``run()`` makes a fresh database (on the server given, else on an embedded PostgreSQL it
starts), writes the application module, starts the workers (optionally behind PgBouncer), runs
the seeded workload and faults for ``minutes`` while checking the cheap invariants every few
seconds, then stops the faults, lets the workers drain (bounded), checks every invariant, stops
the workers and returns the report. Everything it started it stops, by PID.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib.util
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

from sqlalchemy import Engine, create_engine, text
from sqlalchemy.engine import URL
from sqlalchemy.exc import DBAPIError

from pgqueue.database_urls import normalize_database_url
from pgqueue.sqlstates import is_connection_error

from . import edit_checks, invariants, pool_checks, report, snapshot
from .app import MEMORY_CAP_MB
from .cluster import (
    LEASE_SECONDS,
    RESCUE_INTERVAL,
    Bouncer,
    Workers,
    create_database,
    drop_database,
    resident_megabytes,
    write_app,
)
from .faults import Faults
from .invariants import Facts, Violation
from .workload import Event, Workload

CHECK_EVERY = 5.0
# The drain fails when no job became done for this long: a stall. While jobs keep finishing
# it goes on, up to DRAIN_CAP (an hour's run can leave the limited queue a long backlog).
DRAIN_SECONDS = 90.0
DRAIN_CAP = 1200.0
# Jobs due within this many seconds still count as work the drain waits for.
DRAIN_HORIZON = 5.0
# Under ``history=True``: seconds after finishing at which a job is moved to the partitioned
# history, short enough that most jobs move while the faults go on.
HISTORY_MOVE_AFTER = 1.0


@dataclass
class Result:
    seed: int
    violations: list[Violation]
    passed: int
    text: str
    notes: list[str] = field(default_factory=list)


def load_app(directory: Path, url: URL, settings: dict[str, str]) -> ModuleType:
    """Import ``chaosapp.py`` in this process under a unique name (one per run), with the
    workers' ``PGQUEUE_*`` ``settings``."""
    name = f"chaosapp_{directory.name}"
    spec = importlib.util.spec_from_file_location(name, directory / "chaosapp.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    # The harness enqueues every task, chaos.newer included.
    values = {
        "DB_URL": url.render_as_string(hide_password=False),
        "CHAOS_NEWER": "1",
        **settings,
    }
    saved = {name: os.environ.get(name) for name in values}
    os.environ.update(values)
    try:
        spec.loader.exec_module(module)
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
    return module


class Checker:
    """Runs the invariants, counts checks, and keeps each violation once (by invariant and
    job)."""

    def __init__(self, engine: Engine, facts: Facts) -> None:
        self.engine = engine
        self.facts = facts
        self.checks: Counter[str] = Counter()
        self.passed = 0
        self.violations: dict[tuple[str, int | None, str], Violation] = {}
        self.last: snapshot.Snapshot | None = None
        self.unreachable = 0  # periodic checks skipped: the server was restarting

    def check(self, *, final: bool) -> snapshot.Snapshot:
        snap = snapshot.read(self.engine)
        self.last = snap
        for function, periodic in invariants.INVARIANTS:
            if not (final or periodic):
                continue
            name = f"{(function.__doc__ or '').split('.')[0]} {function.__name__}"
            self.record(name, function(snap, self.facts), snap.now)
        return snap

    def record(self, name: str, found: list[Violation], now: float) -> None:
        """Count one check of invariant ``name`` at ``now`` (database clock) that found
        ``found``. One entry per invariant, job and kind of message (numbers aside): the latest
        wording (a growing run count, a growing age), seen first when it first showed and last
        at ``now``, the check its wording belongs to."""
        self.checks[name] += 1
        if not found:
            self.passed += 1
        for violation in found:
            violation.invariant = name
            key = (name, violation.job_id, re.sub(r"\d+", "N", violation.message)[:40])
            earlier = self.violations.get(key)
            violation.first_seen = earlier.first_seen if earlier else now
            violation.last_seen = now
            self.violations[key] = violation


class PoolMemory:
    """Samples the resident memory of the process-pool workers' children (from /proc): keeps
    the samples over the cap (in ``over``, for invariant 25) and the peak."""

    def __init__(self, workers: Workers, over: list[pool_checks.PoolSample]) -> None:
        self.workers = workers
        self.over = over
        self.samples = 0
        self.peak = 0.0

    def sample(self) -> None:
        for worker in self.workers.workers:
            if worker.spec.pool != "process" or worker.popen is None:
                continue
            holder = worker.popen.pid
            for pid in worker.pool_children():
                megabytes = resident_megabytes(pid)
                if megabytes is None:
                    continue  # it ended meanwhile
                self.samples += 1
                self.peak = max(self.peak, megabytes)
                if megabytes >= MEMORY_CAP_MB:
                    self.over.append(pool_checks.PoolSample(time.time(), pid, holder, megabytes))

    def note(self) -> str:
        return (
            f"process pool memory from /proc: {self.samples} samples of its children, peak "
            f"{self.peak:.0f} MB, {len(self.over)} over the {MEMORY_CAP_MB} MB cap"
        )


def _insert_key_history(engine: Engine, n: int) -> None:
    with engine.begin() as connection:
        connection.execute(
            text(
                "INSERT INTO pgqueue_concurrency_keys (key)"
                " SELECT 'customer:' || g FROM generate_series(1, :n) AS g"
            ),
            {"n": n},
        )
        connection.execute(text("ANALYZE pgqueue_concurrency_keys"))


def _say(message: str) -> None:
    print(f"[chaos {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def run(
    seed: int,
    minutes: float,
    database_url: str | None = None,
    *,
    bouncer: bool = False,
    lock_tickets: bool = False,
    keep: bool = False,
    verbose: bool = True,
    server_dir: str | None = None,
    key_history: int = 0,
    history: bool = False,
) -> Result:
    """``server_dir``: the directory of a ``tests/debian_postgres.py`` server at
    ``database_url``, which the faults may then restart; an embedded server the run starts
    itself is always restartable. Without either, the run makes no server restarts.
    ``key_history``: idle concurrency-key rows present from the start (no job has their keys),
    as a long history of keys made of customer ids leaves them. ``history``: workers and the
    harness run with ``history="partitioned"``, moving jobs ``HISTORY_MOVE_AFTER`` seconds after
    they finished."""
    say = _say if verbose else (lambda message: None)
    root = Path(tempfile.mkdtemp(prefix=f"pgqueue-chaos-{seed}-"))
    root.chmod(0o755)
    embedded = None
    restart_server: Callable[[], None] | None = None
    stack = contextlib.ExitStack()
    try:
        if database_url is None:
            from pgqueue.embedded import EmbeddedPostgres

            embedded = EmbeddedPostgres(root / "pgdata", durable=False, tcp=bouncer)
            embedded.start()
            stack.callback(embedded.stop)
            database_url = embedded.tcp_url() if bouncer else embedded.url()
            restart_server = _restart_embedded(embedded)
        elif server_dir is not None:
            restart_server = _restart_debian(server_dir)
        server = normalize_database_url(database_url)
        name = f"pgqueue_chaos_{seed}_{os.getpid()}"
        url = create_database(server, name)
        if not keep:
            stack.callback(drop_database, server, name)
        say(f"seed {seed}: database {name}, directory {root}")
        settings = {"PGQUEUE_RESCUE_INTERVAL": str(RESCUE_INTERVAL)}
        if history:
            settings.update(
                PGQUEUE_HISTORY="partitioned", PGQUEUE_HISTORY_MOVE_AFTER=str(HISTORY_MOVE_AFTER)
            )
        return _run(
            seed,
            minutes,
            url,
            root,
            bouncer,
            lock_tickets,
            restart_server,
            stack,
            say,
            key_history,
            settings,
        )
    finally:
        stack.close()
        if not keep:
            shutil.rmtree(root, ignore_errors=True)


def _run(
    seed: int,
    minutes: float,
    url: URL,
    root: Path,
    use_bouncer: bool,
    lock_tickets: bool,
    restart_server: Callable[[], None] | None,
    stack: contextlib.ExitStack,
    say: object,
    key_history: int,
    settings: dict[str, str],
) -> Result:
    assert callable(say)
    app_dir = root / "app"
    app_dir.mkdir()
    write_app(app_dir)
    direct = url.render_as_string(hide_password=False)
    env = {k: v for k, v in os.environ.items() if not k.startswith("PGQUEUE_")}
    env.update(DB_URL=direct, PYTHONUNBUFFERED="1", **settings)
    bouncer = None
    if use_bouncer:
        bouncer = Bouncer(url, str(url.database))
        bouncer.start()
        stack.callback(bouncer.close)
        env.update(
            DB_URL=bouncer.url.render_as_string(hide_password=False),
            PGQUEUE_POOLER="transaction",
            PGQUEUE_LISTEN_DATABASE_URL=direct,
        )
    # Pre-ping: the faults restart the server, which closes every pooled connection.
    engine = create_engine(
        url, pool_pre_ping=True, connect_args={"application_name": "chaos-harness"}
    )
    stack.callback(engine.dispose)
    app = load_app(app_dir, url, settings)
    stack.callback(app.pgq.dispose)
    workers = Workers(app_dir, env)
    stack.callback(workers.reap)
    workload = Workload(app, seed, history="PGQUEUE_HISTORY" in settings)
    workload.setup()
    if key_history:
        _insert_key_history(engine, key_history)
        say(f"{key_history:,} idle concurrency-key rows inserted")
    workers.start_all()
    faults = Faults(
        seed, workers, engine, bouncer, lock_tickets=lock_tickets, restart_server=restart_server
    )
    deadlocks = _deadlocks(engine)
    facts = Facts(
        killed=faults.killed,
        limits=workload.limits,
        stale_after=LEASE_SECONDS + 9,
        newer_pids=workers.newer_pids,
        events=faults.events,
        workflow_cancels=workload.workflow_cancels,
        refused_workflows=workload.refused_workflows,
        pgq=app.pgq,
        history="PGQUEUE_HISTORY" in settings,
        late_dependents_of_moved=workload.late_dependents_of_moved,
        late_dependents_refused=workload.late_dependents_refused,
        hand_actions_accepted=workload.hand_actions_accepted,
        jobs_deleted=workload.jobs_deleted,
        pool_workers={w.spec.name for w in workers.workers if w.spec.pool == "process"},
        edit_calls=workload.edits.calls,
        edited_jobs=workload.edits.jobs,
    )
    checker = Checker(engine, facts)
    sampler = PoolMemory(workers, facts.pool_samples)
    notes: list[str] = []
    if restart_server is None:
        notes.append("no server restarts: no server the run may restart")
    time.sleep(2)  # the workers' start-up, so the first faults find them
    workload.start()
    faults.start()
    say(f"running for {minutes} min")
    deadline = time.monotonic() + minutes * 60
    next_check = time.monotonic() + CHECK_EVERY
    while time.monotonic() < deadline:
        for worker in workers.workers:
            if not worker.alive and worker.spec.name not in faults.restarting:
                code = worker.popen.returncode if worker.popen else None
                notes.append(f"worker {worker.spec.name} exited by itself (code {code})")
                faults.events.append(Event(time.time(), "unexpected_exit", worker.spec.name))
                workers.start(worker)
        sampler.sample()
        if time.monotonic() >= next_check:
            try:
                checker.check(final=False)
            except DBAPIError as exc:
                if not is_connection_error(exc):
                    raise
                checker.unreachable += 1  # the server is restarting: check next time
            next_check = time.monotonic() + CHECK_EVERY
            say(
                f"{len(checker.last.jobs) if checker.last else 0} jobs, "
                f"{sum(faults.counts.values())} faults, {len(checker.violations)} violations"
            )
        time.sleep(0.5)
    say("stopping faults and the workload; draining")
    faults.stop()
    workload.stop()
    workers.continue_all()
    workers.restart_dead()
    drained = _drain(engine, DRAIN_SECONDS, DRAIN_CAP)
    if not drained:
        notes.append(
            f"the workers did not drain: no job done for {DRAIN_SECONDS:.0f} s, "
            f"or not all done within {DRAIN_CAP:.0f} s"
        )
    facts.stale_after = 3 * RESCUE_INTERVAL + 1
    facts.final = True
    final = checker.check(final=True)
    notes += pool_checks.pool_notes(final, facts)
    notes.append(edit_checks.edits_note(final, facts))
    notes.append(sampler.note())
    if facts.history:
        moved = sum(1 for job in final.jobs.values() if job.moved)
        notes.append(
            f"partitioned history: {moved} of {len(final.jobs)} jobs moved at the final check "
            f"({HISTORY_MOVE_AFTER:g} s after finishing)"
        )
        maintained = Counter(e.detail for e in workload.events if e.kind == "maintain_history")
        notes += [f"maintain_history x{n}: {detail}" for detail, n in maintained.items()]
    say("stopping the workers")
    killed = workers.stop_all()
    if killed:
        notes.append(f"workers killed at the stop (did not stop within 30 s): {killed}")
    orphans = workers.reap()
    if orphans:
        notes.append(f"worker processes left after the stop, killed: {orphans}")
    left = [j.id for j in snapshot.read(engine).jobs.values() if j.state == "running"]
    stopped = "6 left_running_after_stop"
    checker.checks[stopped] += 1
    if left and not killed:
        checker.violations[(stopped, left[0], "stop")] = Violation(
            stopped, left[0], f"jobs {left[:20]} left RUNNING after a clean stop"
        )
    elif not left or killed:
        checker.passed += 1
    if checker.unreachable:
        notes.append(f"{checker.unreachable} periodic checks skipped while the server restarted")
    deadlocks = _deadlocks(engine) - deadlocks
    if deadlocks:
        notes.append(f"the server detected {deadlocks} deadlocks in the run's database")
    notes += _log_notes(workers.logs(), workload, faults)
    violations = list(checker.violations.values())
    events = sorted([*faults.events, *workload.events], key=lambda e: e.at)
    output = report.summary(seed, final, events, checker.checks, checker.passed, violations, notes)
    if violations:
        output = report.traces(seed, final, events, violations) + "\n\n" + output
    return Result(seed, violations, checker.passed, output, notes)


def _restart_embedded(server: Any) -> Callable[[], None]:
    def restart() -> None:
        server.stop()
        server.start()

    return restart


def _restart_debian(server_dir: str) -> Callable[[], None]:
    script = Path(__file__).resolve().parents[1] / "debian_postgres.py"

    def restart() -> None:
        subprocess.run(
            [sys.executable, str(script), "restart", server_dir],
            check=True,
            capture_output=True,
            timeout=120,
        )

    return restart


def _deadlocks(engine: Engine) -> int:
    with engine.connect() as connection:
        connection.execute(text("SELECT pg_stat_clear_snapshot()"))
        return int(
            connection.execute(
                text("SELECT deadlocks FROM pg_stat_database WHERE datname = current_database()")
            ).scalar_one()
        )


def _drain(engine: Engine, seconds: float, cap: float) -> bool:
    """Wait until every job is final or legitimately waiting, none of them due within
    ``DRAIN_HORIZON`` s (a retry's short backoff would otherwise fall due right after the drain,
    before the final check); False when no more jobs became done for ``seconds``, or not all
    within ``cap``."""
    began = time.monotonic()
    deadline = began + seconds
    fewest: int | None = None
    while time.monotonic() < min(deadline, began + cap):
        snap = snapshot.read(engine)
        soon = dataclasses.replace(snap, now=snap.now + DRAIN_HORIZON)
        left = sum(invariants.not_done_reason(soon, job) is not None for job in soon.jobs.values())
        if not left:
            return True
        if fewest is None or left < fewest:
            fewest = left
            deadline = time.monotonic() + seconds
        time.sleep(1)
    return False


def _log_notes(logs: dict[str, str], workload: Workload, faults: Faults) -> list[str]:
    """What went wrong beside the invariants: the harness's own failed calls, and the
    workers' ERROR lines and tracebacks, by kind (for whoever reads the report)."""
    notes = []
    if workload.enqueued["workflow"] or workload.enqueued["workflow_refused"]:
        notes.append(
            f"workflows: {workload.enqueued['workflow']} enqueued, "
            f"{workload.enqueued['workflow_refused']} refused for a held unique key"
        )
    late = workload.enqueued["late_dependent"] + workload.enqueued["late_dependent_of_moved"]
    if late:
        notes.append(
            f"late dependents: {late} enqueued, "
            f"{workload.enqueued['late_dependent_of_moved']} of them on parents all moved"
        )
    if workload.edits.calls:
        notes.append(f"operator's edits: {workload.edits.counts()}")
    if workload.errors:
        notes.append(
            "harness calls that failed: "
            + ", ".join(f"{k} x{v}" for k, v in workload.errors.most_common(8))
        )
    if faults.errors:
        notes.append(
            "faults that failed: " + ", ".join(f"{k} x{v}" for k, v in faults.errors.most_common(5))
        )
    errors: Counter[str] = Counter()
    for log in logs.values():
        for line in log.splitlines():
            if " ERROR " in line or line.startswith("Traceback"):
                # The message without ids, numbers and times, so alike lines count together.
                shape = re.sub(r"\d+", "N", line.split(" ERROR ", 1)[-1])[:100]
                errors[shape] += 1
    if errors:
        notes.append("worker ERROR lines (by shape):")
        notes += [f"  {count:5d} {shape}" for shape, count in errors.most_common(10)]
    return notes
