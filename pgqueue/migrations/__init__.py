"""pgqueue's schema as an Alembic lineage, run from code, the CLI, or a host's own Alembic.

The revisions live in ``pgqueue/migrations/versions`` (shipped in the wheel) under the branch
label ``pgqueue`` with ids prefixed ``pgqueue_``, and are recorded in their own version table,
``pgqueue_alembic_version``, so they never collide with the host application's history.

Four ways to run them:

* ``pgqueue migrate`` (CLI) or ``PgQueue.migrate()``, which call :func:`upgrade` and
  :func:`downgrade` with ``own_transaction=True``;
* :func:`upgrade_with_host` in a host's ``env.py``, which does the same on the host's
  ``alembic upgrade`` / ``flask db upgrade`` (and nothing on its other commands);
* ``pgqueue.migrations.upgrade(op.get_bind(), "pgqueue_0001")`` from one of the host's own
  revisions, pinning pgqueue's schema version in the host's history;
* adding ``pgqueue:migrations/versions`` to the host's ``version_locations`` and upgrading
  ``pgqueue@head`` with the host's own Alembic, which records pgqueue's revisions in its own
  ``alembic_version``; :func:`keep_host_revisions` keeps the host's new revisions in the host's
  directory and on the host's branch.

:func:`current` reads whichever version table holds pgqueue's lineage (its own, else rows of
the host's ``alembic_version`` whose ids start with ``pgqueue_``), and :func:`upgrade` and
:func:`downgrade` leave a lineage that the host's Alembic records to the host's Alembic: an
upgrade to a revision already applied there does nothing, anything else is refused in one line
(:class:`~pgqueue.errors.SchemaRecordedElsewhere`) instead of failing on tables that exist.

For hosts' autogenerate, :func:`include_object` keeps pgqueue's tables out of the comparison;
:func:`configure_args` gives a host's ``env.py`` the arguments for ``context.configure`` with
both hooks chained to the host's own (docs/how-to/alembic.md has one recipe per layout).

Every way in runs the revisions with ``statement_timeout`` off for the migration's transaction
(building an index on a long history takes as long as it takes, whatever the engine's timeout
for pgqueue's own statements) and with a deliberate ``lock_timeout`` (``Settings.
migration_lock_timeout``, default 5 s): a DDL statement queued behind a long transaction would
otherwise block every worker queued behind it. Both are set as ``SET LOCAL`` would set them
(the transaction's own, also behind a pooler) and put back as they were after the revisions,
so a host's transaction that called ``upgrade`` keeps its own settings.

With ``own_transaction=True`` (a connection with no transaction open, that pgqueue may commit
on) pgqueue commits its own reads, then lets Alembic begin the migration's transaction, so the
revisions that build indexes ``CONCURRENTLY`` (0023, 0025) may leave it to do so
(:mod:`pgqueue.migrations.online`): writers of ``pgqueue_jobs`` are not held up by the builds.
Each such build commits the revisions before it; a failure after that raises
:class:`~pgqueue.errors.MigrationInterrupted` naming the revision now recorded, from which the
next run continues. Without it, in the caller's transaction, nothing is committed and the
indexes are built in that transaction (writes to ``pgqueue_jobs`` wait for them).

``downgrade(..., refuse_data_loss=True)`` (what ``pgqueue migrate downgrade`` does without
``--yes``) refuses, before any step, a downgrade that would drop rows or values; see
:mod:`pgqueue.migrations.losses` for what counts.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

from sqlalchemy import Connection, Engine, inspect
from sqlalchemy.exc import DBAPIError

from pgqueue.config import DEFAULT_MIGRATION_LOCK_TIMEOUT
from pgqueue.data import schema as schema_data
from pgqueue.db import ConnectionExecutor
from pgqueue.errors import (
    DowngradeLosesData,
    MigrationInterrupted,
    SchemaNotCurrent,
    SchemaRecordedElsewhere,
    UnknownRevision,
    ValidationError,
)
from pgqueue.migrations import losses, shipped
from pgqueue.migrations.autogenerate import include_object as include_object
from pgqueue.migrations.autogenerate import is_history_partition as is_history_partition
from pgqueue.migrations.host import (
    REVISION_PREFIX,
    lists_pgqueue_revisions,
    running_alembic_upgrade,
)
from pgqueue.migrations.host import configure_args as configure_args
from pgqueue.migrations.host import keep_host_revisions as keep_host_revisions
from pgqueue.migrations.online import (
    COMMITS_KEY,
    LOCK_TIMEOUT_KEY,
    milliseconds,
    set_timeouts,
)
from pgqueue.sqlstates import is_insufficient_privilege

# Alembic is imported by the functions that run revisions or read its script directory: the
# schema check every command makes at its start (``check_schema``) reads the version tables with
# plain SELECTs and the shipped revisions from their files (``shipped``), without Alembic.
if TYPE_CHECKING:
    from alembic.config import Config
    from alembic.runtime.migration import MigrationContext
    from alembic.script import ScriptDirectory

VERSION_TABLE: Final = "pgqueue_alembic_version"
# Where a host's own Alembic records pgqueue's revisions when it runs them (third way above).
HOST_VERSION_TABLE: Final = "alembic_version"
JOBS_TABLE: Final = "pgqueue_jobs"
BRANCH_LABEL: Final = "pgqueue"
SCRIPT_LOCATION: Final = "pgqueue:migrations"
VERSION_LOCATION: Final = "pgqueue:migrations/versions"
# Seconds between two tries of a migration run waiting for another run to end.
MIGRATION_LOCK_RETRY: Final = 0.5


def alembic_config(connection: Connection | None = None) -> Config:
    """An Alembic Config for pgqueue's lineage, optionally bound to an open connection."""
    from alembic.config import Config

    config = Config()
    config.set_main_option("script_location", SCRIPT_LOCATION)
    config.set_main_option("version_locations", VERSION_LOCATION)
    # "pgqueue:..." contains the os separator ":", so split version locations on spaces.
    config.set_main_option("path_separator", "space")
    if connection is not None:
        config.attributes["connection"] = connection
    return config


