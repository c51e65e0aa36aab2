"""The claim loop: fills the free slots with claimed attempts and hands them to the pool.

One claim statement takes up to <free slots> tickets, plus, while no flow control, queue
limit or atomic task exists, the prefetch (``prefetch.Pace``): attempts that wait in ``Slots``
for the pool threads to start them as their handlers return. A full claim is followed at
once by the next (more may be waiting); a short one means nothing else is ready, so the loop
waits for a wake-up: a notification (``on_notify``), a freed slot while work may be waiting,
the next future ``run_at`` that notifications announced, or the poll interval. While the claim
loop waits, a notification is claimed for on the listener thread itself (one thread hand-off
less on an idle worker's pick-up); one claimer at a time, under ``claim_lock``, so the free
slots are never over-filled.

A pool thread runs each attempt with ``run_leased``: the executor's outcome goes to the
completer, and the slot is free as soon as the handler returns, or passes to the next waiting
attempt, which the same thread runs.

What the claimer touches is named here: ``ClaimStore`` (the database: ``WorkerStore`` runs
``data.claim.claim``, whose statement is ``sql.claim.claim``) and ``ClaimSlots`` (the worker's
slot ledger, ``worker.slots.Slots``).
"""

from __future__ import annotations

import bisect
import math
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Final, Protocol

from pgqueue.errors import pgqueue_logger
from pgqueue.jobs import ClaimedJob, ClaimRequest, Outcome
from pgqueue.metrics import NO_METRICS, NoMetrics
from pgqueue.tasks import TaskRegistry
from pgqueue.worker.atomic import AtomicClaims
from pgqueue.worker.claim_health import ClaimHealth
from pgqueue.worker.execution import Execution
from pgqueue.worker.executor import CANCELLED_WHILE_RUNNING, Executor
from pgqueue.worker.notifier import wall_to_monotonic
from pgqueue.worker.patience import Pauses
from pgqueue.worker.prefetch import Pace
from pgqueue.worker.stats import WorkerStats

log = pgqueue_logger("pgqueue.worker")

# Most future run_ats a claimer remembers from notifications.
MAX_KNOWN_RUN_ATS: Final = 1024


class ClaimStore(Protocol):
    """What the claimer needs of the database (``WorkerStore`` is one)."""

    def claim(self, request: ClaimRequest) -> list[ClaimedJob]:
        """Claim the jobs ``request`` asks for (``data.claim.claim``), committed at once, kept
        trying through an outage; after a try whose answer was lost, first the jobs it claimed
        (those RUNNING under the request's worker other than its ``held()``). Never from two
        threads at once."""
        ...

    def ready_work_exists(self, queues: Sequence[str] | None, excluded: Sequence[str] = ()) -> bool:
        """Whether any ticket of ``queues`` is claimable now (drain mode's last look)."""
        ...

    @property
    def controlled(self) -> bool:
        """Whether queue limits, concurrency keys or rate limits may exist (no prefetch then)."""
        ...

    @property
    def flow_controlled(self) -> bool:
        """Whether concurrency keys or rate limits existed at the last claim's look."""
        ...

    @property
    def rate_wait(self) -> float | None:
        """Seconds from the last claim until a full rate window has room (None: none full)."""
        ...

    def close(self) -> None:
        """Give the claim connection back to the pool."""
        ...


class ClaimSlots(Protocol):
    """What the claimer needs of the worker's slot ledger (``worker.slots.Slots`` is one)."""

    returned: int
    """Handlers returned, ever: slots that came free (the prefetch's pace)."""

    def claimable(self, ahead: int) -> int:
        """How many attempts may be claimed now to fill the free slots and keep ``ahead``
        waiting (0 or less: none)."""
        ...

    def start_waiting(self) -> list[Execution]:
        """The waiting attempts that slots freed without a handler returning can take now."""
        ...

    def add(self, executions: Sequence[Execution]) -> list[Execution]:
        """Hold newly claimed attempts; those to start now (the rest wait for a slot)."""
        ...

    def handler_returned(
        self, execution: Execution
    ) -> tuple[bool | Outcome, bool, Execution | None]:
        """Free or pass on a returned handler's slot: ``(True to write the handler's outcome, or
        the timeout's outcome to write instead, or False; the claimer has room; the waiting
        attempt now started in this slot)``."""
        ...

    def running_ids(self) -> list[int]:
        """Ids of the attempts held now."""
        ...


@dataclass(frozen=True, slots=True)
class ClaimSettings:
    """What a worker's claims ask for and how often it looks."""

    worker_id: str
    queues: Sequence[str] | None  # None: every queue
    lease_seconds: float  # the default lease; tasks may have their own
    poll_interval: float  # the longest wait between claims with no wake-up
    prefetch: int = 0  # attempts claimed ahead of free slots, at most


