"""The ``pgqueue`` command: migrate, run workers, inspect and control jobs, and the demo.

Commands that need tasks take an application path ``module:attribute`` naming a ``PgQueue``
(e.g. ``myapp.jobs:pgq``). Commands that only touch tables take ``--database-url`` (default
``$PGQUEUE_DATABASE_URL``, then the embedded server).
"""

from __future__ import annotations

import importlib
import json
import logging
import os
import sys
from typing import Any

import click
import psycopg
from rich.console import Console
from rich.table import Table
from rich.text import Text
from sqlalchemy.exc import DBAPIError

from pgqueue.core import PgQueue
from pgqueue.errors import (
    PgQueueError,
    connection_failure,
    error_line,
    is_bad_credentials,
    is_connection_error,
    is_insufficient_privilege,
    is_undefined_table,
)
from pgqueue.states import JobState

# Wide enough for any row: a table printed to a file or a pipe is never cut or wrapped.
UNBOUNDED_WIDTH = 100_000


def _output_console() -> Console:
    # No markup or highlighting: what is printed (queue and task names, error messages) comes
    # from users and the database, and ``[...]`` in it must print as itself, not as style tags.
    terminal = Console(markup=False, highlight=False)
    if terminal.is_terminal or os.environ.get("COLUMNS"):
        return terminal
    return Console(markup=False, highlight=False, width=UNBOUNDED_WIDTH)


console = _output_console()
error_console = Console(stderr=True, markup=False, highlight=False, soft_wrap=True)


class CommandError(click.ClickException):
    """A problem the user can fix, printed as one ``error: ...`` line; exit code 2."""

    exit_code = 2

    def show(self, file: Any = None) -> None:
        print_error(self.format_message())


def print_error(message: str) -> None:
    """``error: message`` on stderr, on one line whatever the message holds."""
    error_console.print(Text.assemble(("error:", "red"), " ", " ".join(message.split())))


_FIX_APP = "name the PgQueue object, e.g. myapp.jobs:pgq"


def load_app(path: str) -> PgQueue:
    """Import ``module:attribute`` and return the PgQueue it names.

    Whatever else it names (a task, a function, a class) is refused without being called.
    """
    module_name, _, attribute = path.partition(":")
    if not module_name or not attribute:
        raise CommandError(f"APP {path!r} is not of the form module:attribute: {_FIX_APP}")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise CommandError(f"APP {path!r}: cannot import {module_name!r}: {exc}") from exc
    obj: Any = module
    for part in attribute.split("."):
        obj = getattr(obj, part, None)
        if obj is None:
            raise CommandError(f"APP {path!r}: {module_name!r} has no attribute {attribute!r}")
    if not isinstance(obj, PgQueue):
        kind = obj.__name__ if isinstance(obj, type) else type(obj).__name__
        what = "the class" if isinstance(obj, type) else "a"
        raise CommandError(f"APP {path!r} is {what} {kind}, not a PgQueue: {_FIX_APP}")
    return remember_queue(obj)


def remember_queue(pgq: PgQueue) -> PgQueue:
    """Note the command's queue, so that an error message can name its database."""
    context = click.get_current_context(silent=True)
    if context is not None:
        context.meta[_QUEUE_KEY] = pgq
    return pgq


_QUEUE_KEY = "pgqueue.queue"


def _queue_for(database_url: str | None) -> PgQueue:
    return remember_queue(PgQueue(database_url) if database_url else PgQueue())


def problem_line(exc: BaseException, database: str | None) -> str | None:
    """One line naming what went wrong and its fix, for the errors a user causes and can fix
    (schema not migrated, server down, login refused, bad input); None for anything else,
    which is a bug and keeps its traceback."""
    if isinstance(exc, PgQueueError):
        return str(exc)
    if not isinstance(exc, DBAPIError | psycopg.Error):
        return None
    where = f" {database}" if database else ""
    failure = connection_failure(exc)  # the connection that could not be opened, named
    if failure is not None:
        return failure
    if is_bad_credentials(exc):
        return (
            f"the server refused the login to database{where} ({error_line(exc)}): "
            "check the user and password of the database URL"
        )
    if is_undefined_table(exc):
        return f"pgqueue's tables are missing in database{where}: run `pgqueue migrate`"
    if is_connection_error(exc):
        return f"lost the connection to database{where} ({error_line(exc)}): is the server up?"
    return f"database{where}: {error_line(exc)} (--debug shows the traceback)"


