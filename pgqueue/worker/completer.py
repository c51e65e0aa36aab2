"""The completer: writes the outcomes of leased attempts in batches, on its own thread.

Pool threads (and the heartbeat, for timeouts, and the shutdown, for releases) put outcomes in
an ``OutcomeBuffer``; the completer takes everything waiting (up to ``OUTCOME_BATCH``) and
writes it in one call to the store, one statement per kind, overlapping the next claims. When
the database refuses a batch, the outcomes are written one by one, and an outcome refused on its
own is replaced by a failed attempt that says why, so one bad outcome never costs the others
their write. An outcome whose lease was lost (0 rows) is dropped and reported.
"""

from __future__ import annotations

import collections
import datetime as dt
import threading
import time
from collections.abc import Callable

from pgqueue.errors import error_line, is_connection_error, is_timeout, pgqueue_logger
from pgqueue.jobs import ClaimedJob, Outcome
from pgqueue.metrics import LEASE_LOST
from pgqueue.worker.execution import Execution
from pgqueue.worker.slots import Slots
from pgqueue.worker.stats import OutcomeReport
from pgqueue.worker.store import WorkerStore

log = pgqueue_logger("pgqueue.worker")

OUTCOME_BATCH = 2000

# Jobs named in the one line about outcomes a shutdown could not write; the rest are counted.
UNWRITTEN_NAMED = 10


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

    def take(self, limit: int) -> tuple[list[tuple[Execution, Outcome]], bool]:
        """Up to ``limit`` outcomes (waiting while there are none), and whether the stop
        marker came after them."""
        with self._ready:
            items = self._items
            while not items:
                self._waiting = True
                try:
                    self._ready.wait()
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
        store: WorkerStore,
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

    def pending(self) -> bool:
        return not self.buffer.empty()

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

    def run(self) -> None:
        """The completer thread's loop."""
        while True:
            batch, stop = self.buffer.take(OUTCOME_BATCH)
            if batch:
                self._write(batch)
            if stop:
                self._report_unwritten()
                return

    def _write(self, batch: list[tuple[Execution, Outcome]]) -> None:
        self._slots.start_writing(execution for execution, _ in batch)
        written = batch
        try:
            lost = self._store.record_outcomes(outcome for _, outcome in batch)
        except Exception as exc:
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
