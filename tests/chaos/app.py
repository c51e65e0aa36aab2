"""The chaos harness's application module and the tables its handlers write.

``APP_SOURCE`` is written to a temp dir as ``chaosapp.py`` and imported both by the ``pgqueue
worker`` subprocesses and by the harness (which enqueues with the very same task objects). Every
handler run leaves a ``run`` row in ``ledger``, committed at once on a connection of its own (so
it survives whatever happens to the attempt), closed with ``ended_at`` when the handler returns.
A durable step's body writes a ``step`` row when it runs. A run that completed its work also writes a ``tx`` row: for an atomic job inside the job's own
transaction (``ctx.session``), so that row exists exactly when the attempt committed; for a
leased job in the handler's session, which pgqueue commits when the handler returns.

Each run row also says which worker process held the job's lease (``holder``: the run's own
``pid`` in a thread, its worker's in a process-pool child), a token of its process, the
process's resident memory as the run began and ended, and when its attempt was claimed (the
job's ``started_at``, kept here because the operator's prunes and deletes take finished jobs
away); ``chaos.hang`` beats (``alive_at``) while it hangs. ``chaos.hang`` and ``chaos.crash`` write a ``session`` row through ``ctx.session`` as
they begin, which commits only when the attempt returned in time.

``chaos.newer`` is registered only where ``CHAOS_NEWER=1`` (the harness and one worker), like a
task a rolling deploy has brought to some workers only.

``chaos.tick`` is a periodic schedule of ``chaos.leased`` (kind ``periodic``) every
``TICK_SECONDS``: every worker runs scheduler passes, and the operator pauses, resumes and runs
it now (``edits``).

Behaviour is driven by the job's keyword arguments, so the database alone says what every job
was meant to do (the harness reads ``kind`` back from ``pgqueue_jobs.kwargs``).
"""

from __future__ import annotations

# Queues: keyed jobs must not share a queue with a queue-wide limit (README: "Keyed jobs of a
# queue that also has a queue-wide concurrency or rate limit are not claimed").
QUEUE_MAIN = "chaos"
QUEUE_ASYNC = "chaos_async"
QUEUE_KEYED = "chaos_keyed"
QUEUE_LIMITED = "chaos_limited"
QUEUE_ATOMIC = "chaos_atomic"
# Raw ROLLBACK jobs run on one single-slot worker: README ("Leased and atomic tasks") leaves open
# that a second worker may claim such a job while its handler still runs.
QUEUE_ATOMIC_SOLO = "chaos_atomic_solo"
# The handlers that hang past their timeout for good, leak memory or crash their process: only
# the process-pool worker serves this queue, so each of them runs in a child the worker can stop
# or lose (in a thread they would hold a thread for good, grow the worker, or end it).
QUEUE_PROCESS = "chaos_process"
SHARED_QUEUES = [QUEUE_MAIN, QUEUE_ASYNC, QUEUE_KEYED, QUEUE_LIMITED, QUEUE_ATOMIC]

MAX_ATTEMPTS = 3
# ``chaos.hang``'s timeout (seconds): short, so its attempts end quickly.
HANG_TIMEOUT = 2.0
# The process-pool worker's ``--max-memory-per-child`` (MB) and ``--max-tasks-per-child``. A
# child starts at about 60 MB (the app imported by the fork server); ``chaos.hog`` leaks 40 to
# 300 MB, so one leak may or may not cross the cap, and two always do.
MEMORY_CAP_MB = 200
TASKS_PER_CHILD = 20
NEWER_TASK = "chaos.newer"
KEY_LIMIT = 2
ALWAYS_FAILS = "chaos: always fails"
# The periodic schedule every worker's scheduler passes enqueue, and its period (seconds, a
# divisor of 60: croniter's sixth field).
TICK_SCHEDULE = "chaos.tick"
TICK_SECONDS = 2
TICK_KIND = "periodic"

