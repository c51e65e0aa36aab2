"""The ``pgqueue`` command: migrate, run workers, inspect and control jobs, and the demo.

Commands that need tasks take an application path ``module:attribute`` naming a ``PgQueue``
(e.g. ``myapp.jobs:pgq``). Commands that only touch tables take ``--database-url`` (default
``$PGQUEUE_DATABASE_URL``, then the embedded server).
"""

from __future__ import annotations

import json
import logging
import math
import sys
import time
from collections.abc import Callable
from typing import Any

import click
from rich.table import Table
from sqlalchemy.exc import DBAPIError

from pgqueue import config
from pgqueue.cli_bulk import add_bulk_commands
from pgqueue.cli_flow import FLOW_COMMAND_SETTINGS, key_limit_command, rate_limit_command
from pgqueue.cli_shared import (
    CommandError,
    OneLineErrors,
    configure_logging,
    console,
    debug_option,
    echo,
    job_filter_options,
    json_option,
    load_app,
    number_or_none,
    print_job,
    print_jobs,
    print_json,
    print_stats,
    problem_line,
    remember_queue,
    verbose_option,
)
from pgqueue.core import PgQueue
from pgqueue.errors import (
    DowngradeLosesData,
    NotSchemaOwner,
    is_bad_credentials,
    is_connection_error,
    is_insufficient_privilege,
    is_lock_timeout,
    pgqueue_logger,
)
from pgqueue.states import JobState

__all__ = ["console", "load_app", "main"]

log = pgqueue_logger("pgqueue.worker")


def _queue_for(database_url: str | None) -> PgQueue:
    return remember_queue(PgQueue(database_url) if database_url else PgQueue())


database_option = click.option(
    "--database-url",
    envvar="PGQUEUE_DATABASE_URL",
    default=None,
    help="SQLAlchemy URL (default: $PGQUEUE_DATABASE_URL, else the embedded server).",
)


yes_option = click.option(
    "--yes",
    is_flag=True,
    help="Downgrade even when it drops tables or columns that hold data (see the README).",
)


@click.group(cls=OneLineErrors)
@verbose_option
@debug_option
@click.version_option(package_name="pgqueue")
def main(verbose: int, debug: bool) -> None:
    """pgqueue: PostgreSQL job queue for SQLAlchemy applications."""
    configure_logging(verbose)


# -- migrate ----------------------------------------------------------------------------------


@main.command()
@click.argument("action", type=click.Choice(["upgrade", "downgrade", "current"]), default="upgrade")
@click.argument("revision", required=False)
@yes_option
@database_option
def migrate(action: str, revision: str | None, yes: bool, database_url: str | None) -> None:
    """Upgrade (default), downgrade, or show pgqueue's schema revision."""
    run_migrate_command(_queue_for(database_url), action, revision, yes=yes)


def run_migrate_command(pgq: PgQueue, action: str, revision: str | None, *, yes: bool) -> None:
    """Shared by ``pgqueue migrate`` and ``flask pgqueue migrate``."""
    try:
        _migrate(pgq, action, revision, yes=yes)
    except DowngradeLosesData as exc:
        raise CommandError(
            f"pgqueue migrate: {exc}; nothing changed: add --yes to drop it"
        ) from None
    except DBAPIError as exc:
        if not is_insufficient_privilege(exc):
            raise
        # The expected failure for an application role with DML rights only: one line, no
        # traceback (the transaction rolled back, nothing changed).
        reason = str(exc.orig).strip().splitlines()[0]
        raise click.ClickException(
            f"pgqueue migrate: {reason} (SQLSTATE 42501): this database role may not change the "
            "schema; run migrate as the schema owner"
        ) from None