class OneLineErrors(click.Group):
    """A command group whose commands report a user's problem (see ``problem_line``) as one
    line and exit code 2; its ``--debug`` option shows the traceback instead."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except (click.ClickException, click.exceptions.Exit, click.exceptions.Abort):
            raise
        except Exception as exc:
            if ctx.params.get("debug"):
                raise
            pgq = ctx.meta.get(_QUEUE_KEY)
            line = problem_line(exc, _database_name(pgq) if pgq is not None else None)
            if line is None:
                raise
            print_error(line)
            ctx.exit(2)


def _database_name(pgq: PgQueue) -> str | None:
    try:
        return pgq.engine.url.database
    except Exception:  # naming the database must never hide the error being reported
        return None


debug_option = click.option(
    "--debug", is_flag=True, help="Show the traceback of an error instead of one line."
)
verbose_option = click.option(
    "-v", "--verbose", count=True, help="More logging (-v info, -vv debug)."
)


def configure_logging(verbose: int) -> None:
    """The logging of both CLIs: WARNING and up (``-v`` info, ``-vv`` debug) on stderr, and
    pgqueue's own INFO lines (a worker's start, jobs, shutdown) where a command asks for them."""
    level = logging.WARNING if verbose == 0 else logging.INFO if verbose == 1 else logging.DEBUG
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")


database_option = click.option(
    "--database-url",
    envvar="PGQUEUE_DATABASE_URL",
    default=None,
    help="SQLAlchemy URL (default: $PGQUEUE_DATABASE_URL, else the embedded server).",
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
@database_option
def migrate(action: str, revision: str | None, database_url: str | None) -> None:
    """Upgrade (default), downgrade, or show pgqueue's schema revision."""
    run_migrate_command(_queue_for(database_url), action, revision)


def run_migrate_command(pgq: PgQueue, action: str, revision: str | None) -> None:
    """Shared by ``pgqueue migrate`` and ``flask pgqueue migrate``."""
    try:
        _migrate(pgq, action, revision)
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


def _migrate(pgq: PgQueue, action: str, revision: str | None) -> None:
    from pgqueue import migrations

    with pgq.engine.begin() as connection:
        if action == "current":
            current = migrations.current(connection)
            head = migrations.head()
            marker = " (head)" if current == head else f" (head is {head})"
            click.echo(f"{current or 'none'}{marker}")
            return
        if action == "downgrade":
            if not revision:
                raise click.UsageError("downgrade needs a REVISION (e.g. base)")
            migrations.downgrade(connection, revision)
        else:
            migrations.upgrade(connection, revision or "head")
    with pgq.engine.connect() as connection:
        click.echo(f"pgqueue schema at {migrations.current(connection) or 'base'}")


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
    command_prefix: list[str] | None = None,
    supervisor_pid: int | None = None,
) -> None:
    """Shared by ``pgqueue worker`` and ``flask pgqueue worker``."""
    check_schema(pgq)
    if processes > 1:
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
        ]
        pgq.url  # noqa: B018 - start the embedded server here so children share it
        prefix = command_prefix or [sys.executable, "-m", "pgqueue", "worker"]
        code = Supervisor([*prefix, *app_argv, *argv], processes).run()
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
    )
    if supervisor_pid is not None:
        from pgqueue.worker.supervisor import watch_supervisor

        watch_supervisor(supervisor_pid, w.stop)
    w.run(drain=drain)


def check_schema(pgq: PgQueue) -> None:
    """Refuse to go on unless pgqueue's schema is at this pgqueue's head (``SchemaNotCurrent``)."""
    from pgqueue import migrations

    with pgq.engine.connect() as connection:
        migrations.check_schema(connection)


# -- jobs -------------------------------------------------------------------------------------

json_option = click.option(
    "--json", "as_json", is_flag=True, help="Print JSON (stable keys) instead of a table."
)


def job_filter_options(function: Any) -> Any:
    """The options of ``pgqueue jobs`` (shared with ``flask pgqueue jobs``)."""
    options = [
        click.option("--queue", "-q", default=None, help="Only this queue."),
        click.option("--state", "-s", type=click.Choice([s.value for s in JobState]), default=None),
        click.option("--task", "-t", "task_name", default=None, help="Only this task name."),
        click.option("--limit", "-n", default=20, show_default=True, type=click.IntRange(1, 1000)),
        click.option("--before", type=int, default=None, help="Only jobs older than this job id."),
        json_option,
    ]
    for option in reversed(options):
        function = option(function)
    return function


def job_record(job: Any) -> dict[str, Any]:
    """A job's columns as JSON-ready values: times in ISO 8601, states as their names."""
    record: dict[str, Any] = {}
    for column in job.__table__.columns:
        value = getattr(job, column.key)
        if isinstance(value, JobState):
            value = value.value
        elif hasattr(value, "isoformat"):
            value = value.isoformat()
        record[column.key] = value
    return record


def print_json(data: Any) -> None:
    click.echo(json.dumps(data, default=str, sort_keys=True))


