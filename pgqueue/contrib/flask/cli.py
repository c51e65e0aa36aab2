"""``flask pgqueue ...``: the ``pgqueue`` commands run against the Flask app's queue.

Registered through the ``flask.commands`` entry point, so any app with the extension gets them.
The commands take the same options as ``pgqueue ...`` but no APP/``--database-url`` argument:
the app (``--app`` / ``FLASK_APP``) provides the tasks and the database. They reuse
``pgqueue.cli``'s implementations, and ``pgqueue.cli_shared``'s output, logging setup and
one-line errors.
"""

from __future__ import annotations

import sys
from typing import Any

import click
from flask import current_app
from flask.cli import AppGroup, ScriptInfo

from pgqueue.cli import history as history_commands
from pgqueue.cli import jobs as job_commands
from pgqueue.cli import migrate as migrate_commands
from pgqueue.cli import queues as queue_commands
from pgqueue.cli import reports, shared
from pgqueue.cli import workers as worker_commands
from pgqueue.cli.bulk import add_bulk_commands
from pgqueue.cli.flow import FLOW_COMMAND_SETTINGS, key_limit_command, rate_limit_command
from pgqueue.contrib.flask import get_state
from pgqueue.core import PgQueue as CoreQueue
from pgqueue.states import JobState


class FlaskCommandGroup(shared.OneLineErrors, AppGroup):
    """Flask's app-context command group, with the core CLI's one-line errors."""

    cli_name = "flask pgqueue"


@click.group("pgqueue", cls=FlaskCommandGroup)
@shared.verbose_option
@shared.debug_option
def pgqueue_group(verbose: int, debug: bool) -> None:
    """pgqueue job queue commands for this app."""
    shared.configure_logging(verbose)


def _queue(*, schema_checked: bool = True) -> CoreQueue:
    """The app's queue, its schema checked unless ``schema_checked`` is False (``migrate``
    fixes the schema, ``worker`` and ``enqueue`` check it themselves, ``schedules`` reads only
    the code)."""
    try:
        queue = get_state().queue
    except RuntimeError:
        raise shared.CommandError(
            f"the app {current_app.name!r} has no pgqueue extension: call pgq.init_app(app)"
        ) from None
    shared.remember_queue(queue)
    return shared.with_current_schema(queue) if schema_checked else queue


@pgqueue_group.command()
@click.argument("action", type=click.Choice(["upgrade", "downgrade", "current"]), default="upgrade")
@click.argument("revision", required=False)
@migrate_commands.yes_option
def migrate(action: str, revision: str | None, yes: bool) -> None:
    """Upgrade (default), downgrade, or show pgqueue's schema revision."""
    migrate_commands.run_migrate_command(_queue(schema_checked=False), action, revision, yes=yes)


@pgqueue_group.command()
@worker_commands.worker_options
def worker(**options: Any) -> None:
    """Run workers for this app's tasks (each job runs in an app context)."""
    info = click.get_current_context().find_object(ScriptInfo)
    app_path = info.app_import_path if info is not None else None
    # Child processes (--processes N) re-run this very command for the same app.
    prefix = [sys.executable, "-m", "flask", *(["--app", app_path] if app_path else [])]
    worker_commands.run_worker_command(
        _queue(schema_checked=False),
        app_argv=[],
        command_prefix=[*prefix, "pgqueue", "worker"],
        **options,
    )


@pgqueue_group.command()
@click.argument("task_name")
@job_commands.enqueue_options
def enqueue(task_name: str, **options: Any) -> None:
    """Enqueue TASK_NAME with JSON arguments (in its own transaction); prints the job id."""
    job_commands.enqueue_from_cli(_queue(schema_checked=False), task_name, **options)


@pgqueue_group.command()
@reports.job_filter_options
def jobs(**filters: Any) -> None:
    """List jobs, newest first."""
    reports.print_jobs(_queue(), **filters)


@pgqueue_group.command()
@shared.json_option
def stats(as_json: bool) -> None:
    """Job counts per queue and state."""
    reports.print_stats(_queue(), as_json=as_json)


@pgqueue_group.command()
@click.argument("job_id", type=int)
@shared.json_option
def show(job_id: int, as_json: bool) -> None:
    """Show one job: its fields, then its errors with their tracebacks (--json: JSON)."""
    reports.print_job(_queue(), job_id, as_json=as_json)


@pgqueue_group.command()
@worker_commands.include_stale_option
@shared.json_option
def workers(include_stale: bool, as_json: bool) -> None:
    """List the running worker processes (the worker registry)."""
    worker_commands.print_workers(_queue(), include_stale=include_stale, as_json=as_json)