def _migrate(pgq: PgQueue, action: str, revision: str | None, *, yes: bool) -> None:
    from pgqueue import migrations
    from pgqueue.migrations.blockers import BlockerWatch, session_pid

    lock_timeout = pgq.settings.migration_lock_timeout
    with pgq.engine.begin() as connection:
        if action == "current":
            current = migrations.current(connection)
            head = migrations.head()
            marker = " (head)" if current == head else f" (head is {head})"
            echo(f"{current or 'none'}{marker}")
            return
        if action == "downgrade" and not revision:
            raise click.UsageError("downgrade needs a REVISION (e.g. base)")
        watch = BlockerWatch(pgq.engine, session_pid(connection))
        try:
            with watch:
                if action == "downgrade":
                    assert revision is not None
                    migrations.downgrade(
                        connection, revision, lock_timeout=lock_timeout, refuse_data_loss=not yes
                    )
                else:
                    migrations.upgrade(connection, revision or "head", lock_timeout=lock_timeout)
        except DBAPIError as exc:
            if not is_lock_timeout(exc):
                raise
            blockers = "; ".join(b.describe() for b in watch.blockers) or "a session gone since"
            raise CommandError(
                f"pgqueue migrate: waited {lock_timeout:g} s (migration_lock_timeout) for a lock "
                f"held by {blockers}; nothing changed: end that transaction, or migrate again "
                "when it is done"
            ) from None
    with pgq.engine.connect() as connection:
        echo(f"pgqueue schema at {migrations.current(connection) or 'base'}")


# -- worker -----------------------------------------------------------------------------------


def worker_options(function: Any) -> Any:
    """The options of ``pgqueue worker`` (shared with ``flask pgqueue worker``)."""
    options = [
        click.option("--queues", "-q", default=None, help="Comma-separated queues (default: all)."),
        click.option("--concurrency", "-c", default=10, show_default=True, type=click.IntRange(1)),
        click.option("--processes", "-p", default=1, show_default=True, type=click.IntRange(1)),
        click.option("--no-listen", is_flag=True, help="Poll only, never LISTEN."),
        click.option("--poll-interval", type=click.FloatRange(min=0.01), default=None),
        click.option("--lease-seconds", type=click.FloatRange(min=0.1), default=None),
        click.option("--shutdown-timeout", type=click.FloatRange(min=0), default=None),
        click.option("--drain", is_flag=True, help="Exit when no job is ready."),
        click.option(
            "--wait-for-database",
            type=click.FloatRange(min=0),
            is_flag=False,
            flag_value=math.inf,
            default=None,
            envvar="PGQUEUE_WAIT_FOR_DATABASE",
            metavar="[SECONDS]",
            help="If the database cannot be reached at start, wait for it (for SECONDS, or "
            "without a value for ever) instead of exiting with code 2 "
            "(default: $PGQUEUE_WAIT_FOR_DATABASE).",
        ),
        click.option(
            "--metrics-port",
            type=click.IntRange(1, 65535),
            default=None,
            help="Serve Prometheus /metrics on this port (default: $PGQUEUE_METRICS_PORT).",
        ),
        click.option(
            "--metrics-address",
            default=None,
            metavar="ADDRESS",
            help="Address /metrics listens on: an IP address (0.0.0.0 or :: for every "
            "interface) or a host name (default: $PGQUEUE_METRICS_ADDRESS, else 127.0.0.1).",
        ),
        # Given by the supervisor to its children: they stop when it is gone.
        click.option("--supervisor-pid", type=int, default=None, hidden=True),
    ]
    for option in reversed(options):
        function = option(function)
    return function


def enqueue_options(function: Any) -> Any:
    """The options of ``pgqueue enqueue`` (shared with ``flask pgqueue enqueue``)."""
    options = [
        click.option(
            "--args", "args_json", default="[]", help="JSON array of positional arguments."
        ),
        click.option(
            "--kwargs", "kwargs_json", default="{}", help="JSON object of keyword arguments."
        ),
        click.option("--queue", default=None),
        click.option("--delay", type=float, default=None),
        click.option("--priority", type=int, default=None),
    ]
    for option in reversed(options):
        function = option(function)
    return function


@main.command()
@click.argument("app")
@worker_options
def worker(app: str, **options: Any) -> None:
    """Run workers for the PgQueue at APP (module:attribute)."""
    pgq = load_app(app)
    run_worker_command(pgq, app_argv=[app], **options)


