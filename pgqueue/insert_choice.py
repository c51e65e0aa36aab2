"""Which insert an enqueue runs (``insert_path``), on the synchronous and the asyncio path
alike; pure."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Literal

from pgqueue.jobs import NewJob

__all__ = ["COPY_THRESHOLD", "InsertPath", "insert_path"]

# From this many jobs on, an own-transaction ``enqueue_many`` inserts with COPY: it costs about
# what the unnest INSERT does for a few hundred jobs and much less per job for large batches
# (BENCHMARKS.md, enqueueB).
COPY_THRESHOLD = 1000

InsertPath = Literal["one", "copy", "batch"]


def insert_path(
    in_callers_transaction: bool, jobs: Sequence[NewJob], may_copy: Callable[[], bool]
) -> InsertPath:
    """How an enqueue inserts ``jobs`` (on the synchronous and the asyncio path alike).

    ``"one"``: a single plain job outside a caller's transaction, one autocommit statement
    (one round trip, no Session). ``"copy"``: a large uniform batch outside a caller's
    transaction, ``COPY`` instead of one INSERT over ten unnested arrays, where ``may_copy()``
    (COPY's rows bypass statement listeners: only where nothing watches statements).
    ``"batch"``: everything else, one INSERT in the caller's transaction or an own one.
    """
    if in_callers_transaction:
        return "batch"
    if len(jobs) == 1:
        job = jobs[0]
        plain = job.unique_key is None and not job.depends_on and job.concurrency_key is None
        return "one" if plain else "batch"
    if (
        len(jobs) >= COPY_THRESHOLD
        and may_copy()
        and all(
            j.unique_key is None and not j.depends_on and j.concurrency_key is None for j in jobs
        )
        and len({(j.delay, j.run_at) for j in jobs}) == 1
    ):
        return "copy"
    return "batch"
