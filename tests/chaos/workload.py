"""The seeded job mix and the admin moves of a chaos run.

One thread draws from its own ``random.Random`` (derived from the run's seed) what to do next:
enqueue a job of some kind, cancel one, or make an admin move (pause and later resume a queue,
change the limited queue's concurrency limit, bulk-retry the jobs that always fail). The seed fixes
the sequence of choices; the interleaving with workers and faults is up to the machine. The same
thread makes the operator's moves on streams of their own: hand actions on workflows' jobs,
and the edits of ``edits`` (jobs rescheduled, run now, reprioritized; the periodic schedule
paused, resumed, run now).
"""

from __future__ import annotations

import asyncio
import dataclasses
import datetime as dt
import json
import random
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

from sqlalchemy import text
from sqlalchemy.orm import Session

from pgqueue import InvalidStateTransition, JobNotFound, PgQueue, UniqueKeyHeld, chord
from pgqueue.admin import JobFilter

from .app import (
    ALWAYS_FAILS,
    HANG_TIMEOUT,
    QUEUE_ASYNC,
    QUEUE_ATOMIC,
    QUEUE_KEYED,
    QUEUE_LIMITED,
    QUEUE_MAIN,
)
from .edits import Edits

PAUSABLE = [QUEUE_MAIN, QUEUE_ASYNC, QUEUE_KEYED, QUEUE_LIMITED, QUEUE_ATOMIC]
KEYS = ["k0", "k1", "k2", "k3"]
# The unique keys of the plain unique jobs (``_unique``), also given to workflows' jobs.
UNIQUE_KEYS = [f"u{i}" for i in range(5)]
# The results no JSON column can hold that the app's handlers return on request (app.POISONS).
POISONS = ["set", "nan", "object", "deep"]
# The interrupts an async handler raises on request (app.INTERRUPTS).
INTERRUPTS = ["KeyboardInterrupt", "SystemExit"]
# ``k3`` gets a run-time override below the task's key_limit of 2.
KEY_OVERRIDES = {"k3": 1}
INITIAL_QUEUE_LIMIT = 2
# Under the partitioned history: seconds into the run of the first ``maintain_history``, and
# between the later ones.
HISTORY_MAINTENANCE_FIRST = 15.0
HISTORY_MAINTENANCE_EVERY = 20.0
# Under the partitioned history: seconds between enqueues of a dependent of parents that were
# enqueued at least ``LATE_PARENT_AGE`` seconds before (most of them ended and moved by then).
LATE_DEPENDENT_EVERY = 2.0
LATE_PARENT_AGE = 5.0
# Seconds between two of the operator's moves (``_hand_action``).
OPERATOR_EVERY = (1.0, 3.0)
# The share of those moves that are a bulk delete of succeeded jobs instead, and the seconds
# since their end from which it takes them.
BULK_DELETE_SHARE = 0.15
BULK_DELETE_AGE = 5.0
# The share of those moves that are a prune instead, of the succeeded jobs (every task's) that
# ended that long ago: a running workflow's members stay.
PRUNE_SHARE = 0.10


@dataclass
class Event:
    """Something the harness did (a fault or an admin move), by wall clock (same host as the
    database, so comparable with the ledger's ``clock_timestamp()``)."""

    at: float
    kind: str
    detail: str
    pid: int | None = None
    until: float | None = None  # end of a SIGSTOP or of a lock hold


@dataclass
class LimitChange:
    """A change of the limited queue's concurrency limit, in force from somewhere in
    [before, after] (the call's start and return)."""

    before: float
    after: float
    limit: int
    took_effect: bool = True  # False when the call failed: committed or not, nobody knows


