"""The worker's access to the database: data-layer calls on its ``db.Database``, each one unit
of work of ``uow`` (its retry policy for transient conflicts), kept trying through an outage.

Most worker operations (claim, heartbeat, checks) are a single statement, so they run in
autocommit mode: one round trip, no BEGIN/COMMIT, and no transaction left open while handlers
run. Writes that end jobs run in one transaction with the settling of their dependents. When
the connection is lost (terminated backend, server restart) the pool drops it and the
operation is tried again on a fresh connection with capped exponential backoff, so the worker
rides out outages instead of crashing (``_keep_trying``).

Each service names the calls it makes in a protocol of its own (``worker.claimer.ClaimStore``,
``worker.completer.OutcomeStore`` and so on); this class is all of them.
"""

from __future__ import annotations

import datetime as dt
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TypeVar

from sqlalchemy import Engine
from sqlalchemy.exc import DBAPIError, OperationalError

from pgqueue import uow
from pgqueue.data import admin as admin_data
from pgqueue.data import claim as claim_data
from pgqueue.data import flow as flow_data
from pgqueue.data import history as history_data
from pgqueue.data import maintenance as maintenance_data
from pgqueue.data import outcomes as outcomes_data
from pgqueue.data import schema as schema_data
from pgqueue.data import workers as workers_data
from pgqueue.data import workflows as workflows_data
from pgqueue.data.claim import LimitsSeen
from pgqueue.db import Database, Executor
from pgqueue.errors import error_line, pgqueue_logger
from pgqueue.jobs import (
    IN_PLACE,
    ClaimedJob,
    ClaimRequest,
    JobTables,
    Lease,
    Outcome,
    Progress,
    WorkerEntry,
)
from pgqueue.sqlstates import is_connection_error, is_timeout, is_transient_conflict
from pgqueue.worker.patience import Pauses, lock_timeout, write_apart

T = TypeVar("T")
# The gauges' reading (``queue_figures``).
Figures = tuple[dict[str, dict[str, int]], dict[str, float], dict[str, int], dict[str, int]]

log = pgqueue_logger("pgqueue.worker")

# Any 64-bit constant unique to pgqueue: "pgqueue" in ASCII.
MAINTENANCE_LOCK_KEY = 0x7067717565756500 >> 8

# How long a rescue waits for a row lock before it rescues queue by queue, then job by job
# (``RESCUE_RETRY_LOCK_WAIT`` each), and how many jobs one pass tries one by one at most: the
# rest of a queue whose row stays held wait for the next pass.
RESCUE_LOCK_WAIT = 0.5
RESCUE_RETRY_LOCK_WAIT = 0.1
RESCUE_ONE_BY_ONE = 20
# The longest an outcome write that keeps trying waits for a row lock per try: between tries the
# rows of its jobs are free again.
KEEP_TRYING_LOCK_WAIT = 2.0

# How long a stopping worker keeps trying to write outcomes to a database it cannot reach: long
# enough for a server restart or a failover's switch, short of a process manager's kill timeout.
SHUTDOWN_WRITE_PATIENCE = 5.0


