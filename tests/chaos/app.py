"""The chaos harness's application module and the tables its handlers write.

``APP_SOURCE`` is written to a temp dir as ``chaosapp.py`` and imported both by the ``pgqueue
worker`` subprocesses and by the harness (which enqueues with the very same task objects). Every
handler run leaves a ``run`` row in ``ledger``, committed at once on a connection of its own (so
it survives whatever happens to the attempt), closed with ``ended_at`` when the handler returns.
A durable step's body writes a ``step`` row when it runs. A run that completed its work also writes a ``tx`` row: for an atomic job inside the job's own
transaction (``ctx.session``), so that row exists exactly when the attempt committed; for a
leased job in the handler's session, which pgqueue commits when the handler returns.

``chaos.newer`` is registered only where ``CHAOS_NEWER=1`` (the harness and one worker), like a
task a rolling deploy has brought to some workers only.

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
SHARED_QUEUES = [QUEUE_MAIN, QUEUE_ASYNC, QUEUE_KEYED, QUEUE_LIMITED, QUEUE_ATOMIC]

MAX_ATTEMPTS = 3
NEWER_TASK = "chaos.newer"
KEY_LIMIT = 2
ALWAYS_FAILS = "chaos: always fails"

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
    outcome text
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
import os
import time
import uuid

from sqlalchemy import text
from sqlalchemy.exc import OperationalError

from pgqueue import PgQueue, Settings, SignalTimeout, Snooze, backoff

pgq = PgQueue(os.environ["DB_URL"], settings=Settings.from_env())

BEGIN = text(
    "INSERT INTO ledger (run_token, job_id, attempt, kind, tag, pid)"
    " VALUES (:token, :job, :attempt, :kind, 'run', :pid) ON CONFLICT (run_token) DO NOTHING"
)
END = text("UPDATE ledger SET ended_at = clock_timestamp(), outcome = :outcome WHERE run_token = :token")
TX = text(
    "INSERT INTO ledger (job_id, attempt, kind, tag, pid)"
    " VALUES (:job, :attempt, :kind, 'tx', :pid)"
)
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
    own(BEGIN, {"token": token, "job": ctx.job_id, "attempt": ctx.attempt, "kind": kind, "pid": os.getpid()})
    return token


def end_run(token, outcome):
    own(END, {"token": token, "outcome": outcome})


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
'''
