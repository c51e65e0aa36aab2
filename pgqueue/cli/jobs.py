"""The commands about single jobs: list, count, show, enqueue, retry, cancel, and explain why
one is not running.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import click

from pgqueue.cli.reports import (
    job_filter_options,
    print_job,
    print_jobs,
    print_stats,
    search_filters,
)
from pgqueue.cli.shared import (
    CommandError,
    checked_name,
    database_option,
    did_you_mean,
    echo,
    in_this_cli,
    json_option,
    load_app,
    print_json,
    queue_for,
    with_current_schema,
)
from pgqueue.states import JobState

if TYPE_CHECKING:
    from pgqueue.core import PgQueue


@click.command()
@job_filter_options
@database_option
def jobs(database_url: str | None, as_json: bool, **filters: Any) -> None:
    """List jobs, newest first, or search them: by id, a time window, error text, or JSON
    content of their arguments or result (which needs a window: --since)."""
    search_filters(**filters)  # a bad value is refused before connecting
    print_jobs(queue_for(database_url), as_json=as_json, **filters)


@click.command()
@json_option
@database_option
def stats(as_json: bool, database_url: str | None) -> None:
    """Job counts per queue and state."""
    print_stats(queue_for(database_url), as_json=as_json)


def _job_report(name: str, printer: Callable[..., None], summary: str) -> click.Command:
    """A command that prints one job's report (``printer``'s: ``show``, ``explain``): a table or
    text, or ``--json``."""

    @click.command(name, help=summary)
    @click.argument("job_id", type=int)
    @json_option
    @database_option
    def report(job_id: int, as_json: bool, database_url: str | None) -> None:
        printer(queue_for(database_url), job_id, as_json=as_json)

    return report


show = _job_report(
    "show",
    print_job,
    "Show one job: its fields, then its errors with their tracebacks (--json: JSON).",
)


@click.command()
@click.argument("job_id", type=int)
@database_option
def retry(job_id: int, database_url: str | None) -> None:
    """Run a failed or cancelled job again."""
    queue_for(database_url).admin.retry_job(job_id)
    echo(f"job {job_id} queued again")


@click.command()
@click.argument("job_id", type=int)
@database_option
def cancel(job_id: int, database_url: str | None) -> None:
    """Cancel a waiting job, or ask a running one to stop."""
    state = queue_for(database_url).admin.cancel_job(job_id)
    echo(f"job {job_id}: {'cancelled' if state is JobState.CANCELLED else 'cancel requested'}")


# How many registered task names an unknown task's error lists.
_TASKS_SHOWN = 10


@click.command()
@click.argument("app")
@click.argument("task_name")
@click.option("--args", "args_json", default="[]", help="JSON array of positional arguments.")
@click.option("--kwargs", "kwargs_json", default="{}", help="JSON object of keyword arguments.")
@click.option("--queue", default=None, callback=checked_name)
@click.option("--delay", type=float, default=None)
@click.option("--priority", type=int, default=None)
def enqueue(
    app: str,
    task_name: str,
    args_json: str,
    kwargs_json: str,
    queue: str | None,
    delay: float | None,
    priority: int | None,
) -> None:
    """Enqueue TASK_NAME of the PgQueue at APP with JSON arguments; prints the job id. The
    arguments and the task are checked before the database's schema is."""
    pgq = load_app(app)
    try:
        args = json.loads(args_json)
        kwargs = json.loads(kwargs_json)
    except json.JSONDecodeError as exc:
        raise CommandError(f"--args and --kwargs must be JSON: {exc}") from None
    if not isinstance(args, list) or not isinstance(kwargs, dict):
        raise CommandError("--args must be a JSON array and --kwargs a JSON object")
    task = pgq.registry.find(task_name)
    if task is None:
        names = sorted(t.name for t in pgq.registry)
        shown = ", ".join(names[:_TASKS_SHOWN]) + (", ..." if len(names) > _TASKS_SHOWN else "")
        meant = did_you_mean(task_name, names)
        hint = meant or (f"the registered ones are {shown}" if names else "none is registered")
        raise CommandError(f"no task named {task_name!r} is registered: {hint}")
    with_current_schema(pgq)  # once the command line holds: a typo is answered offline
    job_id = task.configure(queue=queue, delay=delay, priority=priority).enqueue(*args, **kwargs)
    echo(str(job_id))


def _print_explanation(pgq: PgQueue, job_id: int, *, as_json: bool) -> None:
    """The job's state, then one line per blocker (``--json``: the whole explanation on one
    line)."""
    explanation = pgq.admin.explain_job(job_id)
    if as_json:
        print_json(explanation.to_dict())
        return
    echo(in_this_cli(explanation.headline))
    for blocker in explanation.blockers:
        echo(in_this_cli(f"  {blocker.kind.value}: {blocker.message}"))


explain = _job_report(
    "explain", _print_explanation, "Why isn't job JOB_ID running? One line per blocker."
)