@pgqueue_group.command()
@click.argument("job_id", type=int)
def retry(job_id: int) -> None:
    """Run a failed or cancelled job again."""
    _queue().admin.retry_job(job_id)
    shared.echo(f"job {job_id} queued again")


@pgqueue_group.command()
@click.argument("job_id", type=int)
def cancel(job_id: int) -> None:
    """Cancel a waiting job, or ask a running one to stop."""
    state = _queue().admin.cancel_job(job_id)
    shared.echo(
        f"job {job_id}: {'cancelled' if state is JobState.CANCELLED else 'cancel requested'}"
    )


@pgqueue_group.command()
def prune() -> None:
    """Delete finished jobs past their retention."""
    shared.echo(f"pruned {shared.plural(_queue().admin.prune(), 'job')}")


@pgqueue_group.group(name="history", cls=FlaskCommandGroup)
def history_group() -> None:
    """The partitioned history of finished jobs (PGQUEUE_HISTORY=partitioned)."""


@history_group.command(name="maintain")
@history_commands.history_maintain_options
def history_maintain(days_ahead: int, retention_days: int | None) -> None:
    """Create coming days' partitions and drop expired ones (run as the schema owner)."""
    history_commands.run_history_maintain(_queue(), days_ahead, retention_days)


@pgqueue_group.command()
def schedules() -> None:
    """List this app's periodic schedules with their next run."""
    queue_commands.print_schedules(_queue(schema_checked=False))


@pgqueue_group.command()
@click.argument("queue")
@queue_commands.new_option
def pause(queue: str, new: bool) -> None:
    """Stop all workers from claiming QUEUE's jobs (running jobs finish)."""
    queue_commands.pause_queue(_queue(), queue, new=new)


@pgqueue_group.command()
@click.argument("queue")
def resume(queue: str) -> None:
    """Let workers claim QUEUE's jobs again."""
    queue_commands.resume_queue(_queue(), queue)


@pgqueue_group.command()
@click.argument("queue")
@click.argument("limit")
@queue_commands.new_option
def limit(queue: str, limit: str, new: bool) -> None:
    """Allow at most LIMIT running jobs of QUEUE across all workers (``none`` removes it)."""
    queue_commands.limit_queue(_queue(), queue, limit, new=new)


@pgqueue_group.command(name="max-depth")
@click.argument("queue")
@click.argument("max_depth")
@queue_commands.new_option
def max_depth(queue: str, max_depth: str, new: bool) -> None:
    """Refuse enqueues that would take QUEUE above MAX_DEPTH waiting jobs (``none`` removes
    the bound)."""
    queue_commands.bound_queue(_queue(), queue, max_depth, new=new)


@pgqueue_group.command(name="key-limit", context_settings=FLOW_COMMAND_SETTINGS)
@click.argument("key_or_prefix", required=False)
@click.argument("limit", required=False)
@shared.json_option
def key_limit(key_or_prefix: str | None, limit: str | None, as_json: bool) -> None:
    """At most LIMIT running jobs per concurrency key starting with KEY_OR_PREFIX (``none``
    removes the override); without LIMIT, show it; without arguments, list every override."""
    key_limit_command(_queue(), key_or_prefix, limit, as_json=as_json)


@pgqueue_group.command(name="rate-limit", context_settings=FLOW_COMMAND_SETTINGS)
@click.argument("values", nargs=-1, metavar="[QUEUE] [LIMIT]")
@click.option("--key", default=None, metavar="PREFIX", help="Limit each key with this prefix.")
@click.option("--per", default=None, metavar="SECONDS", help="The window, in seconds.")
@queue_commands.new_option
@shared.json_option
def rate_limit(
    values: tuple[str, ...], key: str | None, per: str | None, new: bool, as_json: bool
) -> None:
    """At most LIMIT jobs of QUEUE (or of each key starting with --key PREFIX) start in any
    window of --per SECONDS (``none`` removes it); without LIMIT, show it; without arguments,
    list every rate limit."""
    rate_limit_command(_queue(), values, key=key, per=per, as_json=as_json, new=new)


@pgqueue_group.group()
def bulk() -> None:
    """Retry, cancel or delete the jobs a filter chooses (--dry-run counts them first)."""


add_bulk_commands(bulk, lambda options: _queue())


@pgqueue_group.command()
@click.argument("job_id", type=int)
@shared.json_option
def explain(job_id: int, as_json: bool) -> None:
    """Why isn't job JOB_ID running? One line per blocker."""
    job_commands.print_explanation(_queue(), job_id, as_json=as_json)
