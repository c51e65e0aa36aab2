"""``pgqueue migrate`` (and ``flask pgqueue migrate``, ``PgQueue.migrate()``) let Alembic own the
migration's transaction: 0023 and 0025 build their indexes ``CONCURRENTLY`` while other sessions
write ``pgqueue_jobs``; after such a build the migration's timeouts hold again; and a failure
after it says where the schema is instead of "nothing changed"."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from alembic.runtime.migration import MigrationContext
from sqlalchemy import Connection, create_engine, event, text
from sqlalchemy.engine import URL
from support.migration_runs import lock_held, migrate, migrated_to, revision_of, rows_of
from support.polling import wait_until

from pgqueue import migrations
from pgqueue.cli.migrate import run_migrate_command
from pgqueue.config import Settings
from pgqueue.core import PgQueue
from pgqueue.errors import ValidationError
from pgqueue.migrations import blockers
from pgqueue.migrations.online import (
    COMMITS_KEY,
    LOCK_TIMEOUT_KEY,
    migration_settings,
    outside_transaction,
)
from pgqueue.sql.schema import MIGRATION_LOCK_KEYS

STATE_INDEXES = ("ix_pgqueue_jobs_queue_state_id", "ix_pgqueue_jobs_task_name_state_id")
INSERT_JOB = "INSERT INTO pgqueue_jobs (task_name, queue) VALUES ('t', 'q')"


def _state_predicates(url: URL) -> dict[str, str | None]:
    rows = rows_of(
        url,
        "SELECT c.relname, pg_get_expr(i.indpred, i.indrelid)"
        " FROM pg_index AS i JOIN pg_class AS c ON c.oid = i.indexrelid"
        " WHERE c.relname LIKE 'ix\\_pgqueue\\_jobs\\_%state\\_id%' AND i.indisvalid",
    )
    return {name: predicate for name, predicate in rows}


def _waiting_build(connection: Connection) -> str | None:
    """The text of an index build that waits for a lock, if one does."""
    connection.rollback()
    found = connection.execute(
        text(
            "SELECT query FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
            " AND query LIKE 'CREATE%INDEX%' AND pid <> pg_backend_pid()"
        )
    ).scalar()
    return None if found is None else str(found)


@pytest.mark.parametrize("action", ["upgrade", "downgrade"])
def test_migrate_builds_the_state_indexes_concurrently_while_jobs_are_written(
    empty_database_url: URL, action: str
) -> None:
    engine = create_engine(empty_database_url)
    with engine.begin() as connection:
        migrations.upgrade(connection, "pgqueue_0024" if action == "upgrade" else "head")
        connection.execute(
            text(
                "INSERT INTO pgqueue_jobs (task_name, queue, state)"
                " SELECT 't', 'q', (ARRAY['queued', 'running', 'succeeded'])[i % 3 + 1]"
                " FROM generate_series(1, 3000) AS i"
            )
        )
    pgq = PgQueue(empty_database_url.render_as_string(hide_password=False), settings=Settings())
    statements: list[str] = []
    event.listen(pgq.handler_engine, "before_cursor_execute", lambda *a: statements.append(a[2]))
    failures: list[BaseException] = []

    def run() -> None:
        try:
            revision = "pgqueue_0024" if action == "downgrade" else None
            run_migrate_command(pgq, action, revision, yes=False)
        except BaseException as exc:  # reported by the test below
            failures.append(exc)

    migration = threading.Thread(target=run, daemon=True)
    try:
        with engine.connect() as older, engine.connect() as watcher, engine.connect() as writer:
            # A transaction older than the migration that wrote a job and stays open: a
            # concurrent build waits for it to end; a plain one would wait for its lock, and
            # every later writer of pgqueue_jobs would queue behind the build.
            older.execute(text(INSERT_JOB))
            migration.start()

            def build_waiting() -> str | None:
                assert migration.is_alive(), failures
                return _waiting_build(watcher)

            waiting = wait_until(build_waiting, 30, "a concurrent build waiting")
            assert waiting.startswith("CREATE INDEX CONCURRENTLY"), waiting
            with writer.begin():
                writer.execute(text("SET LOCAL lock_timeout = '3s'"))
                started = time.monotonic()
                writer.execute(text(INSERT_JOB))
                took = time.monotonic() - started
            assert took < 1, took
            older.commit()
            migration.join(timeout=60)
    finally:
        pgq.dispose()
        engine.dispose()
    assert not migration.is_alive() and not failures, failures
    built = [s for s in statements if s.startswith("CREATE INDEX CONCURRENTLY")]
    assert len(built) == 2, statements
    if action == "upgrade":
        assert revision_of(empty_database_url) == migrations.head()
        assert all("WHERE state <> 'running'" in s for s in built)
        wanted: str | None = "((state)::text <> 'running'::text)"
    else:
        assert revision_of(empty_database_url) == "pgqueue_0024"
        assert not any("WHERE" in s for s in built)
        wanted = None
    assert _state_predicates(empty_database_url) == dict.fromkeys(STATE_INDEXES, wanted)


@pytest.mark.slow
def test_a_lock_timeout_after_an_online_build_names_the_revision_reached(
    empty_database_url: URL, tmp_path: Path
) -> None:
    migrated_to(empty_database_url, "pgqueue_0022")
    # 0023 commits the run and swaps its unique index online (the holder holds no lock on
    # pgqueue_jobs and no snapshot, so the build does not wait for it); 0024 then alters
    # pgqueue_workflows, whose lock the holder keeps: only the migration's lock_timeout, given
    # again after 0023's online step, ends that wait before the holder's 20 s.
    statement = "LOCK TABLE pgqueue_workflows IN ROW EXCLUSIVE MODE"
    with lock_held(empty_database_url, statement, 20) as pid:
        started = time.monotonic()
        result = migrate([], empty_database_url, tmp_path, PGQUEUE_MIGRATION_LOCK_TIMEOUT="1")
        elapsed = time.monotonic() - started
    output = (result.stdout + result.stderr).strip().splitlines()
    assert result.returncode == 2, (result.stdout, result.stderr)
    assert len(output) == 1 and "Traceback" not in result.stderr, output
    (line,) = output
    assert line.startswith("error: pgqueue migrate: waited 1 s"), line
    assert f"pid {pid}" in line, line
    assert "nothing changed" not in line, line
    assert "pgqueue schema now at pgqueue_0022 (revisions up to it committed" in line, line
    assert line.endswith("migrate again to continue"), line
    assert elapsed < 10, elapsed
    assert revision_of(empty_database_url) == "pgqueue_0022"

    again = migrate([], empty_database_url, tmp_path)
    assert again.returncode == 0, again.stderr
    assert revision_of(empty_database_url) == migrations.head()


@pytest.mark.parametrize("carries_timeout", [True, False])
def test_outside_transaction_gives_the_migration_timeouts_again(
    empty_database_url: URL, carries_timeout: bool
) -> None:
    engine = create_engine(empty_database_url)
    commits: list[bool] = []
    opts: dict[str, Any] = {COMMITS_KEY: commits}
    if carries_timeout:
        opts[LOCK_TIMEOUT_KEY] = "1234"
    settings = "SELECT current_setting('statement_timeout'), current_setting('lock_timeout')"
    try:
        with engine.connect() as connection:
            context = MigrationContext.configure(connection, opts=opts)
            with context.begin_transaction():
                migration_settings(connection, 1.234)
                connection.execute(text("SET LOCAL statement_timeout = '7s'"))
                with outside_transaction(context):
                    outside = context.connection.execute(text(settings)).one()
                after = connection.execute(text(settings)).one()
    finally:
        engine.dispose()
    assert tuple(outside) == ("0", "0")  # the session's, which pgqueue does not set
    assert commits == [True]
    assert tuple(after) == (("0", "1234ms") if carries_timeout else ("0", "0"))


def test_own_transaction_refuses_a_connection_in_a_transaction(empty_database_url: URL) -> None:
    engine = create_engine(empty_database_url)
    try:
        with engine.begin() as connection, pytest.raises(ValidationError, match="open transaction"):
            migrations.upgrade(connection, own_transaction=True)
    finally:
        engine.dispose()
    assert revision_of(empty_database_url) is None


def test_an_online_build_longer_than_statement_timeout_completes(
    empty_database_url: URL, tmp_path: Path
) -> None:
    migrated_to(empty_database_url, "pgqueue_0024")
    # 0025's concurrent builds wait 1.5 s for an older transaction that wrote to pgqueue_jobs:
    # longer than a 300 ms statement_timeout. Outside the migration's transaction no SET LOCAL
    # lifts pgqueue's own statement_timeout: the migration's connection must not carry it.
    with lock_held(empty_database_url, "LOCK TABLE pgqueue_jobs IN ROW EXCLUSIVE MODE", 1.5):
        result = migrate([], empty_database_url, tmp_path, PGQUEUE_STATEMENT_TIMEOUT_MS="300")
    assert result.returncode == 0, result.stderr
    assert revision_of(empty_database_url) == migrations.head()
    assert _state_predicates(empty_database_url) == dict.fromkeys(
        STATE_INDEXES, "((state)::text <> 'running'::text)"
    )


def test_pgqueue_migrate_builds_online(empty_database_url: URL) -> None:
    migrated_to(empty_database_url, "pgqueue_0024")
    pgq = PgQueue(empty_database_url.render_as_string(hide_password=False), settings=Settings())
    statements: list[str] = []
    event.listen(pgq.handler_engine, "before_cursor_execute", lambda *a: statements.append(a[2]))
    try:
        pgq.migrate()
    finally:
        pgq.dispose()
    assert len([s for s in statements if s.startswith("CREATE INDEX CONCURRENTLY")]) == 2
    assert revision_of(empty_database_url) == migrations.head()


def test_a_refusal_after_an_online_step_does_not_say_nothing_changed(
    database_url: URL, tmp_path: Path
) -> None:
    engine = create_engine(database_url)
    with engine.begin() as connection:
        connection.execute(
            text(
                "INSERT INTO pgqueue_jobs (task_name, queue, state, unique_key)"
                " VALUES ('t', 'q', 'waiting', 'k1')"
            )
        )
    engine.dispose()
    # 0025's downgrade swaps its indexes back online (committing the revisions above it too),
    # then 0023's downgrade refuses over the waiting job's key.
    result = migrate(["downgrade", "pgqueue_0022"], database_url, tmp_path)
    output = (result.stdout + result.stderr).strip().splitlines()
    assert result.returncode == 2, (result.stdout, result.stderr)
    assert len(output) == 1, output
    (line,) = output
    assert "downgrade below pgqueue_0023 refused: waiting jobs hold unique keys" in line, line
    assert "nothing changed" not in line, line
    assert "pgqueue schema now at pgqueue_0025 (revisions up to it committed" in line, line
    assert revision_of(database_url) == "pgqueue_0025"
    assert _state_predicates(database_url) == dict.fromkeys(STATE_INDEXES, None)


def test_a_long_wait_for_an_older_transaction_is_reported_while_it_lasts(
    empty_database_url: URL, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    migrated_to(empty_database_url, "pgqueue_0024")
    monkeypatch.setattr(blockers, "WAIT_NOTICE_AFTER", 0.5)
    pgq = PgQueue(empty_database_url.render_as_string(hide_password=False), settings=Settings())
    failures: list[BaseException] = []

    def run() -> None:
        try:
            run_migrate_command(pgq, "upgrade", None, yes=False)
        except BaseException as exc:  # reported by the test below
            failures.append(exc)

    migration = threading.Thread(target=run, daemon=True)
    # The older transaction wrote to pgqueue_jobs and stays open: 0025's first concurrent build
    # waits for it, with no lock_timeout to end the wait.
    with lock_held(empty_database_url, "LOCK TABLE pgqueue_jobs IN ROW EXCLUSIVE MODE", 30) as pid:
        migration.start()

        def waiting_notice() -> str:
            assert migration.is_alive(), failures
            err = capsys.readouterr().err
            return err if "waiting" in err else ""

        seen = wait_until(waiting_notice, 30, "the notice that the migration waits", 0.1)
        assert revision_of(empty_database_url) == "pgqueue_0024"
    migration.join(timeout=60)
    pgq.dispose()
    assert not migration.is_alive() and not failures, failures
    lines = seen.strip().splitlines()
    assert len(lines) == 1, lines
    assert lines[0].startswith("pgqueue migrate: waiting "), lines
    assert f"pid {pid}, 'report-job', idle in transaction" in lines[0], lines
    assert lines[0].endswith("to end its transaction; the migration goes on when it does")
    assert revision_of(empty_database_url) == migrations.head()


def test_a_migrate_waiting_for_another_run_asks_what_is_applied_once_its_turn_comes(
    empty_database_url: URL,
) -> None:
    engine = create_engine(empty_database_url)
    url = empty_database_url.render_as_string(hide_password=False)
    pgq = PgQueue(url, settings=Settings())
    failures: list[BaseException] = []

    def start() -> None:
        try:
            pgq.migrate()
        except BaseException as exc:  # reported by the test below
            failures.append(exc)

    def tried_the_lock() -> bool:
        with engine.connect() as connection:
            return bool(
                connection.execute(
                    text(
                        "SELECT count(*) FROM pg_stat_activity WHERE pid <> :holder"
                        " AND query LIKE '%pg_try_advisory_xact_lock%'"
                    ),
                    {"holder": holder_pid},
                ).scalar_one()
            )

    # Another run, midway: it holds the lock of migration runs and has committed a table whose
    # revision it has not recorded yet (as around its online index builds).
    with engine.begin() as connection:
        connection.execute(text("CREATE TABLE pgqueue_jobs (id bigint)"))
    with engine.connect() as elsewhere:
        holder_pid = elsewhere.execute(text("SELECT pg_backend_pid()")).scalar_one()
        first, second = MIGRATION_LOCK_KEYS
        elsewhere.execute(text(f"SELECT pg_advisory_xact_lock({first}, {second})"))
        waiting = threading.Thread(target=start)
        waiting.start()
        wait_until(lambda: failures or tried_the_lock(), 30, "the second run to try the lock")
        assert failures == []
        with engine.begin() as connection:  # the other run ends, its revisions recorded
            connection.execute(text("DROP TABLE pgqueue_jobs"))
            migrations.upgrade(connection)
        elsewhere.rollback()
    waiting.join(60)
    pgq.dispose()
    engine.dispose()
    assert failures == []
    assert revision_of(empty_database_url) == migrations.head()


@pytest.mark.slow
@pytest.mark.parametrize("start", [None, "pgqueue_0024"])
def test_app_instances_that_each_migrate_as_they_start_all_succeed(
    empty_database_url: URL, tmp_path: Path, start: str | None
) -> None:
    if start is not None:
        engine = create_engine(empty_database_url)
        with engine.begin() as connection:
            migrations.upgrade(connection, start)
            connection.execute(
                text(
                    "INSERT INTO pgqueue_jobs (task_name, queue)"
                    " SELECT 't', 'q' FROM generate_series(1, 200000)"
                )
            )
        engine.dispose()
    # As gunicorn's workers would, each calling pgq.migrate() at import: one migrates, the
    # others wait for it (without holding up its concurrent builds) and find nothing to do.
    code = (
        "import sys; from pgqueue import PgQueue, Settings; "
        "PgQueue(sys.argv[1], settings=Settings()).migrate(); print('migrated')"
    )
    url = empty_database_url.render_as_string(hide_password=False)
    starts = [
        subprocess.Popen(
            [sys.executable, "-c", code, url],
            cwd=tmp_path,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for _ in range(4)
    ]
    outputs = [process.communicate(timeout=120)[0] for process in starts]
    assert [process.returncode for process in starts] == [0, 0, 0, 0], outputs
    assert revision_of(empty_database_url) == migrations.head()
    assert _state_predicates(empty_database_url) == dict.fromkeys(
        STATE_INDEXES, "((state)::text <> 'running'::text)"
    )
    leftovers = rows_of(
        empty_database_url,
        "SELECT c.relname FROM pg_index AS i JOIN pg_class AS c"
        " ON c.oid = i.indexrelid WHERE c.relname LIKE '%\\_swap' OR NOT i.indisvalid",
    )
    assert leftovers == []


def test_a_build_left_invalid_by_an_interrupted_run_is_dropped_by_the_next(
    empty_database_url: URL, tmp_path: Path
) -> None:
    migrated_to(empty_database_url, "pgqueue_0024")
    engine = create_engine(empty_database_url, isolation_level="AUTOCOMMIT")
    try:
        with engine.connect() as connection:
            connection.execute(text(INSERT_JOB))
            connection.execute(text(INSERT_JOB))
            # A concurrent build that fails leaves its index behind, INVALID, as a cancelled
            # build of an interrupted run does: here a unique one over two equal rows.
            with pytest.raises(Exception, match="could not create unique index"):
                connection.execute(
                    text(
                        "CREATE UNIQUE INDEX CONCURRENTLY ix_pgqueue_jobs_queue_state_id_swap"
                        " ON pgqueue_jobs (queue)"
                    )
                )
    finally:
        engine.dispose()
    invalid = "SELECT c.relname FROM pg_index AS i JOIN pg_class AS c ON c.oid = i.indexrelid"
    invalid += " WHERE NOT i.indisvalid"
    assert rows_of(empty_database_url, invalid) == [("ix_pgqueue_jobs_queue_state_id_swap",)]

    result = migrate([], empty_database_url, tmp_path)
    assert result.returncode == 0, result.stderr
    assert revision_of(empty_database_url) == migrations.head()
    assert rows_of(empty_database_url, invalid) == []
    assert _state_predicates(empty_database_url) == dict.fromkeys(
        STATE_INDEXES, "((state)::text <> 'running'::text)"
    )
