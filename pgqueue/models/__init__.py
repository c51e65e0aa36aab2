"""pgqueue's tables, by role; import them from here (the modules behind are private).

The two the queue runs on are ``pgqueue_jobs`` (``Job``, durable history) and
``pgqueue_message_queue`` (``MessageQueue``, ready tickets), with the rows that belong to one job
(``_jobs``). Beside them: the rows that steer the claim (``_control``: queues, concurrency keys,
key limits, schedule ticks) and the records kept beside the queue (``_records``: the worker
registry, the audit of bulk actions, the partitioned history) and the workflows
(``_workflows``). All of them share one
``MetaData`` with a naming convention (``_base``), so constraint names are deterministic and the
shipped migrations match the models exactly (a test compares them).
"""

from __future__ import annotations

from pgqueue.models._base import (
    NAMING_CONVENTION,
    STATE_CHECK,
    TABLE_PREFIX,
    Base,
    StoredJSON,
    job_state_type,
    metadata,
)
from pgqueue.models._control import (
    KEY_HASH_OF_KEY,
    ConcurrencyKey,
    KeyLimit,
    PeriodicTick,
    QueueControl,
)
from pgqueue.models._jobs import (
    LISTED_BY_STATE,
    UNIQUE_KEY_HELD,
    Job,
    JobSignal,
    JobStep,
    JobSuspension,
    MessageQueue,
)
from pgqueue.models._records import (
    HISTORY_DEFAULT_PARTITION,
    HISTORY_PARTITION_PREFIX,
    JOB_COLUMN_NAMES,
    AuditRecord,
    FinishedMinute,
    JobHistory,
    WorkerRecord,
)
from pgqueue.models._workflows import WORKFLOW_STATE_CHECK, Workflow

__all__ = [
    "HISTORY_DEFAULT_PARTITION",
    "HISTORY_PARTITION_PREFIX",
    "JOB_COLUMN_NAMES",
    "KEY_HASH_OF_KEY",
    "LISTED_BY_STATE",
    "NAMING_CONVENTION",
    "STATE_CHECK",
    "TABLE_PREFIX",
    "UNIQUE_KEY_HELD",
    "WORKFLOW_STATE_CHECK",
    "AuditRecord",
    "Base",
    "ConcurrencyKey",
    "FinishedMinute",
    "Job",
    "JobHistory",
    "JobSignal",
    "JobStep",
    "JobSuspension",
    "KeyLimit",
    "MessageQueue",
    "PeriodicTick",
    "QueueControl",
    "StoredJSON",
    "WorkerRecord",
    "Workflow",
    "job_state_type",
    "metadata",
]
