"""Which insert an enqueue runs, on the synchronous and the asyncio path alike: the one-row
insert or a plan (``one_row``), and whether ``COPY`` may carry a plan's rows (``copyable``);
and the queues a ``PgQueue`` believes bounded (``BoundedQueuesSeen``); pure."""

from __future__ import annotations

from collections.abc import Collection, Iterable, Sequence
from operator import attrgetter

from pgqueue.jobs import NewJob

# From this many jobs on, a plan written in an own transaction goes by COPY: it costs about
# what the unnest INSERT does for a few hundred jobs and much less per job for large batches
# (BENCHMARKS.md, enqueueB).
COPY_THRESHOLD = 1000


class BoundedQueuesSeen:
    """The queues an enqueuer believes bounded: their jobs go straight to a plan's checked
    steps (lock, count, then insert) instead of first trying a guarded statement (the one-row
    insert, a plain plan's), whose guard would write nothing. Only a shortcut: those guards
    catch a bound set since, and each checked plan's answer corrects the belief both ways. Thread-safe: the set is replaced, never changed in place."""

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
        """``queues`` may be bounded (the one-row insert's guard stopped it)."""
        self.queues = self.queues | frozenset(queues)

    def record(self, looked_at: Collection[str], bounded: Collection[str]) -> None:
        """Of ``looked_at``, exactly ``bounded`` have a bound (a plan's answer)."""
        self.queues = (self.queues - frozenset(looked_at)) | frozenset(bounded)


def one_row(jobs: Sequence[NewJob], bounded: BoundedQueuesSeen) -> bool:
    """Whether ``jobs`` go in by the one-row insert (``data.enqueue.insert_one_job``, one
    statement, no ids drawn first): a single job with no key and no dependency, whose queue
    ``bounded`` does not believe bounded. Every other enqueue is a plan (``data.enqueue.write``).
    """
    if len(jobs) != 1:
        return False
    job = jobs[0]
    return (
        job.unique_key is None
        and not job.depends_on
        and job.concurrency_key is None
        and not bounded.covers(jobs)
    )


# What COPY cannot write, a job at a time: no ``ON CONFLICT`` for a unique key, no key rows for
# a concurrency key, no states of existing jobs read for a dependency; the ones below are shared.
_UNCOPYABLE = attrgetter("unique_key", "concurrency_key", "depends_on", "delay", "run_at")
_ROOT = attrgetter("queue", "priority", "atomic")


def copyable(jobs: Sequence[NewJob], roots: Sequence[int] | None) -> bool:
    """Whether one ``COPY`` may carry ``jobs`` (whose jobs without parents are ``roots``; None:
    all of them): from ``COPY_THRESHOLD`` jobs on, none with a unique key, a concurrency key or
    a dependency on an existing job, all due at one ``delay``/``run_at`` (written as one
    timestamp), and the roots sharing their queue, priority and atomic flag (their tickets are
    their ids and one set of values: ``sql.enqueue.insert_tickets``)."""
    if len(jobs) < COPY_THRESHOLD:
        return False
    first = jobs[0]
    plain = (None, None, (), first.delay, first.run_at)
    if not all(map(plain.__eq__, map(_UNCOPYABLE, jobs))):
        return False
    root_jobs = jobs if roots is None else [jobs[i] for i in roots]
    shared = _ROOT(root_jobs[0])
    return all(map(shared.__eq__, map(_ROOT, root_jobs)))