class Claimer:
    """The claim loop of one worker (``run``), and the pool threads' ``run_leased``."""

    def __init__(
        self,
        *,
        settings: ClaimSettings,
        store: ClaimStore,
        slots: ClaimSlots,
        registry: TaskRegistry,
        executor: Executor,
        stats: WorkerStats,
        stopping: threading.Event,
        wake: threading.Event,
        submit: Callable[[Sequence[Execution]], None],
        put_outcome: Callable[[tuple[Execution, Outcome]], None],
        atomic: AtomicClaims,
        health: ClaimHealth,
        metrics: NoMetrics = NO_METRICS,
        deadline_at: Callable[[float], None] = lambda deadline: None,
    ) -> None:
        self._metrics = metrics
        # The heartbeat's: an attempt with a timeout started, whose deadline it must not miss.
        self._deadline_at = deadline_at
        self._health = health
        self._store = store
        self._slots = slots
        self._registry = registry
        self._executor = executor
        # What runs a leased attempt's handler on a pool thread: the executor, or the process
        # pool's (``worker.processes``), which hands sync handlers to the thread's child.
        self.run_handler: Callable[[Execution], Outcome] = executor.run_leased
        self._stats = stats
        self._worker_id = settings.worker_id
        self._queues = settings.queues
        self._lease_seconds = settings.lease_seconds
        self._poll_interval = settings.poll_interval
        self._stopping = stopping
        self._wake = wake
        self._submit = submit  # claimed attempts, to the pool threads
        self._put_outcome = put_outcome  # to the completer
        self._atomic_claims = atomic
        self._pace = Pace(settings.prefetch)
        # One claimer at a time (the claim loop, or the listener for a notification); the
        # store's claim connection is used under it.
        self.claim_lock = threading.Lock()
        self._backlog = True  # the last claim was full (or not tried): more may be waiting
        self._atomic: AtomicClaims | None = None  # while any task is atomic
        self._claim_on_notify = False
        self._task_leases: dict[str, float] = {}
        # Future run_ats (monotonic) that notifications announced, sorted. More than one: a
        # notification for an earlier time (anyone may send one) must not make the worker forget
        # a later one. Bounded; one dropped (the latest) is found by a poll.
        self._known_run_ats: list[float] = []
        self._known_lock = threading.Lock()
        # Set by a wake-up for new work, cleared by the claim that follows it.
        self._notified = False
        # When a full rate window has room again (monotonic), after a short claim.
        self._rate_room_at: float | None = None

    def prepare(self, drain: bool) -> None:
        """Read the tasks registered by now; before the listener starts calling ``on_notify``."""
        self._task_leases = self._registry.lease_overrides()
        self._atomic = self._atomic_claims if self._registry.has_atomic else None
        # Atomic work is claimed by the claim loop after its leased claim; in drain mode the
        # claim loop decides when the queue is empty. Both keep every claim on the claim loop.
        self._claim_on_notify = not drain and self._atomic is None

    def run(self, drain: bool, *, idle: Callable[[], bool]) -> None:
        """Claim until stopped (or, with ``drain``, until ``idle()`` and nothing is ready)."""
        pauses = Pauses(first=0.1, longest=5.0)
        while not self._stopping.is_set():
            self._wake.clear()
            try:
                with self.claim_lock:
                    notified, self._notified = self._notified, False
                    full_batch = self._claim_once(self._atomic, notified=notified)
                if (
                    drain
                    and not full_batch
                    and idle()
                    and not self._store.ready_work_exists(self._queues, self._excluded())
                ):
                    return
            except Exception as exc:
                # A claim that fails for a reason other than a lost connection (which the store
                # retries itself) must not end the worker: report, back off, try again.
                if self._stopping.is_set():
                    return
                delay = pauses.next()
                self._health.failed(exc, delay)
                self._stopping.wait(delay)
                continue
            pauses.reset()
            if full_batch:
                continue  # a full batch: more may be waiting
            woken = self._wake.wait(self._wait_timeout())
            if self._atomic is not None:
                self._atomic.after_wait(woken, self._store.controlled)

    def close(self) -> None:
        """Give the claim connection back (after a claim under way registered its jobs)."""
        with self.claim_lock:
            self._store.close()

    def _claim_once(self, atomic: AtomicClaims | None, *, notified: bool = False) -> bool:
        """Claim for the free slots and the prefetch; True when the claim was full (more may be
        waiting) and left room for more than a few.
        ``notified``: a wake-up for new work led to this claim."""
        slots = self._slots
        ahead = 0
        if atomic is None and not self._store.controlled:
            ahead = self._pace.ahead(time.monotonic(), slots.returned)
        # Slots freed without a handler returning (a timed-out one's) go to waiting attempts.
        if waiting := slots.start_waiting():
            self._submit(waiting)
        free = requested = slots.claimable(ahead)
        claimed = 0
        if free > 0:
            jobs = self._store.claim(
                ClaimRequest(
                    worker_id=self._worker_id,
                    limit=free,
                    queues=self._queues,
                    lease_seconds=self._lease_seconds,
                    task_leases=self._task_leases,
                    held=self._slots.running_ids,
                    notified=notified,
                    failed=self._health.failed,
                    excluded=self._excluded(),
                )
            )
            self._health.succeeded()
            claimed = len(jobs)
            # Fewer than asked for: nothing else is ready, so a freed slot is no reason to
            # claim again; a notification, a poll or a known run_at is. Unless flow controls
            # exist: then tickets may wait for a key's room, which a finished job gives back,
            # or for a rate window, whose time the store says.
            short = claimed < requested
            self._backlog = not short or self._store.flow_controlled
            wait = self._store.rate_wait if short else None
            self._rate_room_at = None if wait is None else time.monotonic() + wait
            self._start_leased(jobs)
            free -= claimed
        else:
            self._backlog = True  # no room to look: work may be waiting
        if atomic is not None and free > 0:
            atomic.claim(free)
        # Full, and room for more than a few: claim again at once.
        return claimed > 0 and claimed == requested and slots.claimable(ahead) > ahead // 2

    def _excluded(self) -> tuple[str, ...]:
        """The tasks this worker met and does not register, which its claims pass over."""
        unregistered = self._executor.unregistered
        return () if unregistered is None else unregistered.names

    def _wait_timeout(self) -> float:
        timeout = self._poll_interval
        if self._rate_room_at is not None:
            timeout = min(timeout, max(self._rate_room_at - time.monotonic(), 0.0))
        with self._known_lock:
            known = self._known_run_ats
            if known:
                now = time.monotonic()
                if known[0] <= now:
                    del known[: bisect.bisect_right(known, now)]
                    return 0.0
                timeout = min(timeout, known[0] - now)
        return timeout

    def on_notify(self, run_at_epoch: float | None) -> None:
        """The listener's callback: tickets are ready now (None), or at ``run_at_epoch``."""
        if run_at_epoch is not None and not math.isfinite(run_at_epoch):
            run_at_epoch = None  # no time to wait for: look now rather than never
        if run_at_epoch is None:
            if self._claim_on_notify and self.claim_lock.acquire(blocking=False):
                # The claim loop is waiting (or between claims): claim here, on the thread the
                # notification woke, instead of waking the claim loop to do it.
                try:
                    if self._stopping.is_set() or not self._claim_once(None, notified=True):
                        return
                except Exception as exc:
                    # The claim loop, woken below, tries again.
                    if not self._stopping.is_set():
                        self._health.failed(exc)
                finally:
                    self.claim_lock.release()
                # A full claim (more may be waiting) or a failed one: the claim loop goes on.
            if self._atomic is not None:
                self._atomic.notified()
            self._notified = True
            self._wake.set()
            return
        at = wall_to_monotonic(run_at_epoch)
        with self._known_lock:
            known = self._known_run_ats
            bisect.insort(known, at)
            if len(known) > MAX_KNOWN_RUN_ATS:
                known.pop()
            earliest = known[0] == at
        if earliest:
            self._wake.set()  # recompute the wait

    def _start_leased(self, jobs: Sequence[ClaimedJob]) -> None:
        if not jobs:
            return
        now = time.monotonic()
        find = self._registry.find
        leases = self._task_leases
        default_lease = self._lease_seconds
        executions = []
        for job in jobs:
            task = find(job.task_name)
            execution = Execution(
                job=job,
                lease_seconds=leases.get(job.task_name, default_lease) if leases else default_lease,
                timeout=task.timeout if task is not None else None,
                started=now,
                start_by=job.start_by,
                cancelled=job.cancel_requested,
            )
            executions.append(execution)
        start = self._slots.add(executions)
        self._stats.claimed += len(executions)
        self._metrics.claimed(len(executions))
        if start:
            self._submit(start)

    def run_leased(self, execution: Execution) -> bool:
        """Run a claimed leased attempt on a pool thread, then each waiting attempt its slot
        passes to; True when the thread must retire."""
        slots = self._slots
        run = self.run_handler
        put_outcome = self._put_outcome
        wake = self._wake
        while True:
            if execution.timeout:
                self._deadline_at(execution.started + execution.timeout)
            outcome = run(execution)
            write, room, following = slots.handler_returned(execution)
            if isinstance(write, Outcome):
                # The failed attempt its timeout decided, written now that its thread returned:
                # unless a cancel was asked for meanwhile, which ends the job instead.
                if execution.cancelled:
                    write = Outcome.cancelled(execution.job, CANCELLED_WHILE_RUNNING)
                put_outcome((execution, write))
            elif write:
                put_outcome((execution, outcome))
            # Wake the claim loop only if it may find work and can claim now: while the
            # unwritten outcomes are at their bound, the completer wakes it after the next write
            # instead, and while enough claimed attempts wait, a later handler's return does (a
            # wake-up per job would cost a thread switch per job for nothing). Already set: the
            # claim loop has not cleared it yet, and it reads the free slots only after clearing
            # it, so this handler's slot is seen (Event.set costs a lock).
            if self._backlog and room and not wake.is_set():
                wake.set()
            if following is None:
                # A timed-out handler's thread was replaced when its job was given up: retire.
                return execution.replaced
            execution = following
