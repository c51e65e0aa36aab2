"""pgqueue 0017: indexes that make concurrency-key rows removable and the claim's key reads bounded.

Revision ID: pgqueue_0017
Revises: pgqueue_0016
Create Date: 2026-11-25

- ``ix_pgqueue_concurrency_keys_key_hash``: a key row's 32-bit key hash (the expression tickets
  store in ``key_hash``), so the claim reaches only the key rows of its ready tickets' keys
  instead of reading every key row ever written.
- ``ix_pgqueue_jobs_concurrency_key`` (partial, keyed jobs only): whether any job still has a
  key, which maintenance checks before it deletes the key's row.

``CREATE INDEX`` blocks writes to the table while it builds (a few seconds per million rows);
on a large ``pgqueue_jobs`` run this upgrade when a short pause of enqueues is acceptable.
Dropping the indexes loses nothing.
"""

from collections.abc import Sequence

import sqlalchemy as sa

from alembic import op

revision: str = "pgqueue_0017"
down_revision: str | Sequence[str] | None = "pgqueue_0016"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# Written out rather than imported: a revision keeps the schema of its day.
_KEY_HASH = "(CAST(CAST('x' || substr(md5(key), 1, 8) AS BIT(32)) AS INTEGER))"


def upgrade() -> None:
    op.create_index(
        "ix_pgqueue_concurrency_keys_key_hash",
        "pgqueue_concurrency_keys",
        [sa.text(_KEY_HASH)],
        unique=False,
    )
    op.create_index(
        "ix_pgqueue_jobs_concurrency_key",
        "pgqueue_jobs",
        ["concurrency_key"],
        unique=False,
        postgresql_where=sa.text("concurrency_key IS NOT NULL"),
    )


def downgrade() -> None:
    op.drop_index("ix_pgqueue_jobs_concurrency_key", table_name="pgqueue_jobs")
    op.drop_index("ix_pgqueue_concurrency_keys_key_hash", table_name="pgqueue_concurrency_keys")
