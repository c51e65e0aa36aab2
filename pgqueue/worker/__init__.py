"""The worker: a thin ``Worker`` (``engine.py``) wiring small services, one module each."""

from pgqueue.worker.engine import Worker
from pgqueue.worker.stats import WorkerStats

__all__ = ["Worker", "WorkerStats"]
