"""The audit log of operators' actions (``pgqueue_audit``): write one record in the action's
own transaction, and read a page of them; over ``db.Executor``, never committing. Bulk actions
write theirs through ``data.bulk``; this module serves the actions on one job or one schedule,
whose record names what was acted on in its ``filter`` (``{"job_id": ...}``, ``{"schedule":
...}``, with the new values the action wrote).
"""

from __future__ import annotations

import json
from typing import Any

from pgqueue.db import Executor
from pgqueue.sql import audit as audit_sql
from pgqueue.sql import bulk as bulk_sql


def record(
    db: Executor, *, actor: str, source: str, action: str, target: dict[str, Any], count: int = 1
) -> int:
    """Write the audit record of ``action`` on ``target`` (JSON-encodable values); its id."""
    params = {
        "actor": actor,
        "source": source,
        "action": action,
        "filter": json.dumps(target, sort_keys=True),
        "count": count,
    }
    return int(db.rows(bulk_sql.insert_audit(), params)[0][0])


def page(db: Executor, *, limit: int, before: int | None) -> list[Any]:
    """``(id, at, actor, source, action, filter, count)`` of up to ``limit`` records, newest
    first; with ``before``, of the records older than record ``before``."""
    params: dict[str, Any] = {"limit": limit}
    if before is not None:
        params["before"] = before
    return list(db.rows(audit_sql.audit_page(before=before is not None), params))
