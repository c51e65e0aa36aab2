"""pgqueue: a PostgreSQL job queue for SQLAlchemy applications.

Jobs are enqueued in the application's own transactions, claimed by workers with
``FOR UPDATE SKIP LOCKED``, retried with backoff, and migrated with Alembic.
"""

# The names are imported on first use (PEP 562): ``import pgqueue.cli`` or ``pgqueue.errors``
# then costs only what that module needs, not SQLAlchemy's ORM, the worker and the scheduler,
# so the ``pgqueue`` command starts quickly. Type checkers read the names from the
# ``TYPE_CHECKING`` imports, ``__getattr__`` from ``_MODULE_OF``, and ``__all__`` is derived from
# ``_MODULE_OF`` (``tests/unit/test_public_names.py`` holds the two to the same names).
import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pgqueue import backoff as backoff
    from pgqueue.config import Settings as Settings
    from pgqueue.context import JobContext as JobContext
    from pgqueue.context import Retry as Retry
    from pgqueue.context import Snooze as Snooze
    from pgqueue.context import SoftTimeout as SoftTimeout
    from pgqueue.core import PgQueue as PgQueue
    from pgqueue.errors import ConfigurationError as ConfigurationError
    from pgqueue.errors import InvalidStateTransition as InvalidStateTransition
    from pgqueue.errors import JobNotFound as JobNotFound
    from pgqueue.errors import JobWaitTimeout as JobWaitTimeout
    from pgqueue.errors import LeaseLost as LeaseLost
    from pgqueue.errors import PayloadTooLarge as PayloadTooLarge
    from pgqueue.errors import PgQueueError as PgQueueError
    from pgqueue.errors import QueueFull as QueueFull
    from pgqueue.errors import SerializationError as SerializationError
    from pgqueue.errors import SignalTimeout as SignalTimeout
    from pgqueue.errors import UniqueKeyHeld as UniqueKeyHeld
    from pgqueue.errors import UnknownTask as UnknownTask
    from pgqueue.errors import ValidationError as ValidationError
    from pgqueue.errors import WorkflowNotFound as WorkflowNotFound
    from pgqueue.models import Job as Job
    from pgqueue.models import MessageQueue as MessageQueue
    from pgqueue.states import JobState as JobState
    from pgqueue.tasks import ConfiguredTask as ConfiguredTask
    from pgqueue.tasks import Task as Task
    from pgqueue.worker import Worker as Worker
    from pgqueue.worker import WorkerStats as WorkerStats
    from pgqueue.workflows import EnqueuedWorkflow as EnqueuedWorkflow
    from pgqueue.workflows import Signature as Signature
    from pgqueue.workflows import WorkflowStatus as WorkflowStatus
    from pgqueue.workflows import chain as chain
    from pgqueue.workflows import chord as chord
    from pgqueue.workflows import group as group

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
    "SoftTimeout": "pgqueue.context",
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


__all__ = ["__version__", "backoff", *_MODULE_OF]