def upgrade(
    connection: Connection,
    revision: str = "head",
    *,
    lock_timeout: float = DEFAULT_MIGRATION_LOCK_TIMEOUT,
    own_transaction: bool = False,
) -> None:
    """Upgrade pgqueue's tables to ``revision`` using the caller's connection (and its
    transaction: nothing is committed here). Safe to call from inside a host's revision.
    Statements run without ``statement_timeout`` and wait at most ``lock_timeout`` seconds
    for a lock (0: without limit). With ``own_transaction``, ``connection`` must have no
    transaction open and pgqueue commits on it, building indexes online (see the module)."""
    script = _script()
    target = _qualified(revision)
    _refuse_open_transaction(connection, own_transaction)

    def steps(rev: Any, _ctx: Any) -> Any:
        return script._upgrade_revs(target, rev)

    with _known_revision(script, revision):
        if not own_transaction:
            if not _applied_by_host(connection, script, target):
                _run(connection, steps, lock_timeout)
            return
        # Asked under the lock of migration runs: a run elsewhere commits its tables in parts
        # (around its online builds) before it records their revision.
        _run_owned(
            connection,
            steps,
            lock_timeout,
            unless=lambda: _applied_by_host(connection, script, target),
        )


def upgrade_with_host(
    connection: Connection, *, lock_timeout: float = DEFAULT_MIGRATION_LOCK_TIMEOUT
) -> bool:
    """For a host's ``env.py``, on the connection its revisions run on, before
    ``context.configure``: when the command is an upgrade (``alembic upgrade``, ``flask db
    upgrade``, online), upgrade pgqueue's tables to this pgqueue's head first, recorded in
    pgqueue's own version table and committed (as ``pgqueue migrate`` does: online index builds,
    one run at a time). Every other command (``revision``, ``current``, ``downgrade``, ``stamp``,
    ``check``) changes nothing here, nor does a host whose ``version_locations`` list pgqueue's
    revisions (its own Alembic runs them). True when it ran."""
    if not running_alembic_upgrade() or lists_pgqueue_revisions():
        return False
    upgrade(connection, lock_timeout=lock_timeout, own_transaction=True)
    return True


