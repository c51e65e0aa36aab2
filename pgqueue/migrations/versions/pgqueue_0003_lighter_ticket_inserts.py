"""pgqueue 0003: tickets without a foreign key, wake-ups sent by pgqueue's own statements.

Revision ID: pgqueue_0003
Revises: pgqueue_0002
Create Date: 2026-11-23

Every enqueue inserts a ticket, and two things made that insert cost more than the job row
itself: the foreign key to ``pgqueue_jobs`` (a referential check per ticket row) and the
statement-level NOTIFY trigger with its transition table (run once per statement). Both go
(their measured cost is in BENCHMARKS.md):

- Every statement that deletes jobs now deletes their tickets itself (``delete_job``, pruning),
  and the claim ignores a ticket whose job is gone or not waiting (it deletes the ticket and
  claims nothing), so a ticket without its job can neither run nor block anything.
- Every statement that inserts tickets sends the wake-up itself (one ``pg_notify`` per queue,
  payload ``queue`` or ``queue epoch`` for a future ticket, exactly what the trigger sent).

The downgrade deletes tickets whose job is gone (the foreign key could not be added back over
them), then restores the constraint and the trigger.
"""

from collections.abc import Sequence

from alembic import op

revision: str = "pgqueue_0003"
down_revision: str | Sequence[str] | None = "pgqueue_0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

TICKET_FK = "fk_pgqueue_message_queue_job_id_pgqueue_jobs"

# As created by pgqueue_0001 (a revision's text is frozen, so it is repeated, not imported).
NOTIFY_FUNCTION = """
CREATE FUNCTION pgqueue_notify_tickets() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify(
        'pgqueue',
        CASE WHEN first_run_at <= now() THEN queue
             ELSE queue || ' ' || extract(epoch FROM first_run_at)::text END
    )
    FROM (SELECT queue, min(run_at) AS first_run_at FROM new_tickets GROUP BY queue) AS q;
    RETURN NULL;
END
$$
"""

NOTIFY_TRIGGER = """
CREATE TRIGGER pgqueue_message_queue_notify
AFTER INSERT ON pgqueue_message_queue
REFERENCING NEW TABLE AS new_tickets
FOR EACH STATEMENT EXECUTE FUNCTION pgqueue_notify_tickets()
"""

DELETE_ORPHAN_TICKETS = """
DELETE FROM pgqueue_message_queue AS t
WHERE NOT EXISTS (SELECT 1 FROM pgqueue_jobs AS j WHERE j.id = t.job_id)
"""


def upgrade() -> None:
    op.execute("DROP TRIGGER IF EXISTS pgqueue_message_queue_notify ON pgqueue_message_queue")
    op.execute("DROP FUNCTION IF EXISTS pgqueue_notify_tickets()")
    op.drop_constraint(TICKET_FK, "pgqueue_message_queue", type_="foreignkey")


def downgrade() -> None:
    op.execute(DELETE_ORPHAN_TICKETS)
    op.create_foreign_key(
        TICKET_FK,
        "pgqueue_message_queue",
        "pgqueue_jobs",
        ["job_id"],
        ["id"],
        ondelete="CASCADE",
    )
    op.execute(NOTIFY_FUNCTION)
    op.execute(NOTIFY_TRIGGER)
