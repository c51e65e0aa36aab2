"""Statements of the audit log (``pgqueue_audit``): a page of its records, newest first. The
records themselves are written by ``sql.bulk.insert_audit``, in each audited action's own
transaction.
"""

from __future__ import annotations

from functools import cache
from typing import Any

from sqlalchemy import BigInteger, Integer, Select, bindparam, select

from pgqueue.models import AuditRecord


@cache
def audit_page(*, before: bool) -> Select[Any]:
    """Up to ``limit`` audit records, newest first (by id), with ``before``: of ids below the
    bound ``before``."""
    statement = select(
        AuditRecord.id,
        AuditRecord.at,
        AuditRecord.actor,
        AuditRecord.source,
        AuditRecord.action,
        AuditRecord.filter,
        AuditRecord.count,
    )
    if before:
        statement = statement.where(AuditRecord.id < bindparam("before", type_=BigInteger))
    return statement.order_by(AuditRecord.id.desc()).limit(bindparam("limit", type_=Integer))
