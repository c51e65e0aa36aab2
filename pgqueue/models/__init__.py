"""pgqueue's tables, by role; import them from here (the modules behind are private).

The two the queue runs on are ``pgqueue_jobs`` (``Job``, durable history) and
``pgqueue_message_queue`` (``MessageQueue``, ready tickets), with the rows that belong to one job
(``_jobs``). Beside them: the rows that steer the claim (``_control``: queues, concurrency keys,
key limits, schedule ticks and switches), the records kept beside the queue (``_records``: the
worker registry, the audit of operators' actions, the partitioned history) and the workflows
(``_workflows``). All of them share one ``MetaData`` with a naming convention (``_base``), so
constraint names are deterministic and the shipped migrations match the models exactly (a test
compares them).
"""

from __future__ import annotations

from pgqueue.models._base import NAMING_CONVENTION as NAMING_CONVENTION
from pgqueue.models._base import STATE_CHECK as STATE_CHECK
from pgqueue.models._base import TABLE_PREFIX as TABLE_PREFIX
from pgqueue.models._base import Base as Base
from pgqueue.models._base import StoredJSON as StoredJSON
from pgqueue.models._base import job_state_type as job_state_type
from pgqueue.models._base import metadata as metadata
from pgqueue.models._control import KEY_HASH_OF_KEY as KEY_HASH_OF_KEY
from pgqueue.models._control import ConcurrencyKey as ConcurrencyKey
from pgqueue.models._control import KeyLimit as KeyLimit
from pgqueue.models._control import PeriodicTick as PeriodicTick
from pgqueue.models._control import QueueControl as QueueControl
from pgqueue.models._control import ScheduleState as ScheduleState
from pgqueue.models._jobs import LISTED_BY_STATE as LISTED_BY_STATE
from pgqueue.models._jobs import UNIQUE_KEY_HELD as UNIQUE_KEY_HELD
from pgqueue.models._jobs import Job as Job
from pgqueue.models._jobs import JobSignal as JobSignal
from pgqueue.models._jobs import JobStep as JobStep
from pgqueue.models._jobs import JobSuspension as JobSuspension
from pgqueue.models._jobs import MessageQueue as MessageQueue
from pgqueue.models._records import HISTORY_DEFAULT_PARTITION as HISTORY_DEFAULT_PARTITION
from pgqueue.models._records import HISTORY_PARTITION_PREFIX as HISTORY_PARTITION_PREFIX
from pgqueue.models._records import JOB_COLUMN_NAMES as JOB_COLUMN_NAMES
from pgqueue.models._records import AuditRecord as AuditRecord
from pgqueue.models._records import FinishedMinute as FinishedMinute
from pgqueue.models._records import JobHistory as JobHistory
from pgqueue.models._records import WorkerRecord as WorkerRecord
from pgqueue.models._workflows import WORKFLOW_STATE_CHECK as WORKFLOW_STATE_CHECK
from pgqueue.models._workflows import Workflow as Workflow
