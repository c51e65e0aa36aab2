"""``pgqueue migrate``: upgrade, downgrade or show pgqueue's schema revision, naming the sessions
whose locks a migration waited for and refusing a downgrade that would destroy data unless told.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import click

from pgqueue.cli.shared import CommandError, database_option, echo, queue_for, this_cli
from pgqueue.errors import DowngradeLosesData, MigrationInterrupted, error_line
from pgqueue.sqlstates import is_insufficient_privilege, is_lock_timeout

if TYPE_CHECKING:
    from pgqueue.core import PgQueue
    from pgqueue.migrations.blockers import Blocker, BlockerWatch


@click.command()
@click.argument("action", type=click.Choice(["upgrade", "downgrade", "current"]), default="upgrade")
@click.argument("revision", required=False)
@click.option(
    "--yes",
    is_flag=True,
    help="Downgrade even when it drops tables or columns that hold data (see the README).",
)
@database_option
def migrate(action: str, revision: str | None, yes: bool, database_url: str | None) -> None:
    """Upgrade (default), downgrade, or show pgqueue's schema revision."""
    run_migrate_command(queue_for(database_url, schema_checked=False), action, revision, yes=yes)


def run_migrate_command(pgq: PgQueue, action: str, revision: str | None, *, yes: bool) -> None:
    """Check the command line, then migrate ``pgq``'s database; one-line refusals."""
    from sqlalchemy.exc import DBAPIError

    # Checked before connecting: a mistyped command line changes nothing.
    if action == "downgrade" and not revision:
        raise CommandError(
            f"{this_cli()} migrate downgrade needs a REVISION: a revision id, or base to remove "
            "pgqueue's tables"
        )
    if action == "current" and revision is not None:
        raise CommandError(
            f"{this_cli()} migrate current takes no REVISION, got {revision!r}: it shows the "
            f"schema's revision; `{this_cli()} migrate upgrade {revision}` moves to one"
        )
    try:
        _migrate(pgq, action, revision, yes=yes)
    except DowngradeLosesData as exc:
        raise CommandError(
            f"{this_cli()} migrate: {exc}; nothing changed: add --yes to drop it"
        ) from None
    except DBAPIError as exc:
        if not is_insufficient_privilege(exc):
            raise
        # The expected failure for an application role with DML rights only: one line, no
        # traceback (the transaction rolled back, nothing changed).
        reason = str(exc.orig).strip().splitlines()[0]
        raise click.ClickException(
            f"{this_cli()} migrate: {reason} (SQLSTATE 42501): this database role may not change the "
            "schema; run migrate as the schema owner"
        ) from None


def _migrate(pgq: PgQueue, action: str, revision: str | None, *, yes: bool) -> None:
    from sqlalchemy.exc import DBAPIError

    from pgqueue import migrations
    from pgqueue.migrations.blockers import BlockerWatch, session_pid

    lock_timeout = pgq.settings.migration_lock_timeout
    # A connection, not a transaction: the migration commits on it itself (own_transaction), so
    # that the revisions building indexes CONCURRENTLY may leave its transaction to do so. The
    # handlers' engine: its sessions carry no statement_timeout of pgqueue's, which no SET
    # LOCAL could lift from the statements run outside the transaction.
    with pgq.handler_engine.connect() as connection:
        if action == "current":
            current = migrations.current(connection)
            head = migrations.head()
            marker = " (head)" if current == head else f" (head is {head})"
            echo(f"{current or 'none'}{marker}")
            return
        watch = BlockerWatch(pgq.engine, session_pid(connection), on_long_wait=_still_waiting)
        connection.commit()
        try:
            with watch:
                if action == "downgrade":
                    assert revision is not None  # refused without one before connecting
                    migrations.downgrade(
                        connection,
                        revision,
                        lock_timeout=lock_timeout,
                        refuse_data_loss=not yes,
                        own_transaction=True,
                    )
                else:
                    migrations.upgrade(
                        connection,
                        revision or "head",
                        lock_timeout=lock_timeout,
                        own_transaction=True,
                    )
        except MigrationInterrupted as exc:
            # Part of the run is committed: say where the schema is, not "nothing changed".
            cause = exc.__cause__
            if isinstance(cause, DBAPIError) and is_lock_timeout(cause):
                raise CommandError(f"{_waited(lock_timeout, watch)}; {exc}") from None
            reason = error_line(cause) if cause is not None else "failed"
            raise CommandError(f"{this_cli()} migrate: {reason}; {exc}") from None
        except DBAPIError as exc:
            if not is_lock_timeout(exc):
                raise
            raise CommandError(
                f"{_waited(lock_timeout, watch)}; nothing changed: end that transaction, or "
                "migrate again when it is done"
            ) from None
    with pgq.engine.connect() as connection:
        echo(f"pgqueue schema at {migrations.current(connection) or 'base'}")


def _waited(lock_timeout: float, watch: BlockerWatch) -> str:
    from pgqueue.migrations.blockers import described

    blockers = described(watch.blockers) or "a session gone since"
    return (
        f"{this_cli()} migrate: waited {lock_timeout:g} s (migration_lock_timeout) for a lock "
        f"held by {blockers}"
    )


def _still_waiting(blockers: list[Blocker], seconds: float) -> None:
    """A line on stderr while the migration waits on and on (an index build ``CONCURRENTLY``
    waits for every transaction older than it, with no lock_timeout to end the wait)."""
    from pgqueue.migrations.blockers import described

    named = described(blockers)
    echo(
        f"{this_cli()} migrate: waiting {seconds:.0f} s so far for {named} to end its "
        "transaction; the migration goes on when it does",
        err=True,
    )
