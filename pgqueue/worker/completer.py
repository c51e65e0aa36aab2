"""The completer: writes the outcomes of leased attempts in batches, on its own thread.

Pool threads (and the heartbeat, for timeouts, and the shutdown, for releases) put outcomes in
an ``OutcomeBuffer``; the completer takes everything waiting (up to ``OUTCOME_BATCH``) and
writes it in one call to the store, one statement per kind, overlapping the next claims.

A batch waits at most ``LOCK_WAIT`` for each row lock. A row held longer by another transaction
(an operator's ``SELECT ... FOR UPDATE`` of a queue's control row or of a job, a bulk action)
blocks the outcomes that update it, and only those: the batch is written again queue by queue,
and the outcomes of a queue that is still blocked are kept aside and tried again with backoff
(waiting ``RETRY_LOCK_WAIT`` each time), so other queues' outcomes are written at once; a
queue's few outcomes are then tried one by one, so that only those that need a held row (its
concurrency key's, its dependents') are kept aside, and a fresh outcome is written as any other.
Blocked outcomes are right: they are written
once the rows are free, never turned into failed attempts, and their slots stay held (so their
leases are heartbeated) until then. When the database refuses a batch, the outcomes are written one by one, and an outcome refused on its
own is replaced by a failed attempt that says why, so one bad outcome never costs the others
their write. An outcome whose lease was lost (0 rows) is dropped and reported.
"""

from __future__ import annotations

import collections
import datetime as dt
import threading
import time
from collections.abc import Callable, Iterable
from typing import Protocol

from pgqueue.errors import error_line, pgqueue_logger
from pgqueue.jobs import ClaimedJob, Outcome
from pgqueue.metrics import LEASE_LOST
from pgqueue.sqlstates import is_connection_error, is_timeout
from pgqueue.worker.execution import Execution
from pgqueue.worker.patience import Pauses, lock_timeout, write_apart
from pgqueue.worker.slots import Slots
from pgqueue.worker.stats import OutcomeReport

log = pgqueue_logger("pgqueue.worker")

OUTCOME_BATCH = 2000

# The least time from the start of one outcome write to the start of the next. A write is a
# transaction with a commit of its own, which costs the server far more than one more row in
# it: outcomes that come in while a write was just made wait for the rest of this time and go
# in one batch. An outcome that comes after a quiet spell is written at once, and so is every
# outcome while half the attempts the worker may hold are held (its claims would soon wait
# for the room the write frees: with one slot and no prefetch, after every job).
WRITE_SPACING = 0.005

# How long an outcome batch waits for a row lock before its queues are written apart. Other
# writers hold the rows outcomes update for one short statement or transaction (claims, other
# outcomes, heartbeats): a wait this long means a transaction that holds them far longer.
LOCK_WAIT = 0.5
# A queue's outcomes that wait for a row lock are tried one by one when there are at most this
# many, so that those that need no held row (another concurrency key's, another job's
# dependents) are written at once. A hold keeps the claims that need the row waiting too, so
# few outcomes ever wait on one; more are kept together rather than each waiting in turn.
SPLIT_AT_MOST = 16
# The wait of each later try of a blocked queue's outcomes, and the backoff between tries.
RETRY_LOCK_WAIT = 0.1
RETRY_FIRST = 0.2
RETRY_MAX = 2.0

# Jobs named in the one line about outcomes a shutdown could not write; the rest are counted.
UNWRITTEN_NAMED = 10


class OutcomeStore(Protocol):
    """What the completer needs of the database (``WorkerStore`` is one)."""

    def record_outcomes(
        self,
        outcomes: Iterable[Outcome],
        *,
        lock_wait: float | None = None,
        lock_rows: bool = True,
    ) -> set[int]:
        """Write ``outcomes`` in one transaction, kept trying through an outage; the ids whose
        lease was lost. With ``lock_wait``, a row lock is waited for that long at most and a
        timeout is raised, not retried. ``lock_rows``: a heartbeat of these attempts may be
        under way, so the rows are locked in its order first."""
        ...


