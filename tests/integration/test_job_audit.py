"""The audit records of the actions on one job given an ``actor`` (retry, cancel, delete,
signal): written in the action's own transaction, so a record exists exactly when the action
took effect (none for an action that changed nothing, none after a rollback), and read back
page by page with ``pgq.admin.audit_log``.
"""

from __future__ import annotations

import pytest
from sqlalchemy import Engine
from support.audit import audit_rows

from pgqueue import InvalidStateTransition, JobState, PgQueue
from pgqueue.admin import AuditEntry


def test_actions_on_one_job_given_an_actor_are_audited_when_they_take_effect(
    pgq: PgQueue, engine: Engine
) -> None:
    @pgq.task(name="audit.any")
    def any_task() -> None:
        return None

    job_id = any_task.configure(delay=3600).enqueue()
    assert pgq.cancel_job(job_id) is JobState.CANCELLED  # no actor: no record
    with pytest.raises(InvalidStateTransition):
        pgq.cancel_job(job_id, actor="carol")  # changed nothing: no record
    assert audit_rows(engine, "actor", "source", "action", "filter", "count") == []

    # Rolled back with the caller's transaction: neither the retry nor its record remain.
    with pgq.sessions() as session:
        pgq.retry_job(job_id, session=session, actor="carol")
        session.rollback()
    assert pgq.get_job(job_id).state is JobState.CANCELLED
    assert audit_rows(engine, "actor", "source", "action", "filter", "count") == []

    pgq.retry_job(job_id, actor="carol", source="dashboard")
    assert pgq.signal(job_id, "go", {"secret": 1}, actor="dave") is True
    assert pgq.signal(job_id, "go", None, actor="dave") is False  # the first one is kept
    assert pgq.cancel_job(job_id, actor="erin", source="cli") is JobState.CANCELLED
    assert pgq.admin.delete_job(job_id, actor="erin") is True
    assert pgq.admin.delete_job(job_id, actor="erin") is False
    assert audit_rows(engine, "actor", "source", "action", "filter", "count") == [
        ("carol", "dashboard", "retry", {"job_id": job_id}, 1),
        ("dave", "api", "signal", {"job_id": job_id, "signal": "go"}, 1),
        ("erin", "cli", "cancel", {"job_id": job_id, "state": "cancelled"}, 1),
        ("erin", "api", "delete", {"job_id": job_id}, 1),
    ]


def test_the_audit_log_pages_newest_first(pgq: PgQueue) -> None:
    @pgq.task(name="audit.page")
    def page_task() -> None:
        return None

    ids = [page_task.configure(delay=3600).enqueue() for _ in range(5)]
    for job_id in ids:
        pgq.admin.set_priority(job_id, 1, actor="ops")
    first = pgq.admin.audit_log(limit=2)
    assert [e.job_id for e in first.entries] == [ids[4], ids[3]]
    assert all(isinstance(e, AuditEntry) and e.action == "set_priority" for e in first.entries)
    assert first.entries[0].target == {"job_id": ids[4], "priority": 1}
    assert first.older == first.entries[1].id
    second = pgq.admin.audit_log(limit=2, before=first.older)
    third = pgq.admin.audit_log(limit=2, before=second.older)
    assert [e.job_id for e in second.entries + third.entries] == [ids[2], ids[1], ids[0]]
    assert third.older is None
    with pytest.raises(ValueError, match="limit must be an int from 1 to 1000"):
        pgq.admin.audit_log(limit=0)
