"""The job reports both CLIs print: ``jobs``'s page of jobs (with its filter options),
``stats``'s counts per queue and state, and ``show``'s record of one job. They print only
through ``shared``'s outputs (``console``, ``echo``, ``print_json``).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
from typing import TYPE_CHECKING, Any

import click

from pgqueue.cli.shared import (
    CommandError,
    console,
    did_you_mean,
    echo,
    json_option,
    known_queues,
    new_table,
    print_json,
    this_cli,
)
from pgqueue.errors import PgQueueError, ValidationError
from pgqueue.job_filter import TIME_COLUMNS, parse_time
from pgqueue.job_search import DEFAULT_SEARCH_SCAN, JsonMatch
from pgqueue.states import JobState

if TYPE_CHECKING:
    from pgqueue.admin import JobHolder
    from pgqueue.core import PgQueue


def _refuse_bad_names(*, queue: str | None, task_name: str | None) -> None:
    from pgqueue import validation

    try:
        if queue is not None:
            validation.queue_name(queue)
        if task_name is not None:
            validation.task_name(task_name)
    except PgQueueError as exc:
        raise CommandError(str(exc)) from None


def note_names_no_job_has(pgq: PgQueue, *, queue: str | None, task_name: str | None) -> None:
    """Under an empty listing or a bulk action that matched nothing, one ``note:`` line on
    stderr naming the queue or task name that no job has (a likely typo), with the name meant
    when one is close, whatever the other filters; the exit code stays 0, as for any listing
    that finds nothing."""
    unknown = []
    hint = ""
    if queue is not None and not pgq.admin.list_jobs(queue=queue, limit=1).jobs:
        unknown.append(f"queue {queue!r}")
        meant = did_you_mean(queue, known_queues(pgq))
        hint = f": {meant}" if meant else f" (`{this_cli()} stats` lists the queues)"
    if task_name is not None and not pgq.admin.list_jobs(task_name=task_name, limit=1).jobs:
        unknown.append(f"task {task_name!r}")
        if not hint:
            hint = " (a task's name is as registered, module.function unless named)"
    if unknown:
        echo(f"note: no job has {' or '.join(unknown)}: check the name{hint}", err=True)


def job_filter_options(function: Any) -> Any:
    """The options of ``pgqueue jobs``: its filters and paging."""
    options = [
        click.option("--queue", "-q", default=None, help="Only this queue."),
        click.option("--state", "-s", type=click.Choice([s.value for s in JobState]), default=None),
        click.option("--task", "-t", "task_name", default=None, help="Only this task name."),
        click.option("--limit", "-n", default=20, show_default=True, type=click.IntRange(1, 1000)),
        click.option("--before", type=int, default=None, help="Only jobs older than this job id."),
        click.option("--id", "job_id", type=int, default=None, help="Only this job."),
        click.option(
            "--since",
            default=None,
            help="Search from this time on: ISO 8601 (UTC unless an offset is given) or an age "
            "such as 12h, 90m, 2d.",
        ),
        click.option("--until", default=None, help="Search before this time (as --since)."),
        click.option(
            "--time-column",
            type=click.Choice(TIME_COLUMNS),
            default="created_at",
            show_default=True,
            help="The time --since/--until bound.",
        ),
        click.option(
            "--error-contains",
            default=None,
            help="Only jobs whose last error contains this text (any case); needs --since.",
        ),
        click.option(
            "--json-equals",
            default=None,
            metavar="PATH=JSON",
            help="Only jobs whose JSON at PATH equals this value: kwargs.user_id=42, "
            'args.0="a@b.c", result.total=3; needs --since.',
        ),
        click.option(
            "--json-contains",
            default=None,
            metavar="PATH=JSON",
            help='Only jobs whose JSON at PATH contains this value (kwargs.tags=["vip"]); '
            "needs --since.",
        ),
        click.option(
            "--scan",
            type=int,
            default=DEFAULT_SEARCH_SCAN,
            show_default=True,
            help="A search reads at most this many jobs of its window.",
        ),
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


# The names ``list_jobs``' messages give its arguments, as this command's options.
_OPTION_NAMES = {"since=": "--since", "until=": "--until", "time_column": "--time-column"}


def search_filters(
    *,
    queue: str | None,
    state: str | None,
    task_name: str | None,
    limit: int,
    before: int | None,
    job_id: int | None = None,
    since: str | None = None,
    until: str | None = None,
    time_column: str = "created_at",
    error_contains: str | None = None,
    json_equals: str | None = None,
    json_contains: str | None = None,
    scan: int = DEFAULT_SEARCH_SCAN,
) -> dict[str, Any]:
    """The options of ``jobs`` as ``list_jobs``' arguments, checked as it checks them (so a
    command may refuse them before it connects); a bad value is a ``CommandError`` (one line,
    exit code 2)."""
    from pgqueue.admin_values import list_arguments  # SQLAlchemy: not for --help

    now = dt.datetime.now(dt.UTC)
    try:
        if json_equals is not None and json_contains is not None:
            raise ValidationError("give --json-equals or --json-contains, not both")
        match = None
        if json_equals is not None:
            match = JsonMatch.parse(json_equals)
        elif json_contains is not None:
            match = JsonMatch.parse(json_contains, contains=True)
        arguments: dict[str, Any] = {
            "queue": queue,
            "state": JobState(state) if state else None,
            "task_name": task_name,
            "before": before,
            "after": None,
            "limit": limit,
            "job_id": job_id,
            "since": None if since is None else parse_time("--since", since, now),
            "until": None if until is None else parse_time("--until", until, now),
            "time_column": time_column,
            "error_contains": error_contains,
            "json_match": match,
            "scan": scan,
        }
        list_arguments(**arguments)
    except ValidationError as exc:
        message = str(exc)
        for argument, option in _OPTION_NAMES.items():
            message = message.replace(argument, option)
        raise CommandError(message) from None
    return arguments


def print_jobs(pgq: PgQueue, *, as_json: bool, **options: Any) -> None:
    """What ``pgqueue jobs`` prints: a page of jobs, newest first, or
    the page of a search (``options``: those of ``job_filter_options``, see
    ``search_filters``), with a note when its bound cut the search short.

    A queue or task name that ``checked_name`` refuses is refused here too, unless jobs have
    it: rows written by other clients may hold any name, and listing them is how one finds
    them."""
    arguments = search_filters(**options)
    page = pgq.admin.list_jobs(**arguments)
    queue, task_name, before = arguments["queue"], arguments["task_name"], arguments["before"]
    if not page.jobs and before is None:
        _refuse_bad_names(queue=queue, task_name=task_name)
        note_names_no_job_has(pgq, queue=queue, task_name=task_name)
    if as_json:
        print_json(
            {
                "jobs": [job_record(job) for job in page.jobs],
                "older": page.older,
                "newer": page.newer,
                "search": None if page.search is None else dataclasses.asdict(page.search),
            }
        )
        return
    table = new_table("pgqueue jobs")
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
    console().print(table)
    if page.search is not None and page.search.cut_short:
        echo(f"note: {page.search.summary()} (--before {page.older})", err=True)


def print_stats(pgq: PgQueue, *, as_json: bool) -> None:
    """What ``pgqueue stats`` prints: counts per queue and state."""
    counts = pgq.admin.counts()
    if as_json:
        print_json(
            {
                queue: {state.value: by_state.get(state, 0) for state in JobState}
                for queue, by_state in counts.items()
            }
        )
        return
    table = new_table("jobs per queue and state")
    table.add_column("queue")
    for state in JobState:
        table.add_column(state.value, justify="right")
    for queue, by_state in sorted(counts.items()):
        table.add_row(queue, *(str(by_state.get(s, 0)) for s in JobState))
    console().print(table)


def print_job(pgq: PgQueue, job_id: int, *, as_json: bool) -> None:
    """What ``pgqueue show`` prints: one job, a field a line and its
    errors' tracebacks as text (``--json``: one JSON document on one line)."""
    job = pgq.admin.get_job(job_id)
    holder = pgq.admin.job_holder(job_id) if job.state is JobState.RUNNING else None
    steps = {
        "steps": [{"name": s.name, "completed_at": s.completed_at.isoformat()} for s in job.steps]
    }
    record = {**job_record(job), **holder_record(holder), **steps}
    if as_json:
        print_json(record)
        return
    echo(readable_job(record))


