"""The worker engine (see ``engine.py`` for its threads and ``executor.py`` for one job's run)."""

from pgqueue.worker.engine import Worker, WorkerStats

__all__ = ["Worker", "WorkerStats"]