LEDGER_DDL = """
CREATE TABLE ledger (
    id bigserial PRIMARY KEY,
    run_token uuid UNIQUE,
    job_id bigint NOT NULL,
    attempt int NOT NULL,
    kind text NOT NULL,
    tag text NOT NULL,
    pid int NOT NULL,
    started_at timestamptz NOT NULL DEFAULT clock_timestamp(),
    ended_at timestamptz,
    outcome text,
    -- The worker process holding the job's lease: ``pid`` itself, or the parent worker of a
    -- process-pool child (``pid`` then differs).
    holder int,
    -- The process's own token: pids are reused within a long run, tokens never.
    proc text,
    -- The process's resident memory (MB) as the run began and as it ended.
    rss_start real,
    rss_end real,
    -- The latest moment a hanging handler was seen alive (it beats while it hangs).
    alive_at timestamptz,
    -- When the run's attempt was claimed, and when it was due: the job's started_at and run_at
    -- as the run began, null when the job's row had left that attempt by then (rescued).
    claimed_at timestamptz,
    due_at timestamptz
);
CREATE INDEX ledger_job ON ledger (job_id);
CREATE TABLE chaos_parent (id int PRIMARY KEY);
CREATE TABLE chaos_child (
    id serial PRIMARY KEY,
    parent int NOT NULL REFERENCES chaos_parent (id) DEFERRABLE INITIALLY DEFERRED
);
"""