@dataclass
class Workload:
    """Enqueues the mix and makes admin moves until stopped."""

    app: ModuleType
    seed: int
    speed: float = 1.0
    # The run moves finished jobs to the partitioned history: the workload also keeps its
    # partitions, as an operator's daily ``pgqueue history maintain`` does, while workers move.
    history: bool = False
    events: list[Event] = field(default_factory=list)
    limits: list[LimitChange] = field(default_factory=list)
    enqueued: Counter[str] = field(default_factory=Counter)
    errors: Counter[str] = field(default_factory=Counter)
    stop_event: threading.Event = field(default_factory=threading.Event)

    def __post_init__(self) -> None:
        self.rng = random.Random(f"{self.seed}-workload")
        # The workflows' unique keys are drawn apart: the main stream's choices stay a seed's.
        self.key_rng = random.Random(f"{self.seed}-workflow-keys")
        self.jobs: list[int] = []
        self.paused: dict[str, float] = {}  # queue -> when to resume it
        self.cancels: list[tuple[float, int]] = []  # (when, job id)
        self.signals: list[tuple[float, int]] = []  # (when, job id): a signal to send then
        self.workflow_cancels_due: list[tuple[float, int]] = []  # (when, workflow id)
        # Workflow id -> when its cancel returned (committed by then).
        self.workflow_cancels: dict[int, float] = {}
        # The tag of each workflow refused for a held unique key -> (the key, its holder's id).
        self.refused_workflows: dict[str, tuple[str, int]] = {}
        # The event loop the async handler's jobs are enqueued from (``aenqueue``), one for the
        # run: the connection pgqueue keeps between single asyncio enqueues meets every fault.
        self.loop = asyncio.new_event_loop()
        self.workflow_count = 0
        # When the next ``maintain_history`` runs (on the clock, not the seed's choices, which
        # stay those of a run without it).
        self.next_maintenance = float("inf")
        # Under the partitioned history, dependents of earlier parents, on the clock and drawn
        # from their own stream like the maintenance (``_late_dependent``).
        self.next_late_dependent = float("inf")
        self.late_rng = random.Random(f"{self.seed}-late-dependents")
        self.parents: list[tuple[float, int]] = []  # (when enqueued, id) of ``_dependent``'s
        self.late_dependents_of_moved: list[int] = []  # enqueued on parents all moved
        self.late_dependents_refused: list[str] = []  # JobNotFound for parents that exist
        # An operator's hand retries and cancels of a workflow's jobs, on the clock and drawn
        # from their own stream (the main stream's choices stay a seed's); each is refused, and
        # the ones that were not are kept for the checks.
        self.operator_rng = random.Random(f"{self.seed}-operator")
        self.next_operator_move = float("inf")
        self.workflow_jobs: list[int] = []
        self.hand_actions_accepted: list[str] = []
        # When each bulk delete or prune of ended jobs returned.
        self.jobs_deleted: list[float] = []
        self.edits = Edits(self.app, self.seed, self._event, self.errors)
        self.thread = threading.Thread(target=self._loop, name="chaos-workload", daemon=True)
        self.kinds: list[tuple[float, Callable[[], None]]] = [
            (10, lambda: self._leased("leased", seconds=self.rng.uniform(0, 0.3))),
            (6, lambda: self._async("async", seconds=self.rng.uniform(0, 0.3))),
            (
                2,
                lambda: self._async(
                    "async_interrupt",
                    interrupt_until=self.rng.randint(1, 2),
                    interrupt=self.rng.choice(INTERRUPTS),
                ),
            ),
            (8, lambda: self._atomic("atomic", seconds=self.rng.uniform(0, 0.2))),
            (5, lambda: self._atomic("atomic_retrying", fail_until=self.rng.randint(1, 2))),
            (6, self._keyed),
            (5, self._limited),
            (3, self._atomic_limited),
            (0.5, self._atomic_limited_slow),
            (5, self._unique),
            (4, self._delayed),
            (4, self._dependent),
            (3, self._workflow),
            (4, lambda: self._leased("retrying", fail_until=self.rng.randint(1, 2))),
            (3, lambda: self._leased("always_fail", fail_until=99)),
            (4, lambda: self._leased("slow", seconds=self.rng.uniform(2, 6))),
            (3, self._to_cancel),
            (3, lambda: self._leased("snooze", snoozes=self.rng.randint(1, 3))),
            (2, lambda: self._misuse("rollback")),
            (2, lambda: self._misuse("commit")),
            (2, lambda: self._misuse("deferred")),
            (2, self._raw_rollback),
            (2, lambda: self._leased("poison", poison=self.rng.choice(POISONS))),
            (2, lambda: self._atomic("atomic_poison", poison=self.rng.choice(POISONS))),
            (4, self._durable_wait),
            (2, self._sql_enqueued),
            (
                3,
                lambda: self._enqueue(
                    "newer", self.app.newer, {}, seconds=self.rng.uniform(0, 0.3)
                ),
            ),
            # Light weights: each attempt of a hang takes its 2 s timeout, and only the process
            # pool's four slots serve the process-only queue (a backlog there would lengthen
            # the drain).
            (1.5, self._hang),
            (1, self._hang_shared),
            (1, self._hog),
            (1.5, self._crash),
        ]

    # -- setup and lifecycle -------------------------------------------------------------

    def setup(self) -> None:
        """Limits that must exist before the first job (a new queue limit takes up to 5 s to
        be seen by the workers)."""
        pgq = self.app.pgq
        self._set_limit(INITIAL_QUEUE_LIMIT)
        for key, limit in KEY_OVERRIDES.items():
            pgq.set_key_limit(key, limit)

    def start(self) -> None:
        self.next_operator_move = time.time() + self.operator_rng.uniform(*OPERATOR_EVERY)
        self.edits.start(time.time())
        if self.history:
            # The first pass finds the jobs moved so far in the DEFAULT partition (no day had
            # a partition yet) and adopts them into today's, while the workers go on moving.
            self.next_maintenance = time.time() + HISTORY_MAINTENANCE_FIRST
            self.next_late_dependent = time.time() + LATE_PARENT_AGE
        self.thread.start()

    def stop(self) -> None:
        """Stop choosing; resume every paused queue so the workers can drain, and end the
        operator's edits (``Edits.finish``)."""
        self.stop_event.set()
        self.thread.join(60)
        self.edits.finish()
        for queue in list(self.paused):
            # Tried until it takes: a queue left paused would leave its jobs legitimately
            # waiting, and the final checks would see nothing of them.
            for attempt in range(10):
                if self._call("resume", lambda q=queue: self._resume(q)):
                    break
                time.sleep(0.5 * (attempt + 1))
            self._event("resume", queue)
        self.paused.clear()

    def _resume(self, queue: str) -> bool:
        self.app.pgq.resume_queue(queue)
        return True

    def _loop(self) -> None:
        weights = [weight for weight, _ in self.kinds]
        actions = [action for _, action in self.kinds]
        while not self.stop_event.is_set():
            now = time.time()
            for queue, due in list(self.paused.items()):
                if due <= now:
                    # Kept until a resume takes: one a fault failed is tried again a second
                    # later (and at the stop), or the queue would stay paused to the end.
                    if self._call("resume", lambda q=queue: self._resume(q)):
                        del self.paused[queue]
                        self._event("resume", queue)
                    else:
                        self.paused[queue] = now + 1.0
            for due, job_id in [c for c in self.cancels if c[0] <= now]:
                self.cancels.remove((due, job_id))
                self._cancel(job_id)
            for due, job_id in [c for c in self.signals if c[0] <= now]:
                self.signals.remove((due, job_id))
                self._signal(job_id)
            for due, workflow_id in [c for c in self.workflow_cancels_due if c[0] <= now]:
                self.workflow_cancels_due.remove((due, workflow_id))
                self._cancel_workflow(workflow_id)
            if now >= self.next_maintenance:
                self.next_maintenance = now + HISTORY_MAINTENANCE_EVERY
                self._maintain_history()
            if now >= self.next_operator_move:
                self.next_operator_move = now + self.operator_rng.uniform(*OPERATOR_EVERY)
                self._hand_action()
            if now >= self.next_late_dependent:
                self.next_late_dependent = now + LATE_DEPENDENT_EVERY
                self._late_dependent(now)
            self.edits.step(now)
            roll = self.rng.random()
            if roll < 0.04:
                self._admin_move()
            elif roll < 0.06 and self.jobs:
                self._cancel(self.rng.choice(self.jobs[-50:]))
            else:
                self.rng.choices(actions, weights)[0]()
            self.stop_event.wait(self.rng.uniform(0.02, 0.25) / self.speed)
        self.loop.run_until_complete(self.app.pgq.adispose())
        self.loop.close()

    # -- helpers -------------------------------------------------------------------------

    def _event(self, kind: str, detail: str) -> None:
        self.events.append(Event(time.time(), kind, detail))

    def _call(self, what: str, action: Callable[[], Any]) -> Any:
        """Run an enqueue or admin call; the chaos may break its connection, which is counted
        (a job whose commit answer was lost may exist anyway: the checks read the database)."""
        try:
            return action()
        except Exception as exc:
            self.errors[f"{what}: {type(exc).__name__}"] += 1
            return None

    def _enqueue(self, kind: str, task: Any, options: dict[str, Any], **kwargs: Any) -> int | None:
        target = task.configure(**options) if options else task
        return self._counted(kind, "enqueue", lambda: target.enqueue(kind=kind, **kwargs))

    def _counted(self, kind: str, what: str, enqueue: Callable[[], int]) -> int | None:
        """``enqueue()`` through ``_call``; the job it returned counted as one of ``kind``."""
        job_id: int | None = self._call(what, enqueue)
        if job_id is not None:
            self.enqueued[kind] += 1
            self.jobs.append(job_id)
        return job_id

    def _leased(self, kind: str, options: dict[str, Any] | None = None, **kw: Any) -> int | None:
        return self._enqueue(kind, self.app.leased, options or {}, **kw)

    def _async(self, kind: str, **kw: Any) -> None:
        """A job of the async handler, enqueued from asyncio code (``aenqueue``)."""
        enqueue = self.app.leased_async.aenqueue
        self._counted(
            kind, "aenqueue", lambda: self.loop.run_until_complete(enqueue(kind=kind, **kw))
        )

    def _atomic(self, kind: str, **kw: Any) -> None:
        self._enqueue(kind, self.app.atomic, {}, **kw)

    # -- the kinds -----------------------------------------------------------------------

    def _keyed(self) -> None:
        key = self.rng.choice(KEYS)
        seconds = self.rng.uniform(0.2, 1.0)
        self._enqueue("keyed", self.app.keyed, {}, key=key, seconds=seconds)

    def _limited(self) -> None:
        self._leased("limited", {"queue": QUEUE_LIMITED}, seconds=self.rng.uniform(0.2, 1.0))

    def _atomic_limited(self) -> None:
        seconds = self.rng.uniform(0.2, 1.0)
        self._enqueue("atomic_limited", self.app.atomic, {"queue": QUEUE_LIMITED}, seconds=seconds)

    def _atomic_limited_slow(self) -> None:
        # Rare (weight 0.5): at 11 s each, a more frequent kind would take most of the limited
        # queue's one to three slots by itself, and the queue's backlog would grow all run long.
        # Longer than a leased outcome may take to be written (invariant 11): the leased jobs
        # of the queue that end while it runs must not wait for it (a claim or a transaction
        # of an atomic job that held the queue's control row would keep their outcomes
        # waiting to its end). Short enough that its own lease, which nothing extends while
        # its transaction runs, is not stale before it commits (invariant 6, which adds the
        # seconds a SIGSTOP froze its process).
        seconds = self.rng.uniform(10.5, 11.5)
        self._enqueue(
            "atomic_limited_slow", self.app.atomic, {"queue": QUEUE_LIMITED}, seconds=seconds
        )

    def _unique(self) -> None:
        key = f"u{self.rng.randint(0, 4)}"
        self._leased("unique", {"unique_key": key}, seconds=self.rng.uniform(0.2, 1.5))

    def _delayed(self) -> None:
        # Some far in the future: legitimately waiting at the end of the run.
        delay = 3600.0 if self.rng.random() < 0.2 else self.rng.uniform(0.5, 8)
        self._leased("delayed", {"delay": delay}, seconds=self.rng.uniform(0, 0.3))

    def _dependent(self) -> None:
        parents = []
        for _ in range(self.rng.randint(1, 3)):
            # 98: fails every attempt with an error bulk retries do not pick (ALWAYS_FAILS is
            # for fail_until >= 99), so a parent that failed stays failed.
            fail = 98 if self.rng.random() < 0.15 else 0
            options = {"delay": self.rng.uniform(0.5, 3)} if self.rng.random() < 0.3 else {}
            seconds = self.rng.uniform(0, 1.0)
            parent = self._leased("parent", options, seconds=seconds, fail_until=fail)
            if parent is not None:
                parents.append(parent)
                self.parents.append((time.time(), parent))
                if self.rng.random() < 0.1:
                    self.cancels.append((time.time() + self.rng.uniform(0, 1.5), parent))
        if not parents:
            return
        child = self._leased("dependent", {"depends_on": parents}, seconds=0.05)
        if child is not None and self.rng.random() < 0.3:
            self._leased("dependent", {"depends_on": [child]}, seconds=0.05)

    def _hang(self) -> None:
        """A handler that hangs past its timeout on its first one to three attempts (three: it
        fails for good), on the process-only queue: its child is stopped at the deadline, long
        before its 20 to 40 s hang ends."""
        until = self.rng.randint(1, 3)
        self._enqueue("hang", self.app.hang, {}, hang_until=until, seconds=self.rng.uniform(20, 40))

    def _hang_shared(self) -> None:
        """The same on the main queue, hanging 1 to 3 s past its timeout: in a thread, its job
        stays held until the thread returns; in a child (the process pool claims there too),
        the child is stopped at the deadline."""
        seconds = HANG_TIMEOUT + self.rng.uniform(1, 3)
        options = {"queue": QUEUE_MAIN}
        until = self.rng.randint(1, 2)
        self._enqueue("hang_shared", self.app.hang, options, hang_until=until, seconds=seconds)

    def _hog(self) -> None:
        """A handler that leaks 40 to 300 MB in its child: the child is replaced once it
        reached the pool's memory cap."""
        megabytes = self.rng.randint(40, 300)
        seconds = self.rng.uniform(0, 0.5)
        self._enqueue("hog", self.app.hog, {}, megabytes=megabytes, seconds=seconds)

    def _crash(self) -> None:
        """A handler that ends its child on its first one to three attempts: ``os._exit`` with
        a code (0 included: a child gone without an outcome is a crash, whatever its code) or
        a segfault."""
        until = self.rng.randint(1, 3)
        how = self.rng.choice(["exit", "exit", "segv"])
        code = 11 if how == "segv" else self.rng.choice([0, 1, 3, 70])
        self._enqueue("crash", self.app.crash, {}, crash_until=until, how=how, code=code)

    def _late_dependent(self, now: float) -> None:
        """A dependent of one or two parents enqueued ``LATE_PARENT_AGE`` seconds ago or more:
        under the partitioned history most have ended and been moved, and the new job must go
        by the state each was moved in (invariant 8)."""
        earlier = [job_id for at, job_id in self.parents[-200:] if at <= now - LATE_PARENT_AGE]
        if not earlier:
            return
        picked = self.late_rng.sample(earlier, min(len(earlier), self.late_rng.randint(1, 2)))
        # Counted apart when every parent had been moved before the enqueue (a move is for
        # good), so the report shows that the path through the history was taken.
        moved = self._call("late parents", lambda: self._moved_count(picked))
        kind = "late_dependent_of_moved" if moved == len(picked) else "late_dependent"
        target = self.app.leased.configure(depends_on=picked)

        def enqueue() -> int:
            try:
                return int(target.enqueue(kind=kind, seconds=0.05))
            except JobNotFound as exc:
                # A parent in either table is no missing job: a violation (invariant 18).
                self.late_dependents_refused.append(f"depends_on {picked}: {exc}")
                raise

        job_id = self._counted(kind, "enqueue", enqueue)
        if job_id is not None and kind == "late_dependent_of_moved":
            self.late_dependents_of_moved.append(job_id)

    def _moved_count(self, job_ids: list[int]) -> int:
        with self.app.pgq.engine.connect() as connection:
            return int(
                connection.execute(
                    text("SELECT count(*) FROM pgqueue_job_history WHERE id = ANY(:ids)"),
                    {"ids": job_ids},
                ).scalar_one()
            )

    def _durable_wait(self) -> None:
        sleep = self.rng.uniform(0.3, 4) if self.rng.random() < 0.7 else 0.0
        signal = "go" if self.rng.random() < 0.6 or not sleep else None
        job_id = self._enqueue(
            "durable_wait", self.app.waiter, {}, sleep=sleep, signal=signal, timeout=5.0
        )
        if job_id is not None and signal and self.rng.random() < 0.8:
            # Some before the wait begins, some after, some past its 5 s deadline.
            self.signals.append((time.time() + self.rng.uniform(0, sleep + 6), job_id))

    def _signal(self, job_id: int) -> None:
        sent = self._call("signal", lambda: self.app.pgq.signal(job_id, "go", {"job": job_id}))
        self._event("signal", f"job {job_id}: {sent}")

    def _sql_enqueued(self) -> None:
        """A leased job enqueued by the SQL function, as a trigger or another language would."""
        kwargs = json.dumps({"kind": "sql_enqueued", "seconds": self.rng.uniform(0, 0.3)})

        def enqueue() -> int:
            with self.app.pgq.engine.begin() as connection:
                return int(
                    connection.execute(
                        text(
                            "SELECT pgqueue_enqueue(task_name => 'chaos.leased',"
                            " kwargs => CAST(:kwargs AS jsonb), queue => 'chaos', max_attempts => 3)"
                        ),
                        {"kwargs": kwargs},
                    ).scalar_one()
                )

        self._counted("sql_enqueued", "sql enqueue", enqueue)

    def _workflow(self) -> None:
        """A chord of a few leased members (some failing for good, some slow) and a gather
        callback; one in five is cancelled a moment later. Most have unique keys of the plain
        unique jobs' (``_unique``) on a member or on the callback (which holds its key while it
        waits for the members), and most of those are submitted twice at once, as a repeated
        request would: refused whole (``UniqueKeyHeld``) when a key is held."""
        keys = self.key_rng.sample(UNIQUE_KEYS, 2) if self.key_rng.random() < 0.8 else []
        specs = []
        for _ in range(self.rng.randint(2, 12)):
            fail = 98 if self.rng.random() < 0.05 else self.rng.choice([0, 0, 0, 1])
            specs.append((self.rng.uniform(0, 1.5), fail))
        member_key = keys.pop() if keys and self.key_rng.random() < 0.5 else None
        callback_key = keys.pop() if keys and self.key_rng.random() < 0.7 else None
        keyed = member_key is not None or callback_key is not None
        submissions = 2 if keyed and self.key_rng.random() < 0.7 else 1
        for _ in range(submissions):
            self.workflow_count += 1
            tag = f"wf-{self.seed}-{self.workflow_count}"
            members = [
                self.app.leased.s(kind="wf_member", seconds=seconds, fail_until=fail, wf_tag=tag)
                for seconds, fail in specs
            ]
            if member_key is not None:
                members[0] = members[0].set(unique_key=member_key)
            callback = self.app.gather.s(kind="wf_callback", expected=len(members), wf_tag=tag)
            if callback_key is not None:
                callback = callback.set(unique_key=callback_key)
            in_session = keyed and self.key_rng.random() < 0.5
            self._submit_workflow(chord(members, callback), tag, in_session)

    def _submit_workflow(self, workflow: Any, tag: str, in_session: bool) -> None:
        """Enqueue ``workflow`` (tagged ``tag``), in a session of the harness's own when
        ``in_session``; a refusal is recorded for the checks."""
        try:
            if in_session:
                # In a caller's session that commits after a refusal, as a caller going on
                # with its transaction would: the refused workflow must have left nothing in it.
                with Session(self.app.pgq.engine) as session:
                    try:
                        enqueued = workflow.enqueue(session=session)
                    except UniqueKeyHeld:
                        session.commit()
                        raise
                    session.commit()
            else:
                enqueued = workflow.enqueue()
        except UniqueKeyHeld as held:
            self.refused_workflows[tag] = (held.key, held.job_id)
            self.enqueued["workflow_refused"] += 1
            return
        except Exception as exc:
            self.errors[f"enqueue: {type(exc).__name__}"] += 1
            return
        self.enqueued["workflow"] += 1
        self.jobs.extend(enqueued.job_ids)
        self.workflow_jobs.extend([*enqueued.job_ids, enqueued.closing_job_id])
        if self.rng.random() < 0.2:
            self.workflow_cancels_due.append((time.time() + self.rng.uniform(0, 2), enqueued.id))

    def _cancel_workflow(self, workflow_id: int) -> None:
        result = self._call("cancel_workflow", lambda: self.app.pgq.cancel_workflow(workflow_id))
        if result:
            self.workflow_cancels[workflow_id] = time.time()
        self._event("cancel_workflow", f"workflow {workflow_id}: {result}")

    def _to_cancel(self) -> None:
        if self.rng.random() < 0.5:
            job_id = self._leased("cancel", seconds=self.rng.uniform(2, 5))
        else:
            job_id = self._leased("cancel", {"delay": self.rng.uniform(1, 5)}, seconds=0.1)
        if job_id is not None:
            self.cancels.append((time.time() + self.rng.uniform(0, 3), job_id))

    def _misuse(self, misuse: str) -> None:
        until = 1 if self.rng.random() < 0.5 else 99
        self._atomic(f"atomic_{misuse}", misuse=misuse, misuse_until=until)

    def _raw_rollback(self) -> None:
        until = 1 if self.rng.random() < 0.5 else 99
        kind = "atomic_raw_rollback"
        self._enqueue(kind, self.app.atomic_solo, {}, misuse="raw_rollback", misuse_until=until)

    def _cancel(self, job_id: int) -> None:
        try:
            result = self.app.pgq.cancel_job(job_id)
        except InvalidStateTransition:
            result = "already finished"  # the usual answer for a job picked at random
        except Exception as exc:
            self.errors[f"cancel: {type(exc).__name__}"] += 1
            result = type(exc).__name__
        self._event("cancel", f"job {job_id}: {result}")

    # -- admin moves ---------------------------------------------------------------------

    def _hand_action(self) -> None:
        """Retry, cancel or delete one of a recent workflow's jobs (a member, the callback, the
        closing marker) by hand, as an operator pressing the button on it would: a retry or
        cancel is refused, since the workflow settles its jobs (one accepted is kept for the
        checks); a delete is refused while the workflow runs. Now and then instead
        (not under the partitioned history, whose checks read moved parents back), a routine
        bulk delete of the succeeded leased jobs that ended seconds ago: plain jobs and the
        members of ended workflows go, a running workflow's members stay (a callback short of
        one fails, which invariant 14 reports)."""
        draw = self.operator_rng.random()
        if not self.history and draw < PRUNE_SHARE:
            pruner = PgQueue(
                self.app.pgq.engine.url.render_as_string(hide_password=False),
                settings=dataclasses.replace(
                    self.app.pgq.settings, succeeded_retention=BULK_DELETE_AGE
                ),
            )
            try:
                pruned = self._call("prune", pruner.prune)
            finally:
                pruner.dispose()
            self.jobs_deleted.append(time.time())
            self._event("prune", f"{pruned} succeeded jobs")
            return
        if not self.history and draw < PRUNE_SHARE + BULK_DELETE_SHARE:
            ended_before = dt.datetime.now(dt.UTC) - dt.timedelta(seconds=BULK_DELETE_AGE)
            job_filter = JobFilter(
                task_name="chaos.leased",
                states={"succeeded"},
                until=ended_before,
                time_column="finished_at",
            )
            result = self._call("bulk_delete", lambda: self.app.pgq.admin.bulk_delete(job_filter))
            self.jobs_deleted.append(time.time())
            self._event("bulk_delete", f"{getattr(result, 'count', None)} succeeded jobs")
            return
        if not self.workflow_jobs:
            return
        job_id = self.operator_rng.choice(self.workflow_jobs[-60:])
        # Not under the partitioned history either: a member moved there is not deleted here.
        action = self.operator_rng.choice(
            ["retry", "cancel"] + ([] if self.history else ["delete"])
        )
        pgq = self.app.pgq
        try:
            if action == "delete":
                # Refused while the workflow runs; once it ended its jobs may go (invariants 14
                # and 21 see a workflow that lost a job it still needed).
                result = "deleted" if pgq.admin.delete_job(job_id) else "not found"
                self.jobs_deleted.append(time.time())
            else:
                (pgq.retry_job if action == "retry" else pgq.cancel_job)(job_id)
                result = "accepted"
                self.hand_actions_accepted.append(f"{action} of workflow job {job_id}")
        except InvalidStateTransition:
            result = "refused"
        except JobNotFound:
            result = "gone"  # deleted or pruned by an earlier move, once its workflow ended
        except Exception as exc:
            self.errors[f"hand {action}: {type(exc).__name__}"] += 1
            result = type(exc).__name__
        self._event(f"hand_{action}", f"workflow job {job_id}: {result}")

    def _set_limit(self, limit: int) -> None:
        before = time.time()
        took_effect = False
        try:
            self.app.pgq.set_queue_limit(QUEUE_LIMITED, limit)
            took_effect = True
        finally:
            # Recorded even when the call failed: its commit may have happened anyway. The
            # check then allows either limit from that call on.
            self.limits.append(LimitChange(before, time.time(), limit, took_effect))

    def _maintain_history(self) -> None:
        done = self._call("maintain_history", lambda: self.app.pgq.maintain_history(days_ahead=1))
        if done is not None:
            self._event("maintain_history", done.summary())

    def _admin_move(self) -> None:
        move = self.rng.choice(["pause", "limit", "bulk_retry"])
        if move == "pause":
            queue = self.rng.choice(PAUSABLE)
            if queue in self.paused:
                return
            self.paused[queue] = time.time() + self.rng.uniform(1, 5)
            self._call("pause", lambda: self.app.pgq.pause_queue(queue))
            self._event("pause", queue)
        elif move == "limit":
            limit = self.rng.randint(1, 3)
            self._call("limit", lambda: self._set_limit(limit))
            self._event("limit", f"{QUEUE_LIMITED} -> {limit}")
        else:
            job_filter = JobFilter(
                task_name="chaos.leased", states={"failed"}, error_contains=ALWAYS_FAILS
            )
            result = self._call("bulk_retry", lambda: self.app.pgq.admin.bulk_retry(job_filter))
            self._event("bulk_retry", f"{getattr(result, 'count', None)} jobs")
