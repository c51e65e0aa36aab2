"""Which insert an enqueue runs (``insert_path``), on the synchronous and the asyncio path
alike, and the queues a ``PgQueue`` knows to be bounded (``BoundedQueuesSeen``); pure."""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Sequence
from typing import Literal

from pgqueue.jobs import NewJob

# From this many jobs on, an own-transaction ``enqueue_many`` inserts with COPY: it costs about
# what the unnest INSERT does for a few hundred jobs and much less per job for large batches
# (BENCHMARKS.md, enqueueB).
COPY_THRESHOLD = 1000

InsertPath = Literal["one", "copy", "batch"]


class BoundedQueuesSeen:
    """The queues an enqueuer believes bounded: their jobs go straight to the checked insert
    (lock, then count and insert) instead of first trying the plain one, whose guard would
    insert nothing. Only a shortcut: the plain inserts' guard catches a bound set since, and
    the lock statement's answer corrects the belief both ways. Thread-safe: the set is
    replaced, never changed in place."""

    def __init__(self) -> None:
        self.queues: frozenset[str] = frozenset()

    def covers(self, jobs: Sequence[NewJob]) -> bool:
        """Whether a queue of ``jobs`` is believed bounded."""
        known = self.queues
        if not known:
            return False
        if len(jobs) == 1:
            return jobs[0].queue in known
        return not known.isdisjoint({job.queue for job in jobs})

    def suspect(self, queues: Iterable[str]) -> None:
        """``queues`` may be bounded (a plain insert's guard stopped it)."""
        self.queues = self.queues | frozenset(queues)

    def record(self, looked_at: Collection[str], bounded: Collection[str]) -> None:
        """Of ``looked_at``, exactly ``bounded`` have a bound (the lock statement's answer)."""
        self.queues = (self.queues - frozenset(looked_at)) | frozenset(bounded)


def insert_path(
    in_callers_transaction: bool,
    jobs: Sequence[NewJob],
    may_copy: Callable[[], bool],
    bounded: BoundedQueuesSeen | None = None,
) -> InsertPath:
    """How an enqueue inserts ``jobs`` (on the synchronous and the asyncio path alike).

    ``"one"``: a single plain job outside a caller's transaction, one autocommit statement
    (one round trip, no Session). ``"copy"``: a large ``uniform`` batch outside a caller's
    transaction, ``COPY`` instead of one INSERT over ten unnested arrays, where ``may_copy()``
    (COPY's rows bypass statement listeners: only where nothing watches statements).
    ``"batch"``: everything else, one INSERT in the caller's transaction or an own one; and
    every enqueue into a queue ``bounded`` believes bounded, which needs a transaction (its
    lock, then its checked insert).
    """
    if in_callers_transaction or (bounded is not None and bounded.covers(jobs)):
        return "batch"
    if len(jobs) == 1:
        job = jobs[0]
        plain = job.unique_key is None and not job.depends_on and job.concurrency_key is None
        return "one" if plain else "batch"
    if len(jobs) >= COPY_THRESHOLD and may_copy() and uniform(jobs):
        return "copy"
    return "batch"


def uniform(jobs: Sequence[NewJob]) -> bool:
    """Whether ``jobs`` form a copy batch: plain jobs (no unique key, dependency or concurrency
    key) that share their task, queue, priority, attempts, atomic flag and ``delay``/``run_at``,
    as one ``enqueue_many`` call builds them. Their tickets are then the ids plus one set of
    values (``sql.enqueue.allocate_jobs_with_tickets``), and their COPY lines share every column
    but the id and the arguments (``copy_rows.job_lines``)."""
    first = jobs[0]
    if first.unique_key is not None or first.depends_on or first.concurrency_key is not None:
        return False
    shared = (
        first.task_name,
        first.queue,
        first.priority,
        first.max_attempts,
        first.atomic,
        first.delay,
        first.run_at,
        None,
        (),
        None,
    )
    # One pass; the shared values are usually the very same objects, so equality is quick.
    return all(
        (
            j.task_name,
            j.queue,
            j.priority,
            j.max_attempts,
            j.atomic,
            j.delay,
            j.run_at,
            j.unique_key,
            j.depends_on,
            j.concurrency_key,
        )
        == shared
        for j in jobs
    )