def downgrade(
    connection: Connection,
    revision: str,
    *,
    lock_timeout: float = DEFAULT_MIGRATION_LOCK_TIMEOUT,
    refuse_data_loss: bool = False,
    own_transaction: bool = False,
) -> None:
    """Downgrade pgqueue's tables to ``revision`` (``"base"`` removes them). With
    ``refuse_data_loss``, raise :class:`DowngradeLosesData` before any step when a step would
    drop rows or values (:mod:`pgqueue.migrations.losses`). ``own_transaction`` as for
    :func:`upgrade`."""
    script = _script()
    _refuse_open_transaction(connection, own_transaction)
    found = recorded(connection)
    if found is not None and found.table != VERSION_TABLE:
        raise SchemaRecordedElsewhere(
            f"pgqueue's revision {found.revision} is recorded in {found.table} by your own "
            f"Alembic; nothing changed: downgrade it there (`alembic downgrade pgqueue@{revision}`)"
        )

    def steps(rev: Any, _ctx: Any) -> Any:
        planned = script._downgrade_revs(revision, rev)
        if refuse_data_loss:
            lost = losses.found(connection, planned)
            if lost:
                raise DowngradeLosesData(
                    f"downgrade to {revision} would delete data: {'; '.join(lost)}", lost
                )
        return planned

    with _known_revision(script, revision):
        (_run_owned if own_transaction else _run)(connection, steps, lock_timeout)


@contextmanager
def _known_revision(script: ScriptDirectory, revision: str) -> Iterator[None]:
    """Alembic's refusal of a revision it cannot find or reach (a typo, a host's revision id)
    as a one-line :class:`UnknownRevision` naming the lineage's revisions; Alembic resolves
    the target only once the migration runs, so this wraps the run (whose transaction is the
    caller's to roll back)."""
    from alembic.util import CommandError as AlembicCommandError

    try:
        yield
    except AlembicCommandError as exc:
        ids = sorted(_known(script))
        raise UnknownRevision(
            f"revision {revision!r}: {exc}; nothing changed: pgqueue's revisions are {ids[0]} "
            f"to {ids[-1]} (head), base, or a step like -1 or +1"
        ) from None


def _script() -> ScriptDirectory:
    """Alembic's view of pgqueue's lineage (it imports every revision)."""
    from alembic.script import ScriptDirectory

    return ScriptDirectory.from_config(alembic_config())


def _run(connection: Connection, step: Any, lock_timeout: float) -> None:
    from alembic.runtime.migration import MigrationContext

    previous = schema_data.current_timeouts(ConnectionExecutor(connection))
    set_timeouts(connection, "0", milliseconds(lock_timeout))
    context = MigrationContext.configure(
        connection, opts={"version_table": VERSION_TABLE, "fn": step}
    )
    with _operations(context):
        context.run_migrations()
    set_timeouts(connection, previous[0], previous[1])


@contextmanager
def _operations(context: MigrationContext) -> Iterator[None]:
    """Alembic's ``op`` bound to ``context`` for the block.

    pgqueue runs the revisions on a MigrationContext of its own rather than through
    alembic.command: a command would load an env.py and install Alembic's module-level
    ``op``/``context`` proxies, clobbering those of a host migration that called it. The host's
    ``op`` proxy, if any, is put back afterwards."""
    from alembic.operations import Operations

    from alembic import op as op_module

    outer = getattr(op_module, "_proxy", None)
    try:
        with Operations.context(context):
            yield
    finally:
        if outer is not None:
            outer._install_proxy()


def _refuse_open_transaction(connection: Connection, own_transaction: bool) -> None:
    if own_transaction and connection.in_transaction():
        # Committing it would commit the caller's work, and leaving it open would keep the
        # online builds inside it.
        raise ValidationError(
            "own_transaction=True needs a connection without an open transaction: commit or "
            "roll back first"
        )