def run_worker_command(
    pgq: PgQueue,
    *,
    app_argv: list[str],
    queues: str | None,
    concurrency: int,
    processes: int,
    no_listen: bool,
    poll_interval: float | None,
    lease_seconds: float | None,
    shutdown_timeout: float | None,
    drain: bool,
    wait_for_database: float | None = None,
    command_prefix: list[str] | None = None,
    supervisor_pid: int | None = None,
    metrics_port: int | None = None,
    metrics_address: str | None = None,
) -> None:
    """Shared by ``pgqueue worker`` and ``flask pgqueue worker``."""
    address = (
        pgq.settings.metrics_address
        if metrics_address is None
        else config.metrics_address(metrics_address)
    )
    check_schema(pgq, wait_for_database=wait_for_database)
    if processes > 1:
        from pgqueue import metrics
        from pgqueue.worker.supervisor import Supervisor

        argv = [
            "--concurrency",
            str(concurrency),
            *(["--queues", queues] if queues else []),
            *(["--no-listen"] if no_listen else []),
            *(["--poll-interval", str(poll_interval)] if poll_interval else []),
            *(["--lease-seconds", str(lease_seconds)] if lease_seconds else []),
            *(
                ["--shutdown-timeout", str(shutdown_timeout)]
                if shutdown_timeout is not None
                else []
            ),
            *(["--drain"] if drain else []),
            # Restarted while the server is down, a child waits for it: the group already
            # started, and rides out an outage as a running worker does.
            "--wait-for-database",
        ]
        pgq.url  # noqa: B018 - start the embedded server here so children share it
        # The supervisor runs no statement after the schema check: close that check's pooled
        # connection, so a host holds its worker processes' connections and not one more.
        pgq.dispose()
        prefix = command_prefix or [sys.executable, "-m", "pgqueue", "worker"]
        command = [*prefix, *app_argv, *argv]
        group_port = metrics_port or pgq.settings.metrics_port
        if not group_port:
            sys.exit(Supervisor(command, processes).run())
        # One endpoint for the group: the children write to a shared directory it serves.
        with metrics.serve_group(group_port, address) as child_exited:
            code = Supervisor(command, processes, on_exit=child_exited).run()
        sys.exit(code)
    from pgqueue.worker import Worker

    logging.getLogger("pgqueue").setLevel(min(logging.getLogger().level, logging.INFO))
    w = Worker(
        pgq,
        queues=[q.strip() for q in queues.split(",") if q.strip()] if queues else None,
        concurrency=concurrency,
        listen=False if no_listen else None,
        poll_interval=poll_interval,
        lease_seconds=lease_seconds,
        shutdown_timeout=shutdown_timeout,
        install_signal_handlers=True,
        metrics_port=metrics_port if supervisor_pid is None else _child_metrics(),
        metrics_address=address,
    )
    if supervisor_pid is not None:
        from pgqueue.worker.supervisor import watch_supervisor

        watch_supervisor(supervisor_pid, w.stop)
    w.run(drain=drain)


def _child_metrics() -> int:
    """A supervisor's child records metrics into the group's directory (when the supervisor
    serves one) and never serves a port itself: 0."""
    from pgqueue import metrics

    if metrics.multiprocess_dir() is not None:
        metrics.enable()
    return 0


# A worker waiting for its database tries again after this long, doubling up to the longest
# wait: a quick start when the server is nearly up, a line every few seconds at most otherwise.
FIRST_DATABASE_WAIT = 0.5
LONGEST_DATABASE_WAIT = 5.0


def check_schema(pgq: PgQueue, *, wait_for_database: float | None = None) -> None:
    """Refuse to go on unless pgqueue's schema is at this pgqueue's head (``SchemaNotCurrent``).

    A database that cannot be reached (server down, login refused, TLS refused) ends the
    command with its one-line error, so that a process manager restarts the worker. With
    ``wait_for_database`` (seconds, ``math.inf`` for ever) such failures are logged one line
    each, at most one every ``LONGEST_DATABASE_WAIT`` seconds, until the database answers and
    the schema is checked, or the time is up and the last failure ends the command.
    """
    from pgqueue import migrations

    deadline = None if wait_for_database is None else time.monotonic() + wait_for_database
    delay = FIRST_DATABASE_WAIT
    while True:
        try:
            with pgq.engine.connect() as connection:
                migrations.check_schema(connection)
            return
        except DBAPIError as exc:
            if deadline is None or not (is_connection_error(exc) or is_bad_credentials(exc)):
                raise
            left = deadline - time.monotonic()
            if left <= 0:
                raise
            pause = min(delay, left)
            problem = problem_line(exc, lambda: pgq.engine.url.database) or str(exc)
            log.warning("waiting for the database: %s; next try in %.1fs", problem, pause)
            time.sleep(pause)
            delay = min(delay * 2, LONGEST_DATABASE_WAIT)


# -- jobs -------------------------------------------------------------------------------------


@main.command()
@job_filter_options
@database_option
def jobs(database_url: str | None, **filters: Any) -> None:
    """List jobs, newest first."""
    print_jobs(_queue_for(database_url), **filters)


