"""Workflows: ``chain``, ``group`` and ``chord`` of task signatures (``task.s``/``task.si``),
enqueued whole in one transaction, their results passed through the database.

``canvas`` holds the public constructs; ``plan`` turns one into the rows to insert (pure);
``status`` is what ``pgq.get_workflow`` returns. The data layer (``pgqueue.data.workflows``)
inserts and reads them; the settling of their jobs is ``pgqueue.data.dependencies``'.
"""

from __future__ import annotations

from pgqueue.workflows.canvas import Chain as Chain
from pgqueue.workflows.canvas import Chord as Chord
from pgqueue.workflows.canvas import EnqueuedWorkflow as EnqueuedWorkflow
from pgqueue.workflows.canvas import Group as Group
from pgqueue.workflows.canvas import Signature as Signature
from pgqueue.workflows.canvas import chain as chain
from pgqueue.workflows.canvas import chord as chord
from pgqueue.workflows.canvas import group as group
from pgqueue.workflows.status import WorkflowJob as WorkflowJob
from pgqueue.workflows.status import WorkflowStatus as WorkflowStatus