def _run_owned(
    connection: Connection,
    step: Any,
    lock_timeout: float,
    *,
    unless: Callable[[], bool] | None = None,
) -> None:
    """Run ``step`` in transactions of pgqueue's own, one run at a time, unless ``unless``
    (asked once the run's turn came) says there is nothing to do."""
    # pgqueue's reads so far end here, so that Alembic begins (and owns) the migration's
    # transaction: the revisions may then commit it to build indexes CONCURRENTLY.
    connection.commit()
    with _one_run_at_a_time(connection.engine):
        if unless is not None:
            done = unless()
            connection.commit()
            if done:
                return
        _run_alembic_owned(connection, step, lock_timeout)


@contextmanager
def _one_run_at_a_time(engine: Engine) -> Iterator[None]:
    """Hold the lock of pgqueue's migration runs (``sql.schema.MIGRATION_LOCK_KEYS``) for the
    block, waiting for a run elsewhere to end first: app instances that each call
    ``PgQueue.migrate()`` as they start then migrate one after the other, each later one
    finding the schema current (their revisions, committed in parts around the online builds,
    would otherwise run twice at once).

    The lock is held by a transaction of its own on a second connection: a session lock would
    stay on whichever server session a transaction pooler gave it, and the migration's own
    transactions end at each online build. That transaction is READ COMMITTED and writes
    nothing, so between statements it holds no snapshot, xid or table lock that a concurrent
    index build would wait for. A run that finds the lock taken tries again every
    ``MIGRATION_LOCK_RETRY`` seconds, each try in a short transaction of its own: the holder's
    builds wait for every transaction whose snapshot is older than theirs, so a waiter that
    kept one open would wait for them while they waited for it."""
    with engine.connect().execution_options(isolation_level="READ COMMITTED") as holder:
        while not schema_data.try_migration_lock(ConnectionExecutor(holder)):
            holder.rollback()
            time.sleep(MIGRATION_LOCK_RETRY)
        try:
            yield
        finally:
            holder.rollback()


def _run_alembic_owned(connection: Connection, step: Any, lock_timeout: float) -> None:
    from alembic.runtime.migration import MigrationContext

    lock_timeout_ms = milliseconds(lock_timeout)
    commits: list[bool] = []
    context = MigrationContext.configure(
        connection,
        opts={
            "version_table": VERSION_TABLE,
            "fn": step,
            LOCK_TIMEOUT_KEY: lock_timeout_ms,
            COMMITS_KEY: commits,
        },
    )
    try:
        with _operations(context), context.begin_transaction():
            set_timeouts(connection, "0", lock_timeout_ms)
            context.run_migrations()
    except Exception as exc:
        if not commits:
            raise  # rolled back whole: nothing changed
        try:
            revision = _recorded_after_failure(connection)
        except DBAPIError:
            # The server is gone too, say: what is known is that something was committed.
            raise MigrationInterrupted(
                "pgqueue schema partly migrated (online index builds committed; the revision "
                "now recorded could not be read); migrate again to continue",
                None,
            ) from exc
        raise MigrationInterrupted(
            f"pgqueue schema now at {revision or 'base'} (revisions up to it committed, and "
            "the online index builds of the next); migrate again to continue",
            revision,
        ) from exc


def _recorded_after_failure(connection: Connection) -> str | None:
    # On a connection of its own: the failed one may be unusable (its session terminated).
    with connection.engine.connect() as fresh:
        return current(fresh)


@dataclass(frozen=True)
class Recorded:
    """pgqueue's revision as a database records it, and the version table that holds it."""

    revision: str
    table: str


def recorded(connection: Connection) -> Recorded | None:
    """Where pgqueue's lineage is recorded: ``pgqueue_alembic_version`` (``pgqueue migrate``,
    ``PgQueue.migrate()``, ``upgrade()`` from a host's revision), else the host's
    ``alembic_version`` when the host's own Alembic ran pgqueue's revisions (its rows whose ids
    start with ``pgqueue_``); None before the first upgrade."""
    # Read as Alembic reads them (the table if it exists, then its rows), without Alembic.
    own = schema_data.recorded_revisions(ConnectionExecutor(connection), VERSION_TABLE)
    if len(own) > 1:
        from alembic.util import CommandError

        # Alembic's own refusal (``get_current_revision``), which this read replaces.
        raise CommandError(
            f"Version table '{VERSION_TABLE}' has more than one head present; please use "
            "get_current_heads()"
        )
    if own:
        return Recorded(own[0], VERSION_TABLE)
    by_host = _recorded_by_host(connection)
    return None if by_host is None else Recorded(by_host, HOST_VERSION_TABLE)