def print_jobs(
    pgq: PgQueue,
    *,
    queue: str | None,
    state: str | None,
    task_name: str | None,
    limit: int,
    before: int | None,
    as_json: bool,
) -> None:
    """Shared by ``pgqueue jobs`` and ``flask pgqueue jobs``: a page of jobs, newest first."""
    page = pgq.admin.list_jobs(
        queue=queue,
        state=JobState(state) if state else None,
        task_name=task_name,
        before=before,
        limit=limit,
    )
    if as_json:
        print_json(
            {
                "jobs": [job_record(job) for job in page.jobs],
                "older": page.older,
                "newer": page.newer,
            }
        )
        return
    table = Table(title="pgqueue jobs")
    for column in ("id", "queue", "task", "state", "attempts", "created", "finished"):
        table.add_column(column)
    for job in page.jobs:
        table.add_row(
            str(job.id),
            job.queue,
            job.task_name,
            job.state.value,
            f"{job.attempts}/{job.max_attempts}",
            f"{job.created_at:%Y-%m-%d %H:%M:%S}",
            f"{job.finished_at:%Y-%m-%d %H:%M:%S}" if job.finished_at else "",
        )
    console.print(table)


def print_stats(pgq: PgQueue, *, as_json: bool) -> None:
    """Shared by ``pgqueue stats`` and ``flask pgqueue stats``: counts per queue and state."""
    counts = pgq.admin.counts()
    if as_json:
        print_json(
            {
                queue: {state.value: by_state.get(state, 0) for state in JobState}
                for queue, by_state in counts.items()
            }
        )
        return
    table = Table(title="pgqueue jobs")
    table.add_column("queue")
    for state in JobState:
        table.add_column(state.value, justify="right")
    for queue, by_state in sorted(counts.items()):
        table.add_row(queue, *(str(by_state.get(s, 0)) for s in JobState))
    console.print(table)


def print_job(pgq: PgQueue, job_id: int, *, as_json: bool) -> None:
    """Shared by ``pgqueue show`` and ``flask pgqueue show``: one job as JSON (``--json``: on
    one line, values normalised)."""
    job = pgq.admin.get_job(job_id)
    if as_json:
        print_json(job_record(job))
        return
    data = {c.key: getattr(job, c.key) for c in job.__table__.columns}
    click.echo(json.dumps(data, default=str, indent=2))


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
    click.echo(f"job {job_id} queued again")


@main.command()
@click.argument("job_id", type=int)
@database_option
def cancel(job_id: int, database_url: str | None) -> None:
    """Cancel a waiting job, or ask a running one to stop."""
    state = _queue_for(database_url).admin.cancel_job(job_id)
    click.echo(
        f"job {job_id}: {'cancelled' if state is JobState.CANCELLED else 'cancel requested'}"
    )


@main.command()
@database_option
def prune(database_url: str | None) -> None:
    """Delete finished jobs past their retention (PGQUEUE_SUCCEEDED_RETENTION, ...)."""
    deleted = _queue_for(database_url).prune()
    click.echo(f"pruned {deleted} jobs")


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
    click.echo(str(job_id))


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


@main.command()
@click.argument("queue")
@database_option
def pause(queue: str, database_url: str | None) -> None:
    """Stop all workers from claiming QUEUE's jobs (running jobs finish)."""
    pause_queue(_queue_for(database_url), queue)


def pause_queue(pgq: PgQueue, queue: str) -> None:
    """Shared by ``pgqueue pause`` and ``flask pgqueue pause``."""
    pgq.admin.pause_queue(queue)
    click.echo(f"queue {queue} paused")


@main.command()
@click.argument("queue")
@database_option
def resume(queue: str, database_url: str | None) -> None:
    """Let workers claim QUEUE's jobs again."""
    resume_queue(_queue_for(database_url), queue)


def resume_queue(pgq: PgQueue, queue: str) -> None:
    """Shared by ``pgqueue resume`` and ``flask pgqueue resume``."""
    pgq.admin.resume_queue(queue)
    click.echo(f"queue {queue} resumed")


@main.command()
@click.argument("queue")
@click.argument("limit")
@database_option
def limit(queue: str, limit: str, database_url: str | None) -> None:
    """Allow at most LIMIT running jobs of QUEUE across all workers (``none`` removes it)."""
    limit_queue(_queue_for(database_url), queue, limit)


def limit_queue(pgq: PgQueue, queue: str, limit: str) -> None:
    """Shared by ``pgqueue limit`` and ``flask pgqueue limit``."""
    if limit.lower() == "none":
        value: int | None = None
    else:
        try:
            value = int(limit)
        except ValueError:
            raise click.BadParameter(f"{limit!r} is not a number or 'none'") from None
    pgq.admin.set_queue_limit(queue, value)
    click.echo(f"queue {queue}: limit {'removed' if value is None else value}")


# -- demo -------------------------------------------------------------------------------------


@main.command()
@click.option("--jobs", "job_count", default=10_000, show_default=True, type=click.IntRange(1))
@click.option("--concurrency", default=16, show_default=True, type=click.IntRange(1))
@database_option
def demo(job_count: int, concurrency: int, database_url: str | None) -> None:
    """Migrate, enqueue JOBS jobs (some fail and retry), run a worker, print a summary."""
    from pgqueue.demo import run_demo

    run_demo(database_url, job_count=job_count, concurrency=concurrency, console=console)


def entrypoint() -> None:
    main()
