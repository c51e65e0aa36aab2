"""``pgqueue prune`` and ``pgqueue history maintain``: delete finished jobs past their
retention, and keep the partitioned history's partitions (coming days created, expired dropped).
"""

from __future__ import annotations

import click

from pgqueue.cli.shared import database_option, echo, in_this_cli, plural, queue_for, this_cli
from pgqueue.errors import NotSchemaOwner


@click.command()
@database_option
def prune(database_url: str | None) -> None:
    """Delete finished jobs past their retention (PGQUEUE_SUCCEEDED_RETENTION, ...)."""
    deleted = queue_for(database_url).admin.prune()
    echo(f"pruned {plural(deleted, 'job')}")


@click.group(name="history")
def history_group() -> None:
    """The partitioned history of finished jobs (PGQUEUE_HISTORY=partitioned)."""


@history_group.command(name="maintain")
@click.option(
    "--days-ahead",
    type=click.IntRange(min=1),
    default=7,
    show_default=True,
    help="Create the partitions of today and this many days after it.",
)
@click.option(
    "--retention-days",
    type=click.IntRange(min=1),
    default=None,
    help="Drop the days older than this [default: PGQUEUE_HISTORY_RETENTION_DAYS, 7].",
)
@database_option
def history_maintain(days_ahead: int, retention_days: int | None, database_url: str | None) -> None:
    """Create coming days' partitions and drop expired ones (run as the schema owner)."""
    admin = queue_for(database_url).admin
    try:
        report = admin.maintain_history(days_ahead=days_ahead, retention_days=retention_days)
    except NotSchemaOwner as exc:
        # As ``migrate``'s: exit 1, the expected refusal for a DML-only role, nothing changed.
        raise click.ClickException(in_this_cli(f"{this_cli()} history maintain: {exc}")) from None
    echo(report.summary())
