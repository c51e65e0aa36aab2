"""The audit log as the tests read it: chosen columns of every record, oldest first."""

from __future__ import annotations

from typing import Any

from sqlalchemy import Engine, select
from sqlalchemy.orm import Session

from pgqueue.models import AuditRecord


def audit_rows(engine: Engine, *columns: str) -> list[tuple[Any, ...]]:
    """``columns`` (names of ``AuditRecord``'s attributes) of each audit record, by id."""
    with Session(engine) as session:
        chosen = [getattr(AuditRecord, name) for name in columns]
        return [tuple(row) for row in session.execute(select(*chosen).order_by(AuditRecord.id))]
