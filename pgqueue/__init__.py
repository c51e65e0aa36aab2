"""pgqueue: a PostgreSQL job queue for SQLAlchemy applications.

Jobs are enqueued in the application's own transactions, claimed by workers with
``FOR UPDATE SKIP LOCKED``, retried with backoff, and migrated with Alembic.
"""

from pgqueue import backoff
from pgqueue.config import Settings
from pgqueue.context import JobContext, Retry, Snooze
from pgqueue.core import PgQueue
from pgqueue.errors import (
    ConfigurationError,
    InvalidStateTransition,
    JobNotFound,
    JobWaitTimeout,
    LeaseLost,
    PayloadTooLarge,
    PgQueueError,
    QueueFull,
    SerializationError,
    UnknownTask,
    ValidationError,
)
from pgqueue.models import Job, MessageQueue
from pgqueue.states import JobState
from pgqueue.tasks import ConfiguredTask, Task
from pgqueue.worker import Worker, WorkerStats

__version__ = "0.1.0"

__all__ = [
    "ConfigurationError",
    "ConfiguredTask",
    "InvalidStateTransition",
    "Job",
    "JobContext",
    "JobNotFound",
    "JobState",
    "JobWaitTimeout",
    "LeaseLost",
    "MessageQueue",
    "PayloadTooLarge",
    "PgQueue",
    "PgQueueError",
    "QueueFull",
    "Retry",
    "SerializationError",
    "Settings",
    "Snooze",
    "Task",
    "UnknownTask",
    "ValidationError",
    "Worker",
    "WorkerStats",
    "__version__",
    "backoff",
]
