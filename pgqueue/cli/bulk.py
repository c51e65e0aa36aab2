"""``pgqueue bulk retry|cancel|delete``: act on every job a filter
chooses, after a count.

``--dry-run`` only counts. Without ``--yes`` the command counts, shows the count and asks for
confirmation on a terminal (off a terminal it refuses, one line); the action then refuses to
go on if the count changed meanwhile. Each action writes one audit record (actor: ``--actor``,
default ``user@host``; source ``cli``). Bad filter values are one line and exit code 2, before
anything is written.
"""

from __future__ import annotations

import datetime as dt
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import click

from pgqueue.cli.reports import note_names_no_job_has
from pgqueue.cli.shared import (
    CommandError,
    actor_option,
    checked_name,
    database_option,
    echo,
    json_option,
    plural,
    print_json,
    queue_for,
)
from pgqueue.job_filter import BulkAction, JobFilter, parse_states, parse_time

if TYPE_CHECKING:
    from pgqueue.admin import BulkResult
    from pgqueue.core import PgQueue

_DONE = {BulkAction.RETRY: "retried", BulkAction.CANCEL: "cancelled", BulkAction.DELETE: "deleted"}


def _text_option(name: str, help: str) -> Callable[[Any], Any]:
    """A filter option taking text, unset by default."""
    return click.option(name, default=None, help=help)


def _bulk_options(function: Any) -> Any:
    options = [
        click.option("--queue", "-q", default=None, callback=checked_name, help="Only this queue."),
        click.option(
            "--task",
            "-t",
            "task_name",
            default=None,
            callback=checked_name,
            help="Only this task name.",
        ),
        click.option(
            "--state",
            "-s",
            "states",
            multiple=True,
            help="Only jobs in this state (repeat for several; default: every state the action "
            "applies to).",
        ),
        _text_option(
            "--since",
            "From this time on: ISO 8601 (UTC unless an offset is given) or an age such as 12h, "
            "90m, 2d.",
        ),
        _text_option("--until", "Before this time (same forms as --since)."),
        click.option(
            "--time-column",
            default="created_at",
            show_default=True,
            help="The time --since/--until bound: created_at or finished_at.",
        ),
        _text_option(
            "--error-contains",
            "Only jobs whose last error contains this text (any case; % and _ are plain "
            "characters).",
        ),
        click.option("--all-jobs", is_flag=True, help="Allow a filter that chooses every job."),
        click.option("--dry-run", is_flag=True, help="Only count the jobs; change nothing."),
        click.option("--yes", "-y", is_flag=True, help="Do it without asking."),
        actor_option,
        json_option,
    ]
    for option in reversed(options):
        function = option(function)
    return function


def job_filter_from_options(
    *,
    queue: str | None,
    task_name: str | None,
    states: tuple[str, ...],
    since: str | None,
    until: str | None,
    time_column: str,
    error_contains: str | None,
    all_jobs: bool,
) -> JobFilter:
    """The filter the options describe (ValidationError, a one-line error, on a bad value)."""
    now = dt.datetime.now(dt.UTC)
    return JobFilter(
        queue=queue,
        task_name=task_name,
        states=parse_states([name for value in states for name in value.split(",") if name]),
        since=None if since is None else parse_time("--since", since, now),
        until=None if until is None else parse_time("--until", until, now),
        time_column=time_column,
        error_contains=error_contains,
        all_jobs=all_jobs,
    )


_HELP = {
    BulkAction.RETRY: "Retry the failed or cancelled jobs the filter chooses.",
    BulkAction.CANCEL: "Cancel the waiting jobs the filter chooses (running ones are asked to "
    "stop).",
    BulkAction.DELETE: "Delete the jobs the filter chooses (never running ones).",
}


def _add_command(group: click.Group, action: BulkAction) -> None:
    """Add ``action``'s command to ``group``: the filter's options and ``--database-url``."""

    @database_option
    def command(database_url: str | None, **options: Any) -> None:
        run_bulk(lambda: queue_for(database_url), action, **options)

    group.command(action.value, help=_HELP[action])(_bulk_options(command))


def run_bulk(
    open_queue: Callable[[], PgQueue],
    action: BulkAction,
    *,
    dry_run: bool,
    yes: bool,
    actor: str | None,
    as_json: bool,
    **filter_options: Any,
) -> None:
    """One bulk command: check the filter, count, confirm, act, print."""
    job_filter = job_filter_from_options(**filter_options)
    job_filter.states_for(action)  # an empty or unfitting filter is refused before connecting
    pgq = open_queue()
    admin = pgq.admin
    act = {
        BulkAction.RETRY: admin.bulk_retry,
        BulkAction.CANCEL: admin.bulk_cancel,
        BulkAction.DELETE: admin.bulk_delete,
    }[action]
    from pgqueue.admin import default_actor

    who = default_actor() if actor is None else actor
    if dry_run:
        preview = act(job_filter, dry_run=True, actor=who, source="cli")
        _print(preview, job_filter, as_json)
        _note_if_none(pgq, preview, job_filter)
        return
    expected: int | None = None
    if not yes:
        preview = act(job_filter, dry_run=True, actor=who, source="cli")
        if not sys.stdin.isatty():
            raise CommandError(
                f"refusing to {action.value} {plural(preview.count, 'job')} without confirmation: pass "
                "--yes (or --dry-run to only count)"
            )
        click.confirm(f"{action.value} {plural(preview.count, 'job')}?", abort=True, err=True)
        expected = preview.count
    result = act(job_filter, actor=who, source="cli", expected_count=expected)
    _print(result, job_filter, as_json)
    _note_if_none(pgq, result, job_filter)


def _note_if_none(pgq: PgQueue, result: BulkResult, job_filter: JobFilter) -> None:
    if result.count == 0:
        note_names_no_job_has(pgq, queue=job_filter.queue, task_name=job_filter.task_name)


def _print(result: BulkResult, job_filter: JobFilter, as_json: bool) -> None:
    if as_json:
        print_json(
            {
                "action": result.action.value,
                "count": result.count,
                "dry_run": result.dry_run,
                "flagged_running": result.flagged_running,
                "audit_id": result.audit_id,
                "filter": job_filter.as_record(),
            }
        )
    elif result.dry_run:
        echo(f"dry run: {result.action.value} would change {plural(result.count, 'job')}")
    else:
        running = (
            f" ({result.flagged_running:,} running, asked to stop)"
            if result.flagged_running
            else ""
        )
        echo(
            f"{_DONE[result.action]} {plural(result.count, 'job')}{running} "
            f"(audit record {result.audit_id})"
        )


@click.group()
def bulk() -> None:
    """Retry, cancel or delete the jobs a filter chooses (--dry-run counts them first)."""


for _action in BulkAction:
    _add_command(bulk, _action)
