"""``flask pgqueue ...``: the ``pgqueue`` commands run against the Flask app's queue.

Registered through the ``flask.commands`` entry point, so any app with the extension gets them.
The commands take the same options as ``pgqueue ...`` but no APP/``--database-url`` argument:
the app (``--app`` / ``FLASK_APP``) provides the tasks and the database. They reuse
``pgqueue.cli``'s implementations.
"""

from __future__ import annotations

import json
import sys
from typing import Any

import click
from flask import current_app
from flask.cli import AppGroup, ScriptInfo
from rich.table import Table

from pgqueue import cli as core_cli
from pgqueue.contrib.flask import get_state
from pgqueue.core import PgQueue as CoreQueue
from pgqueue.errors import PgQueueError
from pgqueue.states import JobState

pgqueue_group = AppGroup("pgqueue", help="pgqueue job queue commands for this app.")


def _queue() -> CoreQueue:
    try:
        return get_state().queue
    except RuntimeError:
        raise click.UsageError(
            f"the app {current_app.name!r} has no pgqueue extension: call pgq.init_app(app)"
        ) from None


def _errors_as_usage(function: Any) -> Any:
    """Show pgqueue's errors (job not found, invalid transition ...) as a one-line message."""

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return function(*args, **kwargs)
        except PgQueueError as exc:
            raise click.ClickException(str(exc)) from None

    wrapper.__name__ = function.__name__
    wrapper.__doc__ = function.__doc__
    return wrapper


@pgqueue_group.command()
@click.argument("action", type=click.Choice(["upgrade", "downgrade", "current"]), default="upgrade")
@click.argument("revision", required=False)
def migrate(action: str, revision: str | None) -> None:
    """Upgrade (default), downgrade, or show pgqueue's schema revision."""
    core_cli.run_migrate_command(_queue(), action, revision)


@pgqueue_group.command()
@core_cli.worker_options
def worker(**options: Any) -> None:
    """Run workers for this app's tasks (each job runs in an app context)."""
    info = click.get_current_context().find_object(ScriptInfo)
    app_path = info.app_import_path if info is not None else None
    # Child processes (--processes N) re-run this very command for the same app.
    prefix = [sys.executable, "-m", "flask", *(["--app", app_path] if app_path else [])]
    core_cli.run_worker_command(
        _queue(), app_argv=[], command_prefix=[*prefix, "pgqueue", "worker"], **options
    )


@pgqueue_group.command()
@click.argument("task_name")
@core_cli.enqueue_options
@_errors_as_usage
def enqueue(
    task_name: str,
    args_json: str,
    kwargs_json: str,
    queue: str | None,
    delay: float | None,
    priority: int | None,
) -> None:
    """Enqueue TASK_NAME with JSON arguments (in its own transaction); prints the job id."""
    core_cli.enqueue_from_cli(_queue(), task_name, args_json, kwargs_json, queue, delay, priority)


@pgqueue_group.command()
@click.option("--queue", "-q", default=None, help="Only this queue.")
@click.option("--state", "-s", type=click.Choice([s.value for s in JobState]), default=None)
@click.option("--task", "-t", "task_name", default=None, help="Only this task name.")
@click.option("--limit", "-n", default=20, show_default=True, type=click.IntRange(1, 1000))
@click.option("--before", type=int, default=None, help="Only jobs older than this job id.")
@_errors_as_usage
def jobs(
    queue: str | None, state: str | None, task_name: str | None, limit: int, before: int | None
) -> None:
    """List jobs, newest first."""
    page = _queue().admin.list_jobs(
        queue=queue,
        state=JobState(state) if state else None,
        task_name=task_name,
        before=before,
        limit=limit,
    )
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
    core_cli.console.print(table)


@pgqueue_group.command()
def stats() -> None:
    """Job counts per queue and state."""
    counts = _queue().admin.counts()
    table = Table(title="pgqueue jobs")
    table.add_column("queue")
    for state in JobState:
        table.add_column(state.value, justify="right")
    for queue, by_state in sorted(counts.items()):
        table.add_row(queue, *(str(by_state.get(s, 0)) for s in JobState))
    core_cli.console.print(table)


@pgqueue_group.command()
@click.argument("job_id", type=int)
@_errors_as_usage
def show(job_id: int) -> None:
    """Show one job as JSON."""
    job = _queue().admin.get_job(job_id)
    data = {c.key: getattr(job, c.key) for c in job.__table__.columns}
    click.echo(json.dumps(data, default=str, indent=2))


@pgqueue_group.command()
@click.argument("job_id", type=int)
@_errors_as_usage
def retry(job_id: int) -> None:
    """Run a failed or cancelled job again."""
    _queue().admin.retry_job(job_id)
    click.echo(f"job {job_id} queued again")


@pgqueue_group.command()
@click.argument("job_id", type=int)
@_errors_as_usage
def cancel(job_id: int) -> None:
    """Cancel a waiting job, or ask a running one to stop."""
    state = _queue().admin.cancel_job(job_id)
    click.echo(
        f"job {job_id}: {'cancelled' if state is JobState.CANCELLED else 'cancel requested'}"
    )


@pgqueue_group.command()
def prune() -> None:
    """Delete finished jobs past their retention."""
    click.echo(f"pruned {_queue().prune()} jobs")
