"""The worker: a thin ``Worker`` (``engine.py``) wiring small services, one module each."""

from pgqueue.worker.engine import Worker as Worker
from pgqueue.worker.stats import WorkerStats as WorkerStats