def current(connection: Connection) -> str | None:
    """pgqueue's revision in the connection's database, from whichever version table holds it
    (see :func:`recorded`), or None before the first upgrade."""
    found = recorded(connection)
    return None if found is None else found.revision


def head() -> str:
    """The newest revision shipped with this version of pgqueue."""
    found = shipped.lineage()
    if found is not None:
        return found.head
    heads = _script().get_heads()
    assert len(heads) == 1, heads
    return heads[0]


def check_schema(connection: Connection) -> None:
    """Raise :class:`SchemaNotCurrent` unless pgqueue's schema in the connection's database is
    at this pgqueue's head revision. Reads only the version tables and the catalog.

    A role with DML rights only may not read the version table; it is then enough that the
    jobs table exists (the owner runs the migrations).
    """
    database = connection.engine.url.database or "?"
    expected = head()
    try:
        with connection.begin_nested():
            revision = current(connection)
    except DBAPIError as exc:
        if not is_insufficient_privilege(exc):
            raise
        if inspect(connection).has_table(JOBS_TABLE):
            return
        revision = None
    if revision == expected:
        return
    if revision is None:
        raise SchemaNotCurrent(
            f"pgqueue's tables are missing in database {database}: run `pgqueue migrate`"
        )
    found = shipped.lineage()
    known = found.revisions if found is not None else _known(_script())
    if revision in known:
        raise SchemaNotCurrent(
            f"pgqueue's schema in database {database} is at {revision}, this pgqueue needs "
            f"{expected}: run `pgqueue migrate`"
        )
    raise SchemaNotCurrent(
        f"pgqueue's schema in database {database} is at {revision}, newer than this pgqueue "
        f"knows ({expected}): upgrade pgqueue"
    )


def _recorded_by_host(connection: Connection) -> str | None:
    recorded = schema_data.recorded_revisions(ConnectionExecutor(connection), HOST_VERSION_TABLE)
    ours = sorted(rev for rev in recorded if rev.startswith(REVISION_PREFIX))
    return ours[-1] if ours else None


def _applied_by_host(connection: Connection, script: ScriptDirectory, target: str) -> bool:
    """Whether the host's own Alembic already took pgqueue's lineage to ``target`` (then there
    is nothing to do). Raise :class:`SchemaRecordedElsewhere` when upgrading here would run
    revisions whose tables exist: the host's Alembic records them, or nothing does."""
    found = recorded(connection)
    if found is not None and found.table == VERSION_TABLE:
        return False
    database = connection.engine.url.database or "?"
    if found is None:
        if not inspect(connection).has_table(JOBS_TABLE):
            return False
        raise SchemaRecordedElsewhere(
            f"pgqueue's tables exist in database {database} but neither {VERSION_TABLE} nor "
            f"{HOST_VERSION_TABLE} records their revision; nothing changed: record the "
            "revision they are at with your Alembic (`alembic stamp pgqueue_NNNN`, see "
            '"A revision of yours already in pgqueue\'s package" in the Alembic how-to)'
        )
    if found.revision in _known(script):
        applied = {step.revision for step in script.iterate_revisions(found.revision, "base")}
        wanted = script.get_revision(target)
        if wanted is not None and wanted.revision in applied:
            return True
    raise SchemaRecordedElsewhere(
        f"pgqueue's schema in database {database} is at {found.revision}, recorded in "
        f"{found.table} by your own Alembic; nothing changed: upgrade it there "
        f"(`alembic upgrade {target}`)"
    )


def _known(script: ScriptDirectory) -> set[str]:
    return {revision.revision for revision in script.walk_revisions()}


def _qualified(revision: str) -> str:
    if revision in {"head", "heads"}:
        return f"{BRANCH_LABEL}@head"
    return revision
