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
    "integration/test_search_plan.py": "the job search's bounded walks: their plans, no JIT",
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


# Tests of those files that run on one server all the same (Debian's, with the integration
# tier): what they prove is pgqueue's Python, or a scale of what a smaller test of the matrix
# proves of the server. Each says which test keeps the server's part proven everywhere.
ONE_SERVER: dict[str, str] = {
    "integration/test_core.py::test_bad_input_is_refused_before_any_sql": "no statement is sent",
    "integration/test_core.py::test_task_names_must_be_unique_and_valid": "the task registry",
    "integration/test_core.py::test_two_apps_on_the_embedded_server_never_see_each_others_tables": (
        "starts an embedded server of its own, whatever the tier's server"
    ),
    "integration/test_core.py::test_no_configuration_warns_once_and_its_server_refuses_tcp": (
        "starts an embedded server of its own, whatever the tier's server"
    ),
    "integration/test_core.py::test_a_configured_database_gives_no_warning": "a warning's logic",
    "integration/test_workflows.py::test_bad_signatures_are_refused_before_any_sql": (
        "no statement is sent"
    ),
    "integration/test_workflows.py::test_a_group_of_10000_runs_every_member": (
        "the size of a group: the same statements as the chord and group tests of this file, "
        "COPY's text format in test_workflow_copy.py"
    ),
    "integration/test_workflows.py::test_a_chord_of_10000_calls_back_once_with_every_result_in_order": (
        "the size of a chord: as above"
    ),
    "integration/test_workflows.py::test_a_chain_of_100_steps_passes_every_value_on": (
        "the length of a chain: each step's release is test_a_chain_passes_each_result_to_the_next_step's"
    ),
    "integration/test_workflows.py::test_a_limited_and_rate_limited_queue_holds_its_members_to_its_limits": (
        "the limits' statements run on every server in test_queue_limit.py and test_rate_limits.py"
    ),
    "integration/test_key_concurrency.py::test_bad_settings_are_refused_before_any_sql": (
        "no statement is sent"
    ),
    "integration/test_rate_limits.py::test_bad_rate_limits_are_refused_before_any_sql": (
        "no statement is sent"
    ),
    "integration/test_queue_limit.py::test_limit_two_across_four_worker_processes": (
        "worker processes: the limit's row locks across sessions run on every server in the "
        "other tests of the file"
    ),
    "integration/test_online_migrate.py::test_app_instances_that_each_migrate_as_they_start_all_succeed": (
        "app processes: the lock of migration runs is "
        "test_a_migrate_waiting_for_another_run_asks_what_is_applied_once_its_turn_comes's, the "
        "builds beside writers test_migrate_builds_the_state_indexes_concurrently_while_jobs_are_written's"
    ),
    "integration/test_durable_wait.py::test_bad_signals_are_refused_before_anything_is_written": (
        "no statement is sent"
    ),
    "integration/test_durable_wait.py::test_a_worker_restart_while_jobs_are_suspended_loses_nothing": (
        "a worker's restart: suspend and resume run on every server in the other tests of the file"
    ),
}


def in_matrix(relative_path: str, test_name: str = "") -> bool:
    """Whether the test ``test_name`` (without its parameters) of the file at
    ``relative_path`` (from ``tests/``, with ``/``) runs on every server."""
    return relative_path in SERVER_MATRIX and f"{relative_path}::{test_name}" not in ONE_SERVER
