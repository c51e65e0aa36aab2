"""The partitioned history's data operations (``sql.history``), over ``db.Executor``; never
commits.
"""

from __future__ import annotations

from pgqueue.db import SessionOrExecutor, executor_for
from pgqueue.sql import history as history_sql


def move_to_history(db: SessionOrExecutor, *, age: float, limit: int) -> int:
    """Move up to ``limit`` jobs finished more than ``age`` seconds ago into the partitioned
    history; how many were moved."""
    params = {"age": age, "limit": limit}
    return int(executor_for(db).rows(history_sql.move_finished(), params)[0][0])
