"""pgqueue: a PostgreSQL job queue for SQLAlchemy applications.

Jobs are enqueued in the application's own transactions, claimed by workers with
``FOR UPDATE SKIP LOCKED``, retried with backoff, and migrated with Alembic.
"""

# The names are imported on first use (PEP 562): ``import pgqueue.cli`` or ``pgqueue.errors``
# then costs only what that module needs, not SQLAlchemy's ORM, the worker and the scheduler,
# so the ``pgqueue`` command starts quickly.
import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
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
        SignalTimeout,
        UniqueKeyHeld,
        UnknownTask,
        ValidationError,
        WorkflowNotFound,
    )
    from pgqueue.models import Job, MessageQueue
    from pgqueue.states import JobState
    from pgqueue.tasks import ConfiguredTask, Task
    from pgqueue.worker import Worker, WorkerStats
    from pgqueue.workflows import (
        EnqueuedWorkflow,
        Signature,
        WorkflowStatus,
        chain,
        chord,
        group,
    )

__version__ = "0.1.0"

_MODULE_OF = {
    "ConfigurationError": "pgqueue.errors",
    "ConfiguredTask": "pgqueue.tasks",
    "EnqueuedWorkflow": "pgqueue.workflows",
    "InvalidStateTransition": "pgqueue.errors",
    "Job": "pgqueue.models",
    "JobContext": "pgqueue.context",
    "JobNotFound": "pgqueue.errors",
    "JobState": "pgqueue.states",
    "JobWaitTimeout": "pgqueue.errors",
    "LeaseLost": "pgqueue.errors",
    "MessageQueue": "pgqueue.models",
    "PayloadTooLarge": "pgqueue.errors",
    "PgQueue": "pgqueue.core",
    "PgQueueError": "pgqueue.errors",
    "QueueFull": "pgqueue.errors",
    "Retry": "pgqueue.context",
    "SerializationError": "pgqueue.errors",
    "Settings": "pgqueue.config",
    "Signature": "pgqueue.workflows",
    "SignalTimeout": "pgqueue.errors",
    "Snooze": "pgqueue.context",
    "Task": "pgqueue.tasks",
    "UniqueKeyHeld": "pgqueue.errors",
    "UnknownTask": "pgqueue.errors",
    "ValidationError": "pgqueue.errors",
    "Worker": "pgqueue.worker",
    "WorkerStats": "pgqueue.worker",
    "WorkflowNotFound": "pgqueue.errors",
    "WorkflowStatus": "pgqueue.workflows",
    "chain": "pgqueue.workflows",
    "chord": "pgqueue.workflows",
    "group": "pgqueue.workflows",
}


def __getattr__(name: str) -> Any:
    if name == "backoff":
        return importlib.import_module("pgqueue.backoff")
    module = _MODULE_OF.get(name)
    if module is None:
        raise AttributeError(f"module 'pgqueue' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)


__all__ = [
    "ConfigurationError",
    "ConfiguredTask",
    "EnqueuedWorkflow",
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
    "SignalTimeout",
    "Signature",
    "Snooze",
    "Task",
    "UniqueKeyHeld",
    "UnknownTask",
    "ValidationError",
    "Worker",
    "WorkerStats",
    "WorkflowNotFound",
    "WorkflowStatus",
    "__version__",
    "backoff",
    "chain",
    "chord",
    "group",
]
