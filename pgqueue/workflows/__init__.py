"""Workflows: ``chain``, ``group`` and ``chord`` of task signatures (``task.s``/``task.si``),
enqueued whole in one transaction, their results passed through the database.

``canvas`` holds the public constructs; ``plan`` turns one into the rows to insert (pure);
``status`` is what ``pgq.get_workflow`` returns. The data layer (``pgqueue.data.workflows``)
inserts and reads them; the settling of their jobs is ``pgqueue.data.dependencies``'.
"""

from __future__ import annotations

from pgqueue.workflows.canvas import (
    Chain,
    Chord,
    EnqueuedWorkflow,
    Group,
    Signature,
    chain,
    chord,
    group,
)
from pgqueue.workflows.status import WorkflowJob, WorkflowStatus

__all__ = [
    "Chain",
    "Chord",
    "EnqueuedWorkflow",
    "Group",
    "Signature",
    "WorkflowJob",
    "WorkflowStatus",
    "chain",
    "chord",
    "group",
]
