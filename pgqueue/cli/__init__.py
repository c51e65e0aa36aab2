"""The ``pgqueue`` command: migrate, run workers, inspect and control jobs, and the demo.

Commands that need tasks take an application path ``module:attribute`` naming a ``PgQueue``
(e.g. ``myapp.jobs:pgq``). Commands that only touch tables take ``--database-url`` (default
``$PGQUEUE_DATABASE_URL``, then the embedded server).

This module holds the command group and adds the commands of each group's module to it
(``migrate``, ``workers``, ``jobs``, ``history``, ``queues``, ``schedules``, ``flow``,
``bulk``, ``demo``, ``dashboard``); ``shared`` holds what they and ``flask pgqueue`` share,
output included, and ``reports`` the job reports both print.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

import click

from pgqueue.cli import (
    dashboard,
    demo,
    history,
    jobs,
    migrate,
    queues,
    schedules,
    shared,
    workers,
    workflows,
)
from pgqueue.cli.bulk import bulk
from pgqueue.cli.flow import key_limit, rate_limit
from pgqueue.cli.shared import OneLineErrors, configure_logging, debug_option, verbose_option
from pgqueue.cli.shared import load_app as load_app

if TYPE_CHECKING:
    from rich.console import Console

    console: Console


def __getattr__(name: str) -> Any:
    # ``console``, the commands' output console, is made on first use (``shared.console()``):
    # making it imports Rich, which ``pgqueue --help`` does without.
    if name == "console":
        return shared.console()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


@click.group(cls=OneLineErrors)
@verbose_option
@debug_option
@click.option(
    "--database-url",
    default=None,
    metavar="URL",
    help="SQLAlchemy URL for every command (each command's own --database-url wins; "
    "default: $PGQUEUE_DATABASE_URL, else the embedded server).",
)
@click.version_option(package_name="pgqueue")
def main(verbose: int, debug: bool, database_url: str | None) -> None:
    """pgqueue: PostgreSQL job queue for SQLAlchemy applications."""
    configure_logging(verbose)
    if database_url is not None:
        # As the environment variable: each command's option reads it as its default, and so
        # do an APP's PgQueue() and the worker processes of ``worker --processes N``.
        os.environ["PGQUEUE_DATABASE_URL"] = database_url


# Every command but the demo and the dashboard: ``flask pgqueue`` offers these too
# (``pgqueue.contrib.flask.cli``).
APP_COMMANDS = (
    migrate.migrate,
    workers.worker,
    workers.workers,
    jobs.jobs,
    jobs.stats,
    jobs.show,
    jobs.retry,
    jobs.cancel,
    jobs.enqueue,
    jobs.explain,
    workflows.workflow,
    history.prune,
    history.history_group,
    schedules.schedules,
    queues.pause,
    queues.resume,
    queues.limit,
    queues.max_depth,
    key_limit,
    rate_limit,
    bulk,
)
for _command in (*APP_COMMANDS, demo.demo, dashboard.dashboard):
    main.add_command(_command)


def entrypoint() -> None:
    main()
