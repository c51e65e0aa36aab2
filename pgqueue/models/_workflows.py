"""The workflow table: one row per ``chain``/``group``/``chord`` enqueued as a whole.

A workflow's jobs carry its id (``Job.workflow_id``); the row holds what is not any one job's:
the workflow's state, when it started and ended, which jobs' results are its result, the
closing marker job that ends it and its ``on_failure`` job.
"""

from __future__ import annotations

import datetime as dt

from sqlalchemy import (
    BigInteger,
    CheckConstraint,
    DateTime,
    Identity,
    Index,
    Integer,
    Text,
    func,
)
from sqlalchemy.dialects.postgresql import ARRAY
from sqlalchemy.orm import Mapped, mapped_column

from pgqueue.models._base import Base

WORKFLOW_STATE_CHECK = "state = ANY ('{running,succeeded,failed,cancelled}'::text[])"


class Workflow(Base):
    """One workflow: its state and the jobs that decide its result and its end."""

    __tablename__ = "pgqueue_workflows"

    id: Mapped[int] = mapped_column(BigInteger, Identity(always=False), primary_key=True)
    """Workflow id, returned by ``enqueue`` (``EnqueuedWorkflow.id``)."""
    state: Mapped[str] = mapped_column(Text, server_default="running")
    """running, then succeeded (every member succeeded), failed (a member failed or was
    cancelled) or cancelled (``cancel_workflow``); set in the transaction that decides it."""
    created_at: Mapped[dt.datetime] = mapped_column(
        DateTime(timezone=True), server_default=func.now()
    )
    """When the workflow was enqueued (database clock)."""
    finished_at: Mapped[dt.datetime | None] = mapped_column(DateTime(timezone=True))
    """When its last member ended (or it was cancelled)."""
    final_job_ids: Mapped[list[int]] = mapped_column(ARRAY(BigInteger))
    """The jobs whose results are the workflow's result (the last step of a chain, a group's
    members, a chord's callback), in order. Stored uncompressed (``STORAGE EXTERNAL``,
    migration pgqueue_0024), like the jobs' arrays of ids."""
    closing_job_id: Mapped[int] = mapped_column(BigInteger)
    """The workflow's closing marker: a job that never runs, depends on every member and is
    settled when the last of them ends, ending the workflow in the same statement."""
    on_failure_job_id: Mapped[int | None] = mapped_column(BigInteger)
    """The job to run once if the workflow fails (``on_failure=``), null without one."""
    job_count: Mapped[int] = mapped_column(Integer)
    """How many member jobs (the closing marker and ``on_failure`` not counted)."""

    __table_args__ = (
        CheckConstraint(WORKFLOW_STATE_CHECK, name="state_valid"),
        # Pruning deletes a workflow's row with its closing marker.
        Index("ix_pgqueue_workflows_closing_job_id", "closing_job_id"),
        # The metrics' counts by state read at most their cap of it each.
        Index("ix_pgqueue_workflows_state", "state"),
    )