class WorkerStore:
    """Database operations used by a worker, safe to call from several threads; ``tables`` is
    where the worker's settings put jobs."""

    def __init__(
        self, engine: Engine, *, stopping: threading.Event, tables: JobTables = IN_PLACE
    ) -> None:
        self._database = Database(engine, tables=lambda: tables)
        self._stopping = stopping
        # The claimer's own connection (claims are serialized by the worker, see ``claim``).
        self._claim_connection = self._database.held_connection()
        self._limits = LimitsSeen()
        self._atomic_limits = LimitsSeen()
        # Set at the first failed write after the worker began to stop: the writes of the whole
        # shutdown share this one deadline.
        self._shutdown_write_deadline: float | None = None

    def _run(
        self,
        what: str,
        work: Callable[[Executor], T],
        *,
        give_up_when_stopping: bool,
        autocommit: bool = True,
        failed: Callable[[BaseException, float], None] | None = None,
        through_timeouts: bool = False,
    ) -> T:
        """``work`` as one unit of work (``uow.run``: its retry policy for transient conflicts),
        kept trying through an outage (``_keep_trying``)."""
        database = self._database
        return self._keep_trying(
            what,
            lambda: uow.run(database, work, autocommit=autocommit),
            give_up_when_stopping=give_up_when_stopping,
            failed=failed,
            through_timeouts=through_timeouts,
        )

    def _keep_trying(
        self,
        what: str,
        once: Callable[[], T],
        *,
        give_up_when_stopping: bool,
        failed: Callable[[BaseException, float], None] | None = None,
        through_timeouts: bool = False,
    ) -> T:
        """``once()`` (a unit of work that already retried what its policy retries), again
        with capped exponential backoff while the database is unreachable or keeps conflicting:
        a worker rides out an outage instead of crashing. Each such failure is logged, or given
        to ``failed`` (the error, the delay before the next try) when the caller reports them
        itself. With ``through_timeouts``, a statement or lock timeout is tried again too. Once
        the worker is stopping, work that does not give up at once is tried for
        ``SHUTDOWN_WRITE_PATIENCE`` seconds at most, without a line per failure: the shutdown
        reports what it could not write, once."""
        pauses = Pauses(first=0.05, longest=2.0)
        while True:
            try:
                return once()
            except (DBAPIError, OperationalError) as exc:
                if not _outage(exc, through_timeouts=through_timeouts):
                    raise
                if self._stopping.is_set():
                    if give_up_when_stopping or self._shutdown_patience_spent():
                        raise
                    time.sleep(pauses.next())
                    continue
                delay = pauses.next()
                if failed is not None:
                    failed(exc, delay)
                else:
                    log.warning(
                        "%s: %s (%s); retrying in %.2fs",
                        what,
                        "timed out" if is_timeout(exc) else "database unavailable",
                        error_line(exc),
                        delay,
                    )
                time.sleep(delay)

    def _shutdown_patience_spent(self) -> bool:
        now = time.monotonic()
        if self._shutdown_write_deadline is None:
            self._shutdown_write_deadline = now + SHUTDOWN_WRITE_PATIENCE
        return now >= self._shutdown_write_deadline

    def claim(self, request: ClaimRequest) -> list[ClaimedJob]:
        """See ``worker.claimer.ClaimStore.claim``.

        A claim commits by itself (autocommit), so when the connection breaks after the commit
        but before the answer arrives, its jobs are RUNNING under this worker's name and nobody
        runs them; left alone they would wait for their leases to expire. So after a failed
        attempt the retry first takes those jobs (their attempt is already counted) and only
        claims anew when there are none. Only jobs claimed since this call began (plus a second
        for the gap between the clocks' readings) qualify: a job this worker gave up on earlier
        (its outcome could not be written) is left to its lease, as documented.

        The first attempt runs on the store's own claim connection (kept checked out,
        autocommit), retries on pooled connections.
        """
        began = time.monotonic()

        worker_id, failed = request.worker_id, request.failed

        def claim_on(db: Executor) -> list[ClaimedJob]:
            return self._claim_on(db, request, atomic=False)

        try:
            return claim_on(self._claim_connection)
        except (DBAPIError, OperationalError) as exc:
            if not _outage(exc, through_timeouts=False):
                raise
            if self._stopping.is_set():
                raise
            if failed is not None:
                failed(exc, None)
            else:
                log.warning("claim: database unavailable (%s); retrying", error_line(exc))

        def work(db: Executor) -> list[ClaimedJob]:
            orphans = claim_data.claimed_by(
                db, worker_id=worker_id, held=request.held(), within=time.monotonic() - began + 1.0
            )
            if orphans:
                log.warning(
                    "claim: took back %d jobs claimed by the attempt whose answer was lost",
                    len(orphans),
                )
                return orphans
            return claim_on(db)

        return self._run("claim", work, give_up_when_stopping=True, failed=failed)

    def claim_atomic(self, request: ClaimRequest) -> list[ClaimedJob]:
        """See ``worker.atomic.AtomicStore.claim_atomic``: ``data.claim.claim`` of atomic jobs,
        committed at once on a pooled connection, with a look of its own at which controls
        exist (the leased claim's decides that claim's variant and wait). A claim whose
        answer was lost with its connection is not taken back: its jobs are rescued when their
        leases expire."""
        return self._run(
            "atomic claim",
            lambda db: self._claim_on(db, request, atomic=True),
            give_up_when_stopping=True,
        )

    def _claim_on(self, db: Executor, request: ClaimRequest, *, atomic: bool) -> list[ClaimedJob]:
        """``data.claim.claim`` of ``request`` on ``db``, committing at once; leased and atomic
        claims each keep their own look at which controls exist."""
        return claim_data.claim(
            db,
            worker_id=request.worker_id,
            limit=request.limit,
            queues=request.queues,
            lease_seconds=request.lease_seconds,
            task_leases=request.task_leases,
            atomic=atomic,
            limits=self._atomic_limits if atomic else self._limits,
            notified=request.notified,
            autocommit=True,
            excluded=request.excluded,
        )

    @property
    def flow_controlled(self) -> bool:
        """Whether concurrency keys or rate limits existed at the last look: a short claim may
        then have left work that a freed slot can take."""
        return self._limits.flow

    @property
    def controlled(self) -> bool:
        """Whether queue limits, concurrency keys or rate limits may exist (at the last look,
        or not looked yet): claimed attempts then hold room that others may need."""
        return self._limits.exist or self._limits.flow

    @property
    def rate_wait(self) -> float | None:
        """Seconds from the last claim until a full rate window has room (None: none full)."""
        return self._limits.rate_wait

    def close(self) -> None:
        """Give the claim connection back to the pool (the worker calls this when it stops)."""
        self._claim_connection.close()

    def record_outcomes(
        self,
        outcomes: Iterable[Outcome],
        *,
        lock_wait: float | None = None,
        lock_rows: bool = True,
    ) -> set[int]:
        """Write ``outcomes`` in one transaction; the ids whose lease was lost.

        One transaction: an outcome and the settling of its dependents commit together. In
        autocommit, a worker dying between the two statements would leave dependents WAITING
        for good, with nothing left to release them. A statement or lock timeout means rows
        of the batch are held by another transaction (an operator's, a long bulk action):
        the outcomes are right, so they wait and are written again, never turned into failed
        attempts; the heartbeat keeps their leases meanwhile. With ``lock_wait`` (seconds)
        each row lock is waited for that long at most, and a timeout is raised, not retried:
        the caller writes what is not blocked and keeps the rest for later. Without it, each
        try still waits ``KEEP_TRYING_LOCK_WAIT`` at most: a write blocked for long must not
        keep its jobs' rows locked meanwhile, since the rescue skips locked rows (and their
        leases are not extended while their outcome is being written). ``lock_rows``: see
        ``data.outcomes.record_outcomes``."""
        items = list(outcomes)
        wait = KEEP_TRYING_LOCK_WAIT if lock_wait is None else lock_wait
        wait_ms = max(1, round(wait * 1000))
        return self._run(
            "record outcomes",
            lambda db: outcomes_data.record_outcomes(
                db, items, lock_wait_ms=wait_ms, lock_rows=lock_rows
            ),
            give_up_when_stopping=False,
            autocommit=False,
            through_timeouts=lock_wait is None,
        )

    def end_session(self, pid: int) -> bool:
        """End the server session ``pid`` (an atomic attempt's, at its timeout): its open
        transaction rolls back; whether the server signalled it."""
        return self._run(
            "atomic timeout",
            lambda db: schema_data.end_backend(db, pid),
            give_up_when_stopping=True,
        )

    def heartbeat(
        self, leases: Sequence[Lease], worker: WorkerEntry | None, progress: Mapping[int, Progress]
    ) -> dict[int, bool]:
        return self._run(
            "heartbeat",
            lambda db: outcomes_data.heartbeat(db, leases, worker, progress),
            give_up_when_stopping=True,
        )

    def worker_seen(self, worker: WorkerEntry) -> dt.datetime:
        return self._run(
            "worker registry",
            lambda db: workers_data.worker_seen(db, worker),
            give_up_when_stopping=True,
        )

    def unregister_worker(self, worker_id: str) -> None:
        self._run(
            "worker registry",
            lambda db: workers_data.unregister_worker(db, worker_id),
            give_up_when_stopping=True,
        )

    def delete_stale_workers(self, stale_seconds: float) -> list[str]:
        return self._run(
            "stale workers",
            lambda db: workers_data.delete_stale_workers(db, stale_seconds),
            give_up_when_stopping=True,
        )

    def rescue_expired(self, *, limit: int, error: str) -> list[tuple[int, str]]:
        """Re-queue or end up to ``limit`` jobs whose lease expired; ``(id, new state)``.

        A rescue also updates rows besides the job's: a limited queue's or key's control row,
        a job's waiting dependents. Another transaction holding one of those (an operator's
        ``SELECT ... FOR UPDATE``, a long bulk action) must hold up the jobs that need it, not
        every expired job: the pass waits ``RESCUE_LOCK_WAIT`` at most, and when a row stays
        held the jobs are rescued queue by queue, then one by one, the blocked ones left to
        a later pass."""
        if not self._run(
            "rescue check", maintenance_data.expired_lease_exists, give_up_when_stopping=True
        ):
            return []
        rescued: list[tuple[int, str]] = []

        def rescue(ids: list[int] | None, *, most: int, lock_wait: float) -> None:
            rescued.extend(self._rescue(limit=most, error=error, ids=ids, lock_wait=lock_wait))

        if lock_timeout(lambda: rescue(None, most=limit, lock_wait=RESCUE_LOCK_WAIT)) is None:
            return rescued
        expired = self._run(
            "rescue candidates",
            lambda db: maintenance_data.expired_leases(db, limit=limit),
            give_up_when_stopping=True,
        )
        by_queue: dict[str, list[int]] = {}
        for job_id, queue in expired:
            by_queue.setdefault(queue, []).append(job_id)
        held_queues, _ = write_apart(
            by_queue.values(), lambda ids: rescue(ids, most=limit, lock_wait=RESCUE_LOCK_WAIT)
        )
        blocked = [job_id for ids in held_queues for job_id in ids]
        left, _ = write_apart(
            blocked[:RESCUE_ONE_BY_ONE],
            lambda job_id: rescue([job_id], most=1, lock_wait=RESCUE_RETRY_LOCK_WAIT),
        )
        left += blocked[RESCUE_ONE_BY_ONE:]
        if left:
            log.info(
                "rescue: %d expired jobs wait for rows another transaction holds (%s); "
                "the next pass tries them again",
                len(left),
                ", ".join(map(str, left[:10])),
            )
        return rescued

    def _rescue(
        self, *, limit: int, error: str, ids: list[int] | None, lock_wait: float
    ) -> list[tuple[int, str]]:
        # One transaction, like ``record_outcomes``: rescued jobs that end settle their
        # dependents in it.
        wait_ms = max(1, round(lock_wait * 1000))
        return self._run(
            "rescue",
            lambda db: maintenance_data.rescue_expired(
                db,
                lock_key=MAINTENANCE_LOCK_KEY,
                limit=limit,
                error=error,
                ids=ids,
                lock_wait_ms=wait_ms,
            ),
            give_up_when_stopping=True,
            autocommit=False,
        )

    def prune(self, *, succeeded_before: float, failed_before: float, limit: int) -> int:
        def work(db: Executor) -> int:
            # One transaction: the advisory lock lasts until its end, so one pruner at a time.
            if not maintenance_data.try_maintenance_lock(db, MAINTENANCE_LOCK_KEY + 1):
                return 0
            return maintenance_data.prune_finished(
                db, succeeded_before=succeeded_before, failed_before=failed_before, limit=limit
            )

        return self._run("prune", work, give_up_when_stopping=True, autocommit=False)

    def move_to_history(self, *, age: float, limit: int) -> int:
        def work(db: Executor) -> int:
            # One mover at a time, as one pruner: concurrent movers would only skip each
            # other's locked rows.
            if not maintenance_data.try_maintenance_lock(db, MAINTENANCE_LOCK_KEY + 3):
                return 0
            return history_data.move_to_history(db, age=age, limit=limit)

        return self._run("history move", work, give_up_when_stopping=True, autocommit=False)

    def recount_running(self) -> dict[str, int]:
        """Correct the drifted counters of limited queues and of concurrency keys; ``{queue or
        key: corrected count}``."""
        corrected: dict[str, int] = {}
        if self._run("limit check", claim_data.any_queue_limit, give_up_when_stopping=True):
            corrected.update(
                self._run(
                    "recount limited queues",
                    maintenance_data.recount_running,
                    give_up_when_stopping=True,
                    autocommit=False,
                )
            )
        if self._limits.flow:
            corrected.update(
                self._run(
                    "recount concurrency keys",
                    flow_data.recount_keys,
                    give_up_when_stopping=True,
                    autocommit=False,
                )
            )
        return corrected

    def delete_idle_keys(self, *, after: str, limit: int) -> tuple[str | None, int]:
        """Delete idle concurrency keys' rows among up to ``limit`` after key ``after``; ``(last
        key read or None at the end, rows deleted)``. Nothing while another worker does it."""

        def work(db: Executor) -> tuple[str | None, int]:
            if not maintenance_data.try_maintenance_lock(db, MAINTENANCE_LOCK_KEY + 4):
                return None, 0
            return maintenance_data.delete_idle_keys(db, after=after, limit=limit)

        return self._run("idle key cleanup", work, give_up_when_stopping=True, autocommit=False)

    def queue_figures(self, *, cap: int, worker_id: str, stale_seconds: float) -> Figures | None:
        """``({queue: {state: capped count}}, {queue: seconds its earliest ticket waited},
        {queue: ready jobs whose task no live worker registers}, {workflow state: capped
        count})``, or None when another worker reads them for the cluster: a live worker with
        a smaller id in the registry (``data.workers.elected_worker``), or, while the registry
        names no such worker, the one holding the figures lock."""

        def work(db: Executor) -> Figures | None:
            if not workers_data.elected_worker(db, worker_id, stale_seconds):
                return None
            if not maintenance_data.try_maintenance_lock(db, MAINTENANCE_LOCK_KEY + 2):
                return None
            counts = admin_data.capped_state_counts(db, cap)
            oldest = admin_data.oldest_waiting(db)
            return (
                {
                    queue: {str(s): n for s, n in by_state.items()}
                    for queue, by_state in counts.items()
                },
                {queue: waited for queue, (_, _, waited) in oldest.items()},
                workers_data.unregistered_ready(db, stale_seconds, cap),
                workflows_data.state_counts(db, cap),
            )

        return self._run("queue figures", work, give_up_when_stopping=True, autocommit=False)

    def ready_work_exists(self, queues: Sequence[str] | None, excluded: Sequence[str] = ()) -> bool:
        return self._run(
            "drain check",
            lambda db: claim_data.ready_ticket_exists(db, queues, excluded),
            give_up_when_stopping=True,
        )


def _outage(exc: BaseException, *, through_timeouts: bool) -> bool:
    """Whether the worker keeps trying after ``exc``: the connection is gone, or conflicts
    outlasted the unit of work's own retries, or (``through_timeouts``) a statement or lock
    timed out."""
    return (
        is_connection_error(exc)
        or is_transient_conflict(exc)
        or (through_timeouts and is_timeout(exc))
    )