APP_SOURCE = '''
"""Tasks of the chaos harness (tests/chaos/app.py): every run leaves rows in ``ledger``."""

import asyncio
import contextlib
import ctypes
import os
import resource
import time
import uuid

from sqlalchemy import text
from sqlalchemy.exc import DBAPIError, OperationalError

from pgqueue import PgQueue, Settings, SignalTimeout, Snooze, backoff

pgq = PgQueue(os.environ["DB_URL"], settings=Settings.from_env())

BEGIN = text(
    "INSERT INTO ledger (run_token, job_id, attempt, kind, tag, pid, holder, proc, rss_start,"
    " claimed_at, due_at) VALUES (:token, :job, :attempt, :kind, 'run', :pid, :holder, :proc,"
    " :rss, (SELECT started_at FROM pgqueue_jobs WHERE id = :job AND attempts = :attempt"
    " AND state = 'running'), (SELECT run_at FROM pgqueue_jobs WHERE id = :job"
    " AND attempts = :attempt AND state = 'running'))"
    " ON CONFLICT (run_token) DO NOTHING"
)
END = text(
    "UPDATE ledger SET ended_at = clock_timestamp(), outcome = :outcome, rss_end = :rss"
    " WHERE run_token = :token"
)
ALIVE = text("UPDATE ledger SET alive_at = clock_timestamp() WHERE run_token = :token")
TX = text(
    "INSERT INTO ledger (job_id, attempt, kind, tag, pid)"
    " VALUES (:job, :attempt, :kind, 'tx', :pid)"
)
# Written through ``ctx.session`` as a run begins: committed only if the attempt returned in
# time (a hanging or crashing attempt must leave none).
SESSION = text(
    "INSERT INTO ledger (job_id, attempt, kind, tag, pid)"
    " VALUES (:job, :attempt, :kind, 'session', :pid)"
)

# The worker process that imported this module: a handler running in another process runs in a
# process-pool child, forked (through the fork server) from this worker after the import.
WORKER_PID = os.getpid()
_PROCESS = [0, ""]  # this process's pid and token (a fork's child makes its own)


def in_child():
    return os.getpid() != WORKER_PID


def process_token():
    if _PROCESS[0] != os.getpid():
        _PROCESS[:] = [os.getpid(), uuid.uuid4().hex[:16]]
    return _PROCESS[1]


def resident_mb():
    """This process's resident memory (MB), as the pool measures it."""
    with open("/proc/self/statm", "rb") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 1_048_576
RUNS = text("SELECT count(*) FROM ledger WHERE job_id = :job AND tag = 'run'")
STEP = text(
    "INSERT INTO ledger (run_token, job_id, attempt, kind, tag, pid)"
    " VALUES (:token, :job, :attempt, :kind, 'step', :pid) ON CONFLICT (run_token) DO NOTHING"
)


def own(statement, params):
    """Run on a connection of its own, committed at once; a connection the chaos terminated is
    tried again (the token makes the insert idempotent when only its answer was lost)."""
    for attempt in range(5):
        try:
            with pgq.handler_engine.begin() as connection:
                return connection.execute(statement, params)
        except OperationalError:
            if attempt == 4:
                raise
            time.sleep(0.2 * (attempt + 1))


def begin_run(ctx, kind):
    token = str(uuid.uuid4())
    own(BEGIN, {"token": token, "job": ctx.job_id, "attempt": ctx.attempt, "kind": kind,
                "pid": os.getpid(), "holder": WORKER_PID, "proc": process_token(),
                "rss": resident_mb()})
    return token


def end_run(token, outcome):
    own(END, {"token": token, "outcome": outcome, "rss": resident_mb()})


def tx_row(session, ctx, kind):
    session.execute(TX, {"job": ctx.job_id, "attempt": ctx.attempt, "kind": kind, "pid": os.getpid()})


def runs_so_far(ctx):
    with pgq.handler_engine.connect() as connection:
        return connection.execute(RUNS, {"job": ctx.job_id}).scalar_one()


def nap(ctx, seconds):
    """Sleep, looking at the cancel flag (sync handlers cannot be interrupted)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if ctx.cancel_requested:
            return False
        time.sleep(min(0.05, max(0.0, deadline - time.monotonic())))
    return True


def nested(levels):
    value = []
    for _ in range(levels):
        value = [value]
    return value


# Results pgqueue cannot store: what a handler returning the wrong thing hands the worker (a
# set, NaN, an arbitrary object, JSON nested deeper than max_json_depth).
POISONS = {
    "set": lambda: {1, 2},
    "nan": lambda: float("nan"),
    "object": lambda: object(),
    "deep": lambda: nested(100),
}


def leased_body(ctx, kind, seconds, fail_until, snoozes, message, poison=None):
    token = begin_run(ctx, kind)
    outcome = "raised"
    try:
        if poison:
            outcome = "poison"
            return POISONS[poison]()
        if snoozes and runs_so_far(ctx) <= snoozes:
            outcome = "snooze"
            raise Snooze(0.3)
        if not nap(ctx, seconds):
            outcome = "saw_cancel"
            return "cancel seen"
        if ctx.attempt <= fail_until:
            raise RuntimeError(message)
        tx_row(ctx.session, ctx, kind)
        outcome = "ok"
        return {"pid": os.getpid(), "attempt": ctx.attempt}
    finally:
        end_run(token, outcome)


@pgq.task(name="chaos.leased", queue="chaos", pass_context=True, max_attempts=3,
          retry=backoff.constant(0.3))
def leased(ctx, kind, seconds=0.0, fail_until=0, snoozes=0, key=None, poison=None, wf_tag=None):
    message = "chaos: always fails" if fail_until >= 99 else "chaos: fails on purpose"
    return leased_body(ctx, kind, seconds, fail_until, snoozes, message, poison)


# Ticks of a schedule every worker's scheduler passes race for: each is enqueued once.
pgq.periodic("* * * * * */__TICK_SECONDS__", name=__TICK_SCHEDULE__,
             kwargs={"kind": __TICK_KIND__, "seconds": 0.05})(leased)


# A chord's callback: its run rows count its runs (each must happen once), and it checks it
# got one result per member, as a list. ``wf_tag`` (members' too) names the workload's
# workflow, so the rows of one refused for a held unique key would be found.
@pgq.task(name="chaos.gather", queue="chaos", pass_context=True, max_attempts=3,
          retry=backoff.constant(0.3))
def gather(ctx, results, kind, expected=0, wf_tag=None):
    token = begin_run(ctx, kind)
    outcome = "raised"
    try:
        if not isinstance(results, list) or len(results) != expected:
            raise RuntimeError(f"chaos: gathered {results!r}, expected {expected} results")
        tx_row(ctx.session, ctx, kind)
        outcome = "ok"
        return len(results)
    finally:
        end_run(token, outcome)


# A task only some workers register, as during a rolling deploy: the others must leave its
# jobs to them, neither failing them nor counting an attempt.
if os.environ.get("CHAOS_NEWER") == "1":
    @pgq.task(name="chaos.newer", queue="chaos", pass_context=True, max_attempts=3,
              retry=backoff.constant(0.3))
    def newer(ctx, kind, seconds=0.0):
        return leased_body(ctx, kind, seconds, 0, 0, "chaos: fails on purpose")


@pgq.task(name="chaos.keyed", queue="chaos_keyed", pass_context=True, max_attempts=3,
          retry=backoff.constant(0.3), concurrency_key=lambda kind, key, **_: key, key_limit=2)
def keyed(ctx, kind, key, seconds=0.0, fail_until=0):
    return leased_body(ctx, kind, seconds, fail_until, 0, "chaos: fails on purpose")


@pgq.task(name="chaos.async", queue="chaos_async", pass_context=True, max_attempts=3,
          retry=backoff.constant(0.3))
async def leased_async(ctx, kind, seconds=0.0, fail_until=0, interrupt_until=0, interrupt=None):
    token = await asyncio.to_thread(begin_run, ctx, kind)
    outcome = "raised"
    try:
        await asyncio.sleep(seconds)
        if ctx.attempt <= fail_until:
            raise RuntimeError("chaos: fails on purpose")
        if ctx.attempt <= interrupt_until:
            # What a handler's own Ctrl-C handling or sys.exit() raises inside the event loop.
            outcome = "interrupt"
            raise INTERRUPTS[interrupt]("chaos: interrupts on purpose")
        await asyncio.to_thread(own, TX, {"job": ctx.job_id, "attempt": ctx.attempt, "kind": kind, "pid": os.getpid()})
        outcome = "ok"
        return {"pid": os.getpid()}
    except asyncio.CancelledError:
        outcome = "cancelled"
        raise
    finally:
        await asyncio.to_thread(end_run, token, outcome)


# The exceptions asyncio lets out of its event loop (``BaseException``s a handler may raise).
INTERRUPTS = {"KeyboardInterrupt": KeyboardInterrupt, "SystemExit": SystemExit}


MISUSES = {
    "rollback": lambda ctx: ctx.session.rollback(),
    "commit": lambda ctx: ctx.session.commit(),
    # Passes the flush; only a check of deferred constraints sees the missing parent.
    "deferred": lambda ctx: ctx.session.execute(text("INSERT INTO chaos_child (parent) VALUES (-1)")),
    "raw_rollback": lambda ctx: ctx.session.execute(text("ROLLBACK")),
}


def atomic_body(ctx, kind, seconds, fail_until, misuse, misuse_until, poison=None):
    token = begin_run(ctx, kind)
    outcome = "raised"
    try:
        tx_row(ctx.session, ctx, kind)
        if seconds:
            time.sleep(seconds)
        if poison:
            outcome = "poison"
            return POISONS[poison]()
        if misuse and ctx.attempt <= misuse_until:
            outcome = "misuse"
            MISUSES[misuse](ctx)
        if ctx.attempt <= fail_until:
            raise RuntimeError("chaos: fails on purpose")
        outcome = "ok" if outcome != "misuse" else "misuse"
        return {"pid": os.getpid(), "attempt": ctx.attempt}
    finally:
        end_run(token, outcome)


@pgq.task(name="chaos.atomic", queue="chaos_atomic", atomic=True, pass_context=True,
          max_attempts=3, retry=backoff.constant(0.3))
def atomic(ctx, kind, seconds=0.0, fail_until=0, misuse=None, misuse_until=0, poison=None):
    return atomic_body(ctx, kind, seconds, fail_until, misuse, misuse_until, poison)


@pgq.task(name="chaos.atomic_solo", queue="chaos_atomic_solo", atomic=True, pass_context=True,
          max_attempts=3, retry=backoff.constant(0.3))
def atomic_solo(ctx, kind, seconds=0.0, fail_until=0, misuse=None, misuse_until=0):
    return atomic_body(ctx, kind, seconds, fail_until, misuse, misuse_until)


def step_mark(ctx, kind):
    # A token of its own: the step's body runs once here, however often ``own`` has to send
    # its row because a fault took the answer of a commit that happened.
    token = str(uuid.uuid4())
    own(STEP, {"token": token, "job": ctx.job_id, "attempt": ctx.attempt, "kind": kind, "pid": os.getpid()})
    return 1


# A durable step, then a durable sleep and a wait for a signal: the step's body runs once per
# job unless a run dies before saving it; a sleep or a wait ends the run (``Suspend``) and the
# job resumes later from the top, with no attempt used.
@pgq.task(name="chaos.waiter", queue="chaos", pass_context=True, max_attempts=3,
          retry=backoff.constant(0.3))
def waiter(ctx, kind, sleep=0.0, signal=None, timeout=5.0):
    token = begin_run(ctx, kind)
    outcome = "raised"
    try:
        ctx.step("before", step_mark, ctx, kind)
        if sleep:
            ctx.sleep(sleep)
        payload = None
        if signal:
            try:
                payload = ctx.wait_for_signal(signal, timeout=timeout)
            except SignalTimeout:
                payload = "timed out"
        tx_row(ctx.session, ctx, kind)
        outcome = "ok"
        return {"payload": payload}
    except BaseException as exc:
        if type(exc).__name__ == "Suspend":
            outcome = "suspended"
        raise
    finally:
        end_run(token, outcome)


def session_row(ctx, kind):
    ctx.session.execute(SESSION, {"job": ctx.job_id, "attempt": ctx.attempt, "kind": kind, "pid": os.getpid()})


def hang_for(token, seconds):
    """Hang, deaf to the cancel flag (as a call blocked on the network is), saying every 0.2 s
    that it is still alive (a beat lost to a fault is just skipped)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        with contextlib.suppress(DBAPIError):
            with pgq.handler_engine.begin() as connection:
                connection.execute(ALIVE, {"token": token})
        time.sleep(0.2)


# Hangs past its timeout on its first ``hang_until`` attempts, after a write through its
# session that must never commit. In a process-pool child it is stopped at the deadline, so its
# beats end there; in a thread it hangs ``seconds`` and returns, its job held meanwhile.
@pgq.task(name="chaos.hang", queue="chaos_process", pass_context=True, max_attempts=3,
          retry=backoff.constant(0.3), timeout=__HANG_TIMEOUT__)
def hang(ctx, kind, hang_until=1, seconds=30.0):
    token = begin_run(ctx, kind)
    outcome = "raised"
    try:
        session_row(ctx, kind)
        if ctx.attempt <= hang_until:
            outcome = "hung"
            hang_for(token, seconds)
            return "hung"  # only a thread gets here, past its timeout: nothing may commit
        tx_row(ctx.session, ctx, kind)
        outcome = "ok"
        return {"pid": os.getpid(), "attempt": ctx.attempt}
    finally:
        end_run(token, outcome)


LEAKED = []  # what ``chaos.hog`` leaks: only a new child gives it back


@pgq.task(name="chaos.hog", queue="chaos_process", pass_context=True, max_attempts=3,
          retry=backoff.constant(0.3))
def hog(ctx, kind, megabytes=100, seconds=0.0):
    token = begin_run(ctx, kind)
    outcome = "raised"
    try:
        if not in_child():
            outcome = "not_in_child"
            raise RuntimeError("chaos: a leak outside a process-pool child would grow its worker")
        block = bytearray(megabytes * 1_048_576)
        block[::4096] = b"\x01" * len(range(0, len(block), 4096))  # every page resident
        LEAKED.append(block)
        nap(ctx, seconds)
        tx_row(ctx.session, ctx, kind)
        outcome = "ok"
        return {"pid": os.getpid(), "megabytes": round(resident_mb())}
    finally:
        end_run(token, outcome)


def die(how, code):
    if how == "segv":
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))  # no core file of the child
        ctypes.string_at(0)
    os._exit(code)


# Ends its process on its first ``crash_until`` attempts (``os._exit(code)`` or a segfault),
# after a write through its session that must never commit; only ever in a process-pool child.
@pgq.task(name="chaos.crash", queue="chaos_process", pass_context=True, max_attempts=3,
          retry=backoff.constant(0.3))
def crash(ctx, kind, crash_until=1, how="exit", code=3):
    token = begin_run(ctx, kind)
    outcome = "raised"
    try:
        session_row(ctx, kind)
        if ctx.attempt <= crash_until:
            if not in_child():
                outcome = "not_in_child"
                raise RuntimeError("chaos: a crash outside a process-pool child would end its worker")
            outcome = f"crash {how} {code}"
            end_run(token, outcome)  # the mark first: nothing runs after the crash
            die(how, code)
        tx_row(ctx.session, ctx, kind)
        outcome = "ok"
        return {"pid": os.getpid(), "attempt": ctx.attempt}
    finally:
        end_run(token, outcome)
'''
for _placeholder, _value in [
    ("__HANG_TIMEOUT__", HANG_TIMEOUT),
    ("__TICK_SECONDS__", TICK_SECONDS),
    ("__TICK_SCHEDULE__", TICK_SCHEDULE),
    ("__TICK_KIND__", TICK_KIND),
]:
    APP_SOURCE = APP_SOURCE.replace(_placeholder, repr(_value))
