"""pgqueue 0024: arrays of job ids are stored without compression.

Revision ID: pgqueue_0024
Revises: pgqueue_0023
Create Date: 2026-11-26

``depends_on`` and ``dependents`` (``pgqueue_jobs``, ``pgqueue_job_history``) and
``final_job_ids`` (``pgqueue_workflows``) get ``STORAGE EXTERNAL``: a large array still goes
out of line to the TOAST table, but is not compressed first. A large workflow writes arrays
of as many ids as it has members (its closing marker's ``depends_on``, its ``final_job_ids``),
and compressing them costs several times their write for about half the bytes
(``docs/how-to/alembic.md``). Small arrays stay in the row either way.

Catalog-only: no row is rewritten (values stored before stay compressed until rewritten), each
``ALTER`` holds its table's lock for an instant, within the migration's ``lock_timeout``. The
downgrade puts back the default (``EXTENDED``).
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

revision: str = "pgqueue_0024"
down_revision: str | Sequence[str] | None = "pgqueue_0023"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# One statement per table (a partitioned history's partitions follow their parent).
_UNCOMPRESSED = (
    "ALTER TABLE pgqueue_jobs ALTER COLUMN depends_on SET STORAGE EXTERNAL,"
    " ALTER COLUMN dependents SET STORAGE EXTERNAL",
    "ALTER TABLE pgqueue_job_history ALTER COLUMN depends_on SET STORAGE EXTERNAL,"
    " ALTER COLUMN dependents SET STORAGE EXTERNAL",
    "ALTER TABLE pgqueue_workflows ALTER COLUMN final_job_ids SET STORAGE EXTERNAL",
)
_COMPRESSED = tuple(statement.replace("EXTERNAL", "EXTENDED") for statement in _UNCOMPRESSED)


def upgrade() -> None:
    for statement in _UNCOMPRESSED:
        op.execute(statement)


def downgrade() -> None:
    for statement in _COMPRESSED:
        op.execute(statement)
