"""``pgqueue schedules``: list the periodic schedules of an application (``pgqueue schedules
APP``, as it always has), pause and resume one by name, and run one now.

``pause`` and ``resume`` need only the database (``--app`` checks the name against the
application's schedules too); ``run`` needs the application, whose code holds the schedule's
task and arguments. Each action writes one audit record (actor: ``--actor``, default
``user@host``; source ``cli``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import click

from pgqueue.cli.queues import print_schedules
from pgqueue.cli.shared import (
    CommandError,
    actor_option,
    database_option,
    did_you_mean,
    echo,
    host_queue,
    load_app,
    queue_for,
    with_current_schema,
)

if TYPE_CHECKING:
    from pgqueue.core import PgQueue

# The command ``pgqueue schedules APP`` runs: the listing, under a name no schedule action has.
_LIST = "list"


class _ListOrAct(click.Group):
    """A group whose arguments, unless the first names one of its commands, are the
    listing's: ``pgqueue schedules APP`` (and ``flask pgqueue schedules``) lists, ``pgqueue
    schedules pause NAME`` acts."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        if not args or (args[0] not in self.commands and not args[0].startswith("-")):
            args = [_LIST, *args]
        return super().parse_args(ctx, args)


@click.group(cls=_ListOrAct)
def schedules() -> None:
    """List the periodic schedules of the PgQueue at APP with their next run
    (``pgqueue schedules APP``), or pause, resume or run one."""


@schedules.command(name=_LIST, hidden=True)
@click.argument("app")
def list_schedules(app: str) -> None:
    """List the periodic schedules of the PgQueue at APP with their next run."""
    print_schedules(load_app(app))


_app_option = click.option(
    "--app", default=None, help="The application (module:attribute) whose schedules NAME is of."
)


def _queue(app: str | None, database_url: str | None) -> tuple[PgQueue, bool]:
    """The command's queue, and whether its code's schedules are known (``--app``, or the
    host's app under ``flask pgqueue``)."""
    if app is None and host_queue() is None:
        return queue_for(database_url), False
    return with_current_schema(load_app(app or "")), True


def _switch(queue: tuple[PgQueue, bool], name: str, actor: str | None, *, paused: bool) -> None:
    pgq, app = queue
    act = pgq.admin.pause_schedule if paused else pgq.admin.resume_schedule
    done = "paused" if paused else "resumed"
    try:
        changed = act(name, actor=actor, source="cli")
    except LookupError as exc:
        known = [s.name for s in pgq.admin.schedules()]
        meant = did_you_mean(name, known)
        # Without the app, only the names the database recorded are known.
        hint = "" if app else " (pass --app APP for a schedule that has not ticked yet)"
        raise CommandError(f"{exc}{f'; {meant}' if meant else ''}; nothing changed{hint}") from exc
    echo(f"schedule {name} {done}" if changed else f"schedule {name} was {done} already")


@schedules.command()
@click.argument("name")
@_app_option
@actor_option
@database_option
def pause(name: str, app: str | None, actor: str | None, database_url: str | None) -> None:
    """Stop schedule NAME from enqueueing its ticks (those that fall meanwhile are dropped)."""
    _switch(_queue(app, database_url), name, actor, paused=True)


@schedules.command()
@click.argument("name")
@_app_option
@actor_option
@database_option
def resume(name: str, app: str | None, actor: str | None, database_url: str | None) -> None:
    """Let schedule NAME enqueue again, from its next tick on."""
    _switch(_queue(app, database_url), name, actor, paused=False)


@schedules.command()
@click.argument("app")
@click.argument("name")
@actor_option
def run(app: str, name: str, actor: str | None) -> None:
    """Enqueue schedule NAME of the PgQueue at APP now, once (not counted as a tick)."""
    pgq = with_current_schema(load_app(app))
    try:
        job_id: Any = pgq.admin.run_schedule_now(name, actor=actor, source="cli")
    except LookupError as exc:
        meant = did_you_mean(name, sorted(pgq.schedules))
        raise CommandError(f"{exc}{f'; {meant}' if meant else ''}") from exc
    echo(f"schedule {name}: job {job_id} enqueued")
