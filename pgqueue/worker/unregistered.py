"""The tasks a worker met in its claims but does not register: it gives their jobs back unrun
and claims around them from then on.

During a rolling deploy old and new workers share the tables: an old worker can claim a job of a
task only the new code has. Failing it would lose the job for good, so the worker gives it back
instead (a leased job with the ``release`` transition, its attempt not counted; an atomic job by
rolling its claim back) and adds the task's name here. Its claims pass over the tickets of these
tasks from then on (``ClaimVariant.excluded``), so each worker gives back at most one claim's
worth of each such task, and the common claim, where every ready job's task is registered,
stays the statement it was. A worker's registry does not change while it runs, so a name once
here stays for the worker's life.
"""

from __future__ import annotations

import threading

from pgqueue.errors import pgqueue_logger
from pgqueue.jobs import ClaimedJob
from pgqueue.metrics import NO_METRICS, NoMetrics
from pgqueue.tasks import TaskRegistry

log = pgqueue_logger("pgqueue.worker")


class UnregisteredTasks:
    """The names this worker claims around (``names``, replaced whole, so a claim reads it
    without a lock), and the give-back of one claimed job."""

    def __init__(self, registry: TaskRegistry, metrics: NoMetrics = NO_METRICS) -> None:
        self._registry = registry
        self._metrics = metrics
        self._lock = threading.Lock()
        self.names: tuple[str, ...] = ()

    def gives_back(self, job: ClaimedJob) -> bool:
        """Whether ``job``'s task is not registered here, so the caller gives it back unrun;
        the task is claimed around from now on."""
        if job.task_name in self._registry:
            return False
        with self._lock:
            first = job.task_name not in self.names
            if first:
                self.names = (*self.names, job.task_name)
        self._metrics.given_back(job.queue)
        if first:
            log.warning(
                # A task name is whatever the row holds: cut in the log line.
                "job %d: task %.200r is not registered in this worker; the job goes back to its "
                "queue unrun (no attempt counted) for a worker that registers it, and this "
                "worker claims no more jobs of that task",
                job.id,
                job.task_name,
            )
        return True