@main.command()
@json_option
@database_option
def stats(as_json: bool, database_url: str | None) -> None:
    """Job counts per queue and state."""
    print_stats(_queue_for(database_url), as_json=as_json)


@main.command()
@click.argument("job_id", type=int)
@json_option
@database_option
def show(job_id: int, as_json: bool, database_url: str | None) -> None:
    """Show one job as JSON."""
    print_job(_queue_for(database_url), job_id, as_json=as_json)


@main.command()
@click.argument("job_id", type=int)
@database_option
def retry(job_id: int, database_url: str | None) -> None:
    """Run a failed or cancelled job again."""
    _queue_for(database_url).admin.retry_job(job_id)
    echo(f"job {job_id} queued again")


@main.command()
@click.argument("job_id", type=int)
@database_option
def cancel(job_id: int, database_url: str | None) -> None:
    """Cancel a waiting job, or ask a running one to stop."""
    state = _queue_for(database_url).admin.cancel_job(job_id)
    echo(f"job {job_id}: {'cancelled' if state is JobState.CANCELLED else 'cancel requested'}")


@main.command()
@database_option
def prune(database_url: str | None) -> None:
    """Delete finished jobs past their retention (PGQUEUE_SUCCEEDED_RETENTION, ...)."""
    deleted = _queue_for(database_url).prune()
    echo(f"pruned {deleted} jobs")


@main.group(name="history")
def history_group() -> None:
    """The partitioned history of finished jobs (PGQUEUE_HISTORY=partitioned)."""


def history_maintain_options(command: Callable[..., Any]) -> Callable[..., Any]:
    """``--days-ahead`` and ``--retention-days``, shared by ``pgqueue history maintain`` and
    ``flask pgqueue history maintain``."""
    command = click.option(
        "--retention-days",
        type=click.IntRange(min=1),
        default=None,
        help="Drop the days older than this [default: PGQUEUE_HISTORY_RETENTION_DAYS, 7].",
    )(command)
    return click.option(
        "--days-ahead",
        type=click.IntRange(min=1),
        default=7,
        show_default=True,
        help="Create the partitions of today and this many days after it.",
    )(command)


def run_history_maintain(pgq: PgQueue, days_ahead: int, retention_days: int | None) -> None:
    """Shared by ``pgqueue history maintain`` and ``flask pgqueue history maintain``."""
    try:
        report = pgq.maintain_history(days_ahead=days_ahead, retention_days=retention_days)
    except NotSchemaOwner as exc:
        # As ``migrate``'s: exit 1, the expected refusal for a DML-only role, nothing changed.
        raise click.ClickException(f"pgqueue history maintain: {exc}") from None
    echo(report.summary())


@history_group.command(name="maintain")
@history_maintain_options
@database_option
def history_maintain(days_ahead: int, retention_days: int | None, database_url: str | None) -> None:
    """Create coming days' partitions and drop expired ones (run as the schema owner)."""
    run_history_maintain(_queue_for(database_url), days_ahead, retention_days)


@main.command()
@click.argument("app")
@click.argument("task_name")
@enqueue_options
def enqueue(
    app: str,
    task_name: str,
    args_json: str,
    kwargs_json: str,
    queue: str | None,
    delay: float | None,
    priority: int | None,
) -> None:
    """Enqueue TASK_NAME of the PgQueue at APP with JSON arguments."""
    enqueue_from_cli(load_app(app), task_name, args_json, kwargs_json, queue, delay, priority)


def enqueue_from_cli(
    pgq: PgQueue,
    task_name: str,
    args_json: str,
    kwargs_json: str,
    queue: str | None,
    delay: float | None,
    priority: int | None,
) -> None:
    try:
        args = json.loads(args_json)
        kwargs = json.loads(kwargs_json)
    except json.JSONDecodeError as exc:
        raise click.BadParameter(f"not JSON: {exc}") from None
    if not isinstance(args, list) or not isinstance(kwargs, dict):
        raise click.BadParameter("--args must be a JSON array and --kwargs a JSON object")
    task = pgq.registry.get(task_name)
    job_id = task.configure(queue=queue, delay=delay, priority=priority).enqueue(*args, **kwargs)
    echo(str(job_id))


# -- schedules and queue control --------------------------------------------------------------


@main.command()
@click.argument("app")
def schedules(app: str) -> None:
    """List the periodic schedules of the PgQueue at APP with their next run."""
    print_schedules(load_app(app))


