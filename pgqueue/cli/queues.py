"""The commands about queues: pause and resume them, limit their running jobs, bound their
depth, each switch writing one audit record (actor: ``--actor``, default ``user@host``; source
``cli``); and the listing of the periodic schedules that feed them, which ``pgqueue schedules APP``
(``cli.schedules``) and ``flask pgqueue schedules`` print.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import click

from pgqueue.cli.shared import (
    CommandError,
    actor_option,
    console,
    database_option,
    did_you_mean,
    echo,
    known_queues,
    new_table,
    number_or_none,
    queue_for,
)

if TYPE_CHECKING:
    from pgqueue.core import PgQueue

new_option = click.option(
    "--new",
    is_flag=True,
    help="The queue has no jobs or settings yet, and this is on purpose (not a typo).",
)


def known_queue(pgq: PgQueue, queue: str, *, new: bool, doing: str) -> str:
    """``queue`` checked as every command checks a queue name, and known: it has jobs or
    settings, unless ``new`` says a queue set up before its first job is meant. A typo would
    otherwise report success on a queue no worker will ever see."""
    from pgqueue import validation

    name = validation.queue_name(queue)
    known = known_queues(pgq)
    if new or name in known:
        return name
    hint = "" if doing == "resume" else f", or add --new to {doing} it before its first job"
    meant = did_you_mean(name, known)
    raise CommandError(
        f"queue {name!r} has no jobs and no settings; nothing changed: check its name"
        f"{f' ({meant})' if meant else ''}{hint}"
    )


def print_schedules(pgq: PgQueue) -> None:
    """The table ``pgqueue schedules APP`` (``cli.schedules``) prints: each schedule's next run."""
    import datetime as dt

    from pgqueue.scheduler import describe

    table = new_table("pgqueue schedules")
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
    console().print(table)


@click.command()
@click.argument("queue")
@new_option
@actor_option
@database_option
def pause(queue: str, new: bool, actor: str | None, database_url: str | None) -> None:
    """Stop all workers from claiming QUEUE's jobs (running jobs finish)."""
    pgq = queue_for(database_url)
    name = known_queue(pgq, queue, new=new, doing="pause")
    pgq.admin.pause_queue(name, actor=actor, source="cli")
    echo(f"queue {queue} paused")


@click.command()
@click.argument("queue")
@actor_option
@database_option
def resume(queue: str, actor: str | None, database_url: str | None) -> None:
    """Let workers claim QUEUE's jobs again."""
    pgq = queue_for(database_url)
    name = known_queue(pgq, queue, new=False, doing="resume")
    pgq.admin.resume_queue(name, actor=actor, source="cli")
    echo(f"queue {queue} resumed")


@click.command()
@click.argument("queue")
@click.argument("limit")
@new_option
@actor_option
@database_option
def limit(queue: str, limit: str, new: bool, actor: str | None, database_url: str | None) -> None:
    """Allow at most LIMIT running jobs of QUEUE across all workers (``none`` removes it)."""
    pgq = queue_for(database_url)
    value = number_or_none(limit)
    name = known_queue(pgq, queue, new=new, doing="limit")
    pgq.admin.set_queue_limit(name, value, actor=actor, source="cli")
    echo(f"queue {queue}: limit {'removed' if value is None else value}")


@click.command(name="max-depth")
@click.argument("queue")
@click.argument("max_depth")
@new_option
@actor_option
@database_option
def max_depth(
    queue: str, max_depth: str, new: bool, actor: str | None, database_url: str | None
) -> None:
    """Refuse enqueues that would take QUEUE above MAX_DEPTH waiting jobs (``none`` removes
    the bound)."""
    pgq = queue_for(database_url)
    value = number_or_none(max_depth)
    name = known_queue(pgq, queue, new=new, doing="bound")
    pgq.admin.set_queue_max_depth(name, value, actor=actor, source="cli")
    echo(f"queue {queue}: max depth {'removed' if value is None else value}")
