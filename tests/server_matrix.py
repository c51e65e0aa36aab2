"""The tests that run on every server of ``tests/run``'s matrix, and why each does.

The rule (docs/contributing.md): a test runs on every server only when what it proves can
differ between servers: the plans the planner makes and JIT, the catalog and DDL (migrations,
``CONCURRENTLY``, partitions), privileges, collation, locks and their timeouts, the text and
fields of the server's errors, what the server accepts in JSON and text, the protocol under a
driver (prepared statements, cancelled and broken connections), and the statements only some
versions run alike. Every other test proves something of pgqueue's Python and runs on one
server: the unit and e2e tiers on the embedded PostgreSQL, the integration tier on Debian's
packaged PostgreSQL with its default settings. Each file below says why it is in the matrix.
"""

from __future__ import annotations

SERVER_MATRIX: dict[str, str] = {
    "integration/test_claim_plan.py": "the claim's plan: its index, no sequential scan, no JIT",
    "integration/test_claim_index_writes.py": "which index entries an update writes (HOT rules)",
    "integration/test_claim_commit.py": "the commit of a claim under the server's durability",
    "integration/test_dashboard_queries.py": "the dashboard's plans with a long history",
    "integration/test_dashboard_throughput.py": "the throughput chart's plans on a busy hour",
    "integration/test_dashboard_read_only.py": "read-only transactions as a standby refuses",
    "integration/test_least_privilege.py": "a DML-only role's grants (PUBLIC's rights differ)",
    "integration/test_sql_enqueue.py": "the SQL function pgqueue_enqueue and its grants",
    "integration/test_migrations.py": "the schema's DDL, its round trip, autogenerate's diff",
    "integration/test_migration_safety.py": "lock and statement timeouts during DDL",
    "integration/test_online_migrate.py": "CREATE INDEX CONCURRENTLY beside writers",
    "integration/test_history.py": "declarative partitions: attach, detach, drop",
    "integration/test_retention.py": "the prune statements' batches and their plans",
    "integration/test_core.py": "enqueue, claim, retry and outcome statements end to end",
    "integration/test_workflows.py": "the workflow statements: release, results, cancel",
    "integration/test_workflow_copy.py": "COPY of a workflow's rows: the server's text format",
    "integration/test_dependencies.py": "dependents settled by recursive statements",
    "integration/test_unique_jobs.py": "ON CONFLICT on a partial unique index under races",
    "integration/test_key_concurrency.py": "the key limits' row locks under concurrent claims",
    "integration/test_queue_limit.py": "the queue limit's row locks across sessions",
    "integration/test_rate_limits.py": "the sliding window's statements in the claim",
    "integration/test_bulk_actions.py": "bulk statements by filter and their audit rows",
    "integration/test_pooler_mode.py": "what a transaction-mode session keeps between clients",
    "integration/test_prepared_statements_idle.py": "prepared statements and plan refreshes",
    "integration/test_driver_cursor.py": "a kept cursor across a server-ended connection",
    "integration/test_driver_connection_reuse.py": "a socket closed under a statement",
    "integration/test_driver_checkout.py": "the server refusing connections as they come",
    "integration/test_row_values_in_errors.py": "the server's DETAIL text of refused rows",
    "integration/test_undecodable_reads.py": "JSON the server accepts and Python cannot decode",
    "integration/test_poison_outcomes.py": "text and intervals the server refuses to store",
    "integration/test_outcome_heartbeat_deadlock.py": "lock order: the server's deadlock check",
    "integration/test_outcome_write_timeouts.py": "lock_timeout behind another's row lock",
    "integration/test_rescue_beside_held_rows.py": "the rescue's lock waits beside held rows",
    "integration/test_uow_retry.py": "SQLSTATEs of deadlocks and serialization failures",
    "integration/test_wakeups.py": "NOTIFY from every statement that inserts tickets",
    "integration/test_durable_steps.py": "the steps' rows and their savepoints",
    "integration/test_durable_wait.py": "suspend, signal and resume statements",
    "integration/test_snooze.py": "the batched outcome statement's snooze branch",
}


def in_matrix(relative_path: str) -> bool:
    """Whether the test file at ``relative_path`` (from ``tests/``, with ``/``) is in it."""
    return relative_path in SERVER_MATRIX