def print_schedules(pgq: PgQueue) -> None:
    """Shared by ``pgqueue schedules`` and ``flask pgqueue schedules``."""
    import datetime as dt

    from pgqueue.scheduler import describe

    table = Table(title="pgqueue schedules")
    for column in ("name", "cron", "time zone", "task", "missed", "next run (local)", "UTC"):
        table.add_column(column)
    for row in describe(list(pgq.schedules.values()), dt.datetime.now(dt.UTC)):
        table.add_row(
            row["name"],
            row["cron"],
            row["tz"],
            row["task"],
            row["missed"],
            row["next_run_local"].strftime("%Y-%m-%d %H:%M:%S %Z"),
            row["next_run_utc"].strftime("%Y-%m-%d %H:%M:%S"),
        )
    console.print(table)


# -- workers ----------------------------------------------------------------------------------


include_stale_option = click.option(
    "--all",
    "include_stale",
    is_flag=True,
    help="Also list workers gone stale (killed or cut off) whose rows are not deleted yet.",
)


@main.command()
@include_stale_option
@json_option
@database_option
def workers(include_stale: bool, as_json: bool, database_url: str | None) -> None:
    """List the running worker processes (the worker registry)."""
    print_workers(_queue_for(database_url), include_stale=include_stale, as_json=as_json)


def print_workers(pgq: PgQueue, *, include_stale: bool, as_json: bool) -> None:
    """Shared by ``pgqueue workers`` and ``flask pgqueue workers``."""
    import datetime as dt

    found = pgq.admin.list_workers(include_stale=include_stale)
    if as_json:
        print_json(
            [
                {
                    "id": w.id,
                    "host": w.host,
                    "pid": w.pid,
                    "queues": list(w.queues),
                    "concurrency": w.concurrency,
                    "version": w.version,
                    "started_at": w.started_at.isoformat(),
                    "last_seen_at": w.last_seen_at.isoformat(),
                    "seconds_since_seen": round(w.seconds_since_seen, 3),
                    "live": w.live,
                    "running": w.running,
                    "healthy": w.healthy,
                    "claim_error": w.claim_error,
                    "seconds_failing": (
                        None if w.seconds_failing is None else round(w.seconds_failing, 3)
                    ),
                    "tasks": None if w.tasks is None else list(w.tasks),
                }
                for w in found
            ]
        )
        return
    table = Table(title=f"pgqueue workers ({pgq.settings.worker_stale_seconds:g}s to stale)")
    columns = ("id", "host", "pid", "queues", "concurrency", "running", "version", "started")
    for column in (*columns, "last seen", "health"):
        table.add_column(column, justify="right" if column in ("pid", "running") else "left")
    for w in found:
        health = (
            "ok"
            if w.claim_error is None
            else f"claims failing for {w.seconds_failing or 0:.0f}s: {w.claim_error}"
        )
        table.add_row(
            w.id,
            w.host,
            str(w.pid),
            ",".join(w.queues) or "*",
            str(w.concurrency),
            str(w.running),
            w.version,
            f"{w.started_at.astimezone(dt.UTC):%Y-%m-%d %H:%M:%S}",
            f"{w.seconds_since_seen:.0f}s ago" + ("" if w.live else " (stale)"),
            health,
        )
    console.print(table)


@main.command()
@click.argument("queue")
@database_option
def pause(queue: str, database_url: str | None) -> None:
    """Stop all workers from claiming QUEUE's jobs (running jobs finish)."""
    pause_queue(_queue_for(database_url), queue)


def pause_queue(pgq: PgQueue, queue: str) -> None:
    """Shared by ``pgqueue pause`` and ``flask pgqueue pause``."""
    pgq.admin.pause_queue(queue)
    echo(f"queue {queue} paused")


@main.command()
@click.argument("queue")
@database_option
def resume(queue: str, database_url: str | None) -> None:
    """Let workers claim QUEUE's jobs again."""
    resume_queue(_queue_for(database_url), queue)


def resume_queue(pgq: PgQueue, queue: str) -> None:
    """Shared by ``pgqueue resume`` and ``flask pgqueue resume``."""
    pgq.admin.resume_queue(queue)
    echo(f"queue {queue} resumed")


