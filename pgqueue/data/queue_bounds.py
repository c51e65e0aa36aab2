"""The bounded queues' part of an enqueue (``data.enqueue.insert_jobs``), over ``db.Executor``
like ``dependencies``: taking the locks of a batch's bounded queues, and telling from an
insert's empty answer whether a bound stopped it, raising ``QueueFull`` when a locked queue has
no room for the batch. The statements are ``sql.enqueue``'s (``lock_bounded_queues``,
``queue_depths``, ``any_bound``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pgqueue.data.insert_choice import BoundedQueuesSeen
from pgqueue.db import Executor
from pgqueue.errors import ConfigurationError, QueueFull
from pgqueue.jobs import NewJob
from pgqueue.sql import enqueue


def lock(ex: Executor, jobs: Sequence[NewJob], seen: BoundedQueuesSeen) -> list[str]:
    """Take the locks of the bounded queues of ``jobs`` (held to the end of the transaction);
    their names. Refuses REPEATABLE READ, whose snapshot would hide the jobs that the lock's
    previous holders committed."""
    queues = sorted({job.queue for job in jobs})
    rows = ex.rows(enqueue.lock_bounded_queues(), {"queues": queues})
    locked = [row[0] for row in rows]
    seen.record(queues, locked)
    if rows and rows[0][2] == "repeatable read":
        raise ConfigurationError(
            f"queue {locked[0]!r} is bounded: enqueue into it in a READ COMMITTED or "
            "SERIALIZABLE transaction (under REPEATABLE READ its depth cannot be counted exactly)"
        )
    return locked


def stopped_by_bound(
    ex: Executor, jobs: Sequence[NewJob], rows: Sequence[Any], locked: list[str] | None
) -> bool:
    """Whether the insert that answered ``rows`` inserted nothing because of a bound (then try
    again after locking). Raises QueueFull when a locked queue has no room for the batch.

    A guard stops every row, and a row without a unique key is never skipped otherwise; only a
    batch whose keys are all held already can come back empty on its own."""
    if rows:
        return False
    if locked is None:
        if any(j.unique_key is None for j in jobs):
            return True
        queues = sorted({job.queue for job in jobs})
        return bool(ex.rows(enqueue.any_bound(), {"queues": queues})[0][0])
    asked: dict[str, int] = {}
    for job in jobs:
        asked[job.queue] = asked.get(job.queue, 0) + 1
    stopped = False
    for name, (max_depth, depth) in depths(ex, list(asked)).items():
        if name not in locked:
            stopped = True  # bounded since the lock was taken: lock it too
        elif depth + asked[name] > max_depth:
            raise QueueFull(name, max_depth, depth, asked[name])
    # Room now (jobs left the queue since the insert counted), or a batch of held keys.
    return stopped or any(j.unique_key is None for j in jobs)


def depths(ex: Executor, queues: Sequence[str]) -> dict[str, tuple[int, int]]:
    """``{queue: (max_depth, depth)}`` for the bounded queues among ``queues``; ``depth``
    counts waiting jobs up to one more than ``max_depth``."""
    rows = ex.rows(enqueue.queue_depths(), {"queues": sorted(set(queues))})
    return {name: (max_depth, depth) for name, max_depth, depth in rows}