def readable_job(record: dict[str, Any]) -> str:
    """A job's record for a person: one ``key  value`` line per field (lists and objects as
    compact JSON), then its errors with their tracebacks as the lines they are, oldest first
    (``last_error`` only when the history does not already end with it)."""
    errors = record.get("errors") or []
    last_error = record.get("last_error")
    fields = {k: v for k, v in record.items() if k not in {"errors", "last_error"}}
    width = max(len(key) for key in fields)
    lines = [f"{key:<{width}}  {_field_text(value)}" for key, value in fields.items()]
    texts = [(_error_heading(e), str(e.get("error", ""))) for e in errors if isinstance(e, dict)]
    if last_error and (not texts or texts[-1][1] != last_error):
        texts.append(("last error:", last_error))
    for heading, text in texts:
        lines.append(heading)
        lines.extend(f"    {line}" for line in text.rstrip().splitlines())
    return "\n".join(lines)


def _error_heading(entry: dict[str, Any]) -> str:
    return f"error of attempt {entry.get('attempt', '?')} at {entry.get('at', '?')}:"


def _field_text(value: Any) -> str:
    if isinstance(value, dict | list):
        return json.dumps(value, default=str, sort_keys=True)
    return "" if value is None else str(value)


def holder_record(holder: JobHolder | None) -> dict[str, Any]:
    """``{"worker": ...}`` naming the registered worker holding a RUNNING job (``{}`` when
    no one holds it): host, pid and seconds since seen, or ``"registered": false`` when the
    worker has no row (it is gone)."""
    if holder is None:
        return {}
    worker: dict[str, Any] = {"id": holder.worker_id, "registered": holder.registered}
    if holder.registered:
        worker.update(
            host=holder.host,
            pid=holder.pid,
            last_seen_at=holder.last_seen_at.isoformat() if holder.last_seen_at else None,
            seconds_since_seen=round(holder.seconds_since_seen or 0.0, 3),
            live=holder.live,
        )
    return {"worker": worker}