@main.command()
@click.argument("queue")
@click.argument("limit")
@database_option
def limit(queue: str, limit: str, database_url: str | None) -> None:
    """Allow at most LIMIT running jobs of QUEUE across all workers (``none`` removes it)."""
    limit_queue(_queue_for(database_url), queue, limit)


def limit_queue(pgq: PgQueue, queue: str, limit: str) -> None:
    """Shared by ``pgqueue limit`` and ``flask pgqueue limit``."""
    value = number_or_none(limit)
    pgq.admin.set_queue_limit(queue, value)
    echo(f"queue {queue}: limit {'removed' if value is None else value}")


@main.command(name="max-depth")
@click.argument("queue")
@click.argument("max_depth")
@database_option
def max_depth(queue: str, max_depth: str, database_url: str | None) -> None:
    """Refuse enqueues that would take QUEUE above MAX_DEPTH waiting jobs (``none`` removes
    the bound)."""
    bound_queue(_queue_for(database_url), queue, max_depth)


def bound_queue(pgq: PgQueue, queue: str, max_depth: str) -> None:
    """Shared by ``pgqueue max-depth`` and ``flask pgqueue max-depth``."""
    value = number_or_none(max_depth)
    pgq.set_queue_max_depth(queue, value)
    echo(f"queue {queue}: max depth {'removed' if value is None else value}")


@main.command(name="key-limit", context_settings=FLOW_COMMAND_SETTINGS)
@click.argument("key_or_prefix", required=False)
@click.argument("limit", required=False)
@json_option
@database_option
def key_limit(
    key_or_prefix: str | None, limit: str | None, as_json: bool, database_url: str | None
) -> None:
    """At most LIMIT running jobs per concurrency key starting with KEY_OR_PREFIX (``none``
    removes the override); without LIMIT, show it; without arguments, list every override."""
    key_limit_command(_queue_for(database_url), key_or_prefix, limit, as_json=as_json)


@main.command(name="rate-limit", context_settings=FLOW_COMMAND_SETTINGS)
@click.argument("values", nargs=-1, metavar="[QUEUE] [LIMIT]")
@click.option("--key", default=None, metavar="PREFIX", help="Limit each key with this prefix.")
@click.option("--per", default=None, metavar="SECONDS", help="The window, in seconds.")
@json_option
@database_option
def rate_limit(
    values: tuple[str, ...],
    key: str | None,
    per: str | None,
    as_json: bool,
    database_url: str | None,
) -> None:
    """At most LIMIT jobs of QUEUE (or of each key starting with --key PREFIX) start in any
    window of --per SECONDS (``none`` removes it); without LIMIT, show it; without arguments,
    list every rate limit."""
    rate_limit_command(_queue_for(database_url), values, key=key, per=per, as_json=as_json)


# -- demo -------------------------------------------------------------------------------------


@main.command()
@click.option("--jobs", "job_count", default=10_000, show_default=True, type=click.IntRange(1))
@click.option("--concurrency", default=16, show_default=True, type=click.IntRange(1))
@database_option
def demo(job_count: int, concurrency: int, database_url: str | None) -> None:
    """Migrate, enqueue JOBS jobs (some fail and retry), run a worker, print a summary."""
    from pgqueue.demo import run_demo

    run_demo(database_url, job_count=job_count, concurrency=concurrency, console=console)


# -- explain ----------------------------------------------------------------------------------


@main.command()
@click.argument("job_id", type=int)
@json_option
@database_option
def explain(job_id: int, as_json: bool, database_url: str | None) -> None:
    """Why isn't job JOB_ID running? One line per blocker."""
    print_explanation(_queue_for(database_url), job_id, as_json=as_json)


def print_explanation(pgq: PgQueue, job_id: int, *, as_json: bool) -> None:
    """Shared by ``pgqueue explain`` and ``flask pgqueue explain``: the job's state, then one
    line per blocker (``--json``: the whole explanation on one line)."""
    explanation = pgq.admin.explain_job(job_id)
    if as_json:
        print_json(explanation.to_dict())
        return
    echo(explanation.headline)
    for blocker in explanation.blockers:
        echo(f"  {blocker.kind.value}: {blocker.message}")


def entrypoint() -> None:
    main()


# -- bulk actions -----------------------------------------------------------------------------


@main.group()
def bulk() -> None:
    """Retry, cancel or delete the jobs a filter chooses (--dry-run counts them first)."""


add_bulk_commands(bulk, lambda options: _queue_for(options.pop("database_url")), database_option)