class OutcomeBuffer:
    """Outcomes waiting for the completer, which takes everything waiting at once (up to a
    batch); ``None`` marks the stop. Producers wake the completer only while it waits."""

    def __init__(self) -> None:
        self._items: collections.deque[tuple[Execution, Outcome] | None] = collections.deque()
        self._ready = threading.Condition(threading.Lock())
        self._waiting = False

    def put(self, item: tuple[Execution, Outcome] | None) -> None:
        with self._ready:
            self._items.append(item)
            if self._waiting:
                self._ready.notify()

    def empty(self) -> bool:
        return not self._items

    def take(
        self, limit: int, timeout: float | None = None
    ) -> tuple[list[tuple[Execution, Outcome]], bool]:
        """Up to ``limit`` outcomes (waiting while there are none, at most ``timeout`` seconds
        when given), and whether the stop marker came after them."""
        with self._ready:
            items = self._items
            deadline = None if timeout is None else time.monotonic() + timeout
            while not items:
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    return [], False
                self._waiting = True
                try:
                    self._ready.wait(left)
                finally:
                    self._waiting = False
            batch: list[tuple[Execution, Outcome]] = []
            while items and len(batch) < limit:
                item = items.popleft()
                if item is None:
                    return batch, True
                batch.append(item)
            return batch, False


class Completer:
    """Takes outcomes from its buffer and writes them until ``stop``."""

    def __init__(
        self,
        *,
        store: OutcomeStore,
        slots: Slots,
        report: OutcomeReport,
        unrecorded: Callable[[ClaimedJob, Outcome, BaseException], Outcome],
        wake: threading.Event,
    ) -> None:
        self.buffer = OutcomeBuffer()
        self._store = store
        self._slots = slots
        self._report = report
        self._unrecorded = unrecorded  # the failed attempt to write instead of a refused outcome
        self._wake = wake  # the claim loop: slots held by written attempts are free again
        self._released_after: dict[int, float] = {}  # job id -> how long it ran before release
        self._given_back: set[int] = set()  # job ids released unstarted at shutdown
        self._unwritten: list[Execution] = []
        self._unwritten_because: BaseException | None = None
        # Queue -> its outcomes a held row lock kept from being written, the next try's
        # monotonic time, and the pauses between its tries.
        self._blocked: dict[str, list[tuple[Execution, Outcome]]] = {}
        self._retry_at: dict[str, float] = {}
        self._backoff: dict[str, Pauses] = {}

    def stop(self) -> None:
        """End ``run`` once everything put before is written."""
        self.buffer.put(None)

    def release(self, executions: list[Execution], ran_for: float) -> None:
        """Put back the attempts a shutdown gives up on (still running after ``ran_for``
        seconds): each is reported once its release is written, or in the one line about what
        could not be."""
        for execution in executions:
            self._released_after[execution.job.id] = ran_for
            self.buffer.put((execution, Outcome.release(execution.job)))

    def give_back(self, executions: list[Execution]) -> None:
        """Put back the claimed attempts a stopping worker did not start (its prefetch): their
        releases are counted and summed up in one line, not one per job."""
        if not executions:
            return
        log.info(
            "shutdown: giving back %d claimed job%s not started",
            len(executions),
            "" if len(executions) == 1 else "s",
        )
        for execution in executions:
            self._given_back.add(execution.job.id)
            self.buffer.put((execution, Outcome.release(execution.job)))

    def pending(self) -> bool:
        """Whether outcomes wait to be written (in the buffer, or kept aside)."""
        return not self.buffer.empty() or bool(self._blocked)

    def run(self) -> None:
        """The completer thread's loop."""
        last_write = -WRITE_SPACING
        while True:
            timeout = None
            if self._retry_at:
                timeout = max(min(self._retry_at.values()) - time.monotonic(), 0.0)
            batch, stop = self.buffer.take(OUTCOME_BATCH, timeout)
            if batch and not stop and len(batch) < OUTCOME_BATCH:
                gap = last_write + WRITE_SPACING - time.monotonic()
                if gap > 0 and not self._slots.half_held():
                    time.sleep(gap)
                    more, stop = self.buffer.take(OUTCOME_BATCH - len(batch), 0.0)
                    batch += more
            if batch:
                last_write = time.monotonic()
                self._slots.start_writing(execution for execution, _ in batch)
                self._write_fresh(batch)
            self._retry_blocked(final=stop)
            if stop:
                self._report_unwritten()
                return

    def _write_fresh(self, batch: list[tuple[Execution, Outcome]]) -> None:
        """Write a batch; when a row lock keeps it waiting, queue by queue, and the outcomes of
        a queue that still waits one by one (a few of them; more are kept together), so that
        only the outcomes that need a held row are kept aside. Outcomes of a queue that has
        some kept aside already are tried apart with a short wait: a hold is known there."""
        by_queue: dict[str, list[tuple[Execution, Outcome]]] = {}
        for item in batch:
            by_queue.setdefault(item[0].job.queue, []).append(item)
        beside_kept = {queue: items for queue, items in by_queue.items() if queue in self._blocked}
        others = {queue: items for queue, items in by_queue.items() if queue not in beside_kept}
        first_wait = self._try_write([item for items in others.values() for item in items])
        if first_wait is not None:
            for queue, items in others.items():
                # A batch of one queue's outcomes alone has just waited for these rows: the
                # same write again would wait as long, and keep the next outcomes waiting.
                waited = self._try_write(items, LOCK_WAIT) if len(others) > 1 else first_wait
                if waited is not None:
                    self._keep_those_that_wait(queue, items, waited)
        for queue, items in beside_kept.items():
            self._keep_those_that_wait(queue, items, None)

    def _keep_those_that_wait(
        self,
        queue: str,
        items: list[tuple[Execution, Outcome]],
        waited: BaseException | None,
    ) -> None:
        """Write ``items`` of ``queue``, which may need a held row (``waited``: the lock
        timeout they met together, if they did), each on its own when they are few, and keep
        aside those that still wait."""
        if len(items) > SPLIT_AT_MOST or (len(items) == 1 and waited is not None):
            waited = waited or self._try_write(items, RETRY_LOCK_WAIT)
            if waited is not None:
                self._block(queue, items, waited)
            return
        held, error = write_apart(
            items, lambda item: self._write([item], lock_wait=RETRY_LOCK_WAIT)
        )
        if held and error is not None:
            self._block(queue, held, error)

    def _try_write(
        self, items: list[tuple[Execution, Outcome]], lock_wait: float | None = LOCK_WAIT
    ) -> BaseException | None:
        """Write ``items`` waiting at most ``lock_wait`` for row locks (None: as long as the
        store's patience allows): the lock timeout when it came first (nothing written), else
        None."""
        if not items:
            return None
        return lock_timeout(lambda: self._write(items, lock_wait=lock_wait))

    def _block(
        self, queue: str, items: list[tuple[Execution, Outcome]], error: BaseException
    ) -> None:
        """Keep ``items`` of ``queue`` aside until a later try gets the row locks."""
        pauses = self._backoff.setdefault(queue, Pauses(first=RETRY_FIRST, longest=RETRY_MAX))
        if queue not in self._blocked:
            log.warning(
                "outcomes of queue %r wait for rows another transaction holds (%s); "
                "writing the other queues' outcomes meanwhile",
                queue,
                error_line(error),
            )
        self._slots.kept_waiting(execution for execution, _ in items)
        self._blocked.setdefault(queue, []).extend(items)
        self._retry_at[queue] = time.monotonic() + pauses.next()

    def _retry_blocked(self, *, final: bool) -> None:
        """Try the kept outcomes of each queue whose time came (all of them, waiting as long
        as the store's patience allows, when ``final``: the worker stops)."""
        now = time.monotonic()
        for queue in list(self._blocked):
            if not final and self._retry_at[queue] > now:
                continue
            items = self._blocked.pop(queue)
            del self._retry_at[queue]
            self._slots.start_writing(execution for execution, _ in items)
            if self._try_write(items, None if final else RETRY_LOCK_WAIT) is not None:
                self._slots.kept_waiting(execution for execution, _ in items)
                self._blocked[queue] = items
                self._retry_at[queue] = time.monotonic() + self._backoff[queue].next()
                continue
            self._backoff.pop(queue, None)
            log.info("outcomes of queue %r written after its rows were freed", queue)

    def _write(
        self, batch: list[tuple[Execution, Outcome]], *, lock_wait: float | None = None
    ) -> None:
        """Write ``batch`` and report it. With ``lock_wait``, a lock timeout is raised with
        nothing written, for the caller to keep the batch for later."""
        written = batch
        try:
            # Asked after ``start_writing``: without a heartbeat of these attempts under way,
            # nothing else waits for their rows in an order of its own.
            lost = self._store.record_outcomes(
                (outcome for _, outcome in batch),
                lock_wait=lock_wait,
                lock_rows=self._slots.heartbeat_in_flight(),
            )
        except Exception as exc:
            if lock_wait is not None and is_timeout(exc):
                raise
            if is_connection_error(exc) or is_timeout(exc):
                # The store retries a lost connection and a timeout until the worker stops; it
                # gave up during the shutdown, and writing one by one would only wait again.
                self._unwritten.extend(execution for execution, _ in batch)
                self._unwritten_because = exc
                self._slots.written(execution for execution, _ in batch)
                self._wake.set()
                return
            # Not a lost connection or a transient conflict (the store retries those): the
            # database refused something in the batch. One bad outcome must not cost the others
            # their write (a success would run again after its lease expired).
            written, lost = self._write_one_by_one(batch, exc)
        now = time.monotonic()
        self._slots.written(execution for execution, _ in batch)
        stats = self._report.stats
        released = self._released_after
        given_back = self._given_back
        for execution, outcome in written:
            if outcome.job_id in lost:
                if not execution.lease_lost:
                    stats.lost_leases += 1
                self._report.metrics.finished(
                    execution.job.queue,
                    execution.job.task_name,
                    LEASE_LOST,
                    now - execution.started,
                )
                log.warning(
                    "lease lost on job %s: %r matched no row; outcome %r of %s attempt %d "
                    "dropped (another worker owns the job)",
                    outcome.job_id,
                    str(outcome.kind),
                    str(outcome.kind),
                    execution.job.task_name,
                    execution.job.attempt,
                )
                continue
            # Releases are only put at shutdown: an empty dict costs the usual batch nothing.
            if released and (ran_for := released.pop(outcome.job_id, None)) is not None:
                log.warning(
                    "shutdown: releasing job %s (%s) still running after %.1fs",
                    outcome.job_id,
                    execution.job.task_name,
                    ran_for,
                )
            if given_back and outcome.job_id in given_back:
                given_back.discard(outcome.job_id)
                self._report.written(outcome, 0.0, execution.job, quiet=True)
                continue
            self._report.written(outcome, now - execution.started, execution.job)
        self._wake.set()

    def _report_unwritten(self) -> None:
        """One line for every outcome the shutdown could not write: which jobs, why, and when
        their leases run out (a lease was last extended before now, so by now + its length)."""
        unwritten = self._unwritten
        if not unwritten or self._unwritten_because is None:
            return
        expiry = dt.datetime.now(dt.UTC) + dt.timedelta(
            seconds=max(execution.lease_seconds for execution in unwritten)
        )
        named = ", ".join(
            f"{execution.job.id} ({execution.job.task_name}"
            f"{', still running' if execution.job.id in self._released_after else ''})"
            for execution in unwritten[:UNWRITTEN_NAMED]
        )
        more = len(unwritten) - UNWRITTEN_NAMED
        log.warning(
            "shutdown: database unavailable (%s): could not write the outcome of %d job%s: %s%s; "
            "%s running until %s by %s, then a worker's rescue pass queues %s again",
            error_line(self._unwritten_because),
            len(unwritten),
            "" if len(unwritten) == 1 else "s",
            named,
            f" and {more} more" if more > 0 else "",
            "it stays" if len(unwritten) == 1 else "they stay",
            "its lease expires" if len(unwritten) == 1 else "their leases expire",
            expiry.strftime("%Y-%m-%d %H:%M:%S UTC"),
            "it" if len(unwritten) == 1 else "them",
        )

    def _write_one_by_one(
        self, batch: list[tuple[Execution, Outcome]], error: Exception
    ) -> tuple[list[tuple[Execution, Outcome]], set[int]]:
        """Write a refused batch's outcomes one at a time; an outcome refused on its own is
        replaced by a failed attempt that records why (``Executor.unrecorded``). Returns the
        outcomes written and the ids whose lease was lost. An attempt for which nothing could
        be written is logged and left out: its row stays RUNNING until its lease expires and
        the rescuer re-queues it."""
        if len(batch) > 1:
            log.warning(
                "could not record %d outcomes at once (%s); writing them one by one",
                len(batch),
                error_line(error),
            )
        written: list[tuple[Execution, Outcome]] = []
        lost: set[int] = set()
        for execution, outcome in batch:
            refused: Exception | None = error if len(batch) == 1 else None
            if refused is None:
                try:
                    lost |= self._store.record_outcomes([outcome])
                except Exception as exc:
                    refused = exc
            if refused is not None:
                job = execution.job
                substitute = self._unrecorded(job, outcome, refused)
                log.error(
                    "job %s (%s attempt %d): outcome %r refused by the database (%s); "
                    "recording a failed attempt instead",
                    job.id,
                    job.task_name,
                    job.attempt,
                    str(outcome.kind),
                    error_line(refused),
                )
                try:
                    lost |= self._store.record_outcomes([substitute])
                except Exception:
                    log.exception(
                        "job %s: no outcome could be recorded; its lease will expire", job.id
                    )
                    continue
                outcome = substitute
            written.append((execution, outcome))
        return written, lost
