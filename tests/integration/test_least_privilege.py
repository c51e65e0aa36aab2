"""Least privilege (issue 5, item 9): everything but ``migrate`` runs with DML rights only.

A role is created with exactly the grants the README shows: ``CONNECT`` on the database,
``USAGE`` on the schema, and ``SELECT, INSERT, UPDATE, DELETE`` on pgqueue's tables, nothing
else (no sequence, no version table, no ``CREATE``). Connected as that role, a full cycle runs:
enqueue (API and CLI), a worker woken by LISTEN running jobs with a retry, a failure, a rescue of
an expired lease and a prune by its maintenance loop, ``retry``/``cancel``, the ``stats`` and
``show`` commands, and a ``pgqueue worker --drain`` process. ``pgqueue migrate`` fails for that
role with PostgreSQL's "permission denied", and leaves the database as it was.
"""

from __future__ import annotations

import itertools
import json
import os
import re
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import Engine, create_engine, text
from sqlalchemy.engine import URL

from pgqueue import PgQueue, Retry, Settings
from pgqueue.models import metadata
from pgqueue.states import JobState
from pgqueue.testing import wait_for_states
from pgqueue.worker import Worker

PASSWORD = "pgqueue-app-secret"
_counter = itertools.count()


def pgqueue_tables() -> list[str]:
    """pgqueue's own tables, from its models (the migration's version table is not one)."""
    return sorted(t.name for t in metadata.sorted_tables)


def grant_statements(role: str, database: str) -> list[str]:
    """The grants the README documents, for ``role`` on ``database``."""
    tables = ", ".join(pgqueue_tables())
    return [
        f'GRANT CONNECT ON DATABASE "{database}" TO {role}',
        f"GRANT USAGE ON SCHEMA public TO {role}",
        f"GRANT SELECT, INSERT, UPDATE, DELETE ON {tables} TO {role}",
    ]


def _admin(url: URL) -> Engine:
    return create_engine(url, isolation_level="AUTOCOMMIT")


@pytest.fixture
def app_role(database_url: URL, empty_database_url: URL) -> Iterator[str]:
    """A login role holding only the documented grants on ``database_url``'s pgqueue tables."""
    role = f"pgqueue_app_{os.getpid()}_{next(_counter)}"
    assert re.fullmatch(r"[a-z0-9_]+", role)  # interpolated as an identifier below
    admin = _admin(database_url)
    with admin.connect() as connection:
        connection.execute(
            text(
                f"CREATE ROLE {role} LOGIN PASSWORD '{PASSWORD}' NOSUPERUSER NOCREATEDB NOCREATEROLE NOINHERIT"
            )
        )
        # What PostgreSQL 15+ does by default, done explicitly so the test means the same on 14.
        connection.execute(text("REVOKE CREATE ON SCHEMA public FROM PUBLIC"))
        connection.execute(text(f'REVOKE ALL ON DATABASE "{database_url.database}" FROM PUBLIC'))
        for statement in grant_statements(role, str(database_url.database)):
            connection.execute(text(statement))
    empty_admin = _admin(empty_database_url)
    with empty_admin.connect() as connection:
        connection.execute(text("REVOKE CREATE ON SCHEMA public FROM PUBLIC"))
        connection.execute(
            text(f'GRANT CONNECT ON DATABASE "{empty_database_url.database}" TO {role}')
        )
    try:
        yield role
    finally:
        for engine in (admin, empty_admin):
            with engine.connect() as connection:
                connection.execute(
                    text(
                        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = :r"
                    ),
                    {"r": role},
                )
                connection.execute(text(f"DROP OWNED BY {role}"))
            engine.dispose()
        with admin.connect() as connection:
            connection.execute(text(f"DROP ROLE {role}"))
        admin.dispose()


def as_role(url: URL, role: str) -> URL:
    return url.set(username=role, password=PASSWORD)


def test_the_role_has_only_the_documented_rights(database_url: URL, app_role: str) -> None:
    """The grants are really minimal: no DDL, no sequence, no version table, no superuser."""
    with _admin(database_url).connect() as connection:
        rights = connection.execute(
            text(
                """SELECT
                    has_schema_privilege(:r, 'public', 'CREATE'),
                    has_database_privilege(:r, current_database(), 'CREATE'),
                    has_database_privilege(:r, current_database(), 'TEMP'),
                    has_table_privilege(:r, 'pgqueue_alembic_version', 'SELECT'),
                    has_sequence_privilege(:r, 'pgqueue_jobs_id_seq', 'USAGE'),
                    has_table_privilege(:r, 'pgqueue_jobs', 'TRUNCATE'),
                    has_table_privilege(:r, 'pgqueue_jobs', 'TRIGGER'),
                    (SELECT rolsuper OR rolcreatedb OR rolcreaterole OR rolbypassrls
                     FROM pg_roles WHERE rolname = :r)"""
            ),
            {"r": app_role},
        ).one()
        owned = connection.execute(
            text("SELECT count(*) FROM pg_class WHERE relowner = CAST(:r AS regrole)"),
            {"r": app_role},
        ).scalar_one()
    assert tuple(rights) == (False,) * 8
    assert owned == 0


def _write_app(tmp_path: Path) -> None:
    (tmp_path / "lp_app.py").write_text(
        textwrap.dedent(
            """
            import os
            from pgqueue import PgQueue, Settings

            pgq = PgQueue(os.environ["DB_URL"], settings=Settings(poll_interval=0.2))

            @pgq.task(name="lp.add")
            def add(a, b):
                return a + b
            """
        )
    )


def _cli(tmp_path: Path, url: URL, *args: str) -> subprocess.CompletedProcess[str]:
    env = {
        **os.environ,
        "DB_URL": url.render_as_string(hide_password=False),
        "PGQUEUE_DATABASE_URL": url.render_as_string(hide_password=False),
    }
    return subprocess.run(
        [sys.executable, "-m", "pgqueue", *args],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_full_job_cycle_with_dml_rights_only(
    database_url: URL, app_role: str, tmp_path: Path
) -> None:
    app_url = as_role(database_url, app_role)
    admin = _admin(database_url)
    pgq = PgQueue(
        app_url.render_as_string(hide_password=False),
        settings=Settings(
            # Polling is slow on purpose: a job enqueued while the worker idles must be found
            # through LISTEN/NOTIFY, which the role must therefore be able to use.
            poll_interval=30.0,
            rescue_interval=0.3,
            lease_seconds=10.0,
            prune_interval=1.0,
            succeeded_retention=3600.0,
        ),
    )
    attempts: dict[str, int] = {}

    @pgq.task(name="lp.greet")
    def greet(name: str) -> str:
        return f"hello {name}"

    @pgq.task(name="lp.flaky", max_attempts=3)
    def flaky() -> str:
        attempts["flaky"] = attempts.get("flaky", 0) + 1
        if attempts["flaky"] == 1:
            raise Retry(delay=0.2, reason="first attempt fails")
        return "second time lucky"

    @pgq.task(name="lp.broken", max_attempts=1)
    def broken() -> None:
        raise ValueError("always broken")

    @pgq.task(name="lp.atomic", atomic=True)
    def atomic_task(n: int) -> int:
        return n * 2

    try:
        # Enqueue with the role (own transaction and the caller's session).
        first = greet.enqueue("first")
        with pgq.sessions() as session, session.begin():
            in_session = greet.configure(session=session).enqueue("in session")
        # Rows the maintenance loop must deal with, staged by an operator (admin) beforehand:
        # a RUNNING job whose worker died (expired lease) and an old SUCCEEDED job.
        orphan = greet.configure(delay=3600).enqueue("orphan")
        old_done = greet.configure(delay=3600).enqueue("old")
        with admin.connect() as connection:
            connection.execute(
                text("DELETE FROM pgqueue_message_queue WHERE job_id IN (:a, :b)"),
                {"a": orphan, "b": old_done},
            )
            connection.execute(
                text(
                    """UPDATE pgqueue_jobs SET state = 'running', attempts = 1,
                       lease_owner = 'dead-worker', lease_token = gen_random_uuid(),
                       lease_expires_at = now() - interval '1 minute' WHERE id = :id"""
                ),
                {"id": orphan},
            )
            connection.execute(
                text(
                    """UPDATE pgqueue_jobs SET state = 'succeeded', attempts = 1,
                       finished_at = now() - interval '2 hours' WHERE id = :id"""
                ),
                {"id": old_done},
            )

        worker = Worker(pgq, concurrency=2, listen=True)
        thread = threading.Thread(target=worker.run, daemon=True)
        thread.start()
        try:
            wait_for_states(pgq, [first, in_session], {JobState.SUCCEEDED}, timeout=30)
            # The worker is idle now; LISTEN must be up before the next enqueue counts as proof.
            _wait_for_listener(admin, app_role)
            started = time.monotonic()
            later = [
                greet.enqueue("after listen"),
                flaky.enqueue(),
                broken.enqueue(),
                atomic_task.enqueue(21),
            ]
            wait_for_states(pgq, later, timeout=30)
            woke_after = time.monotonic() - started
            # Rescue (advisory lock + guarded update + ticket insert) and prune, as the role.
            wait_for_states(pgq, [orphan], {JobState.SUCCEEDED}, timeout=30)
            _wait_until_gone(pgq, old_done, timeout=30)
            cancel_me = greet.configure(delay=3600).enqueue("cancel me")
            assert pgq.cancel_job(cancel_me) is JobState.CANCELLED
            failed_id = later[2]
            pgq.retry_job(failed_id)
            wait_for_states(pgq, [failed_id], {JobState.FAILED}, timeout=30)
        finally:
            worker.stop()
            thread.join(timeout=60)
        assert not thread.is_alive()

        assert woke_after < 15  # far below the 30 s poll: the NOTIFY woke the worker
        jobs = {job_id: pgq.get_job(job_id) for job_id in [first, in_session, orphan, *later]}
        assert jobs[first].result == "hello first"
        assert jobs[later[1]].state is JobState.SUCCEEDED and jobs[later[1]].attempts == 2
        assert jobs[later[1]].errors[0]["error"].startswith("Traceback")
        assert jobs[later[3]].state is JobState.SUCCEEDED and jobs[later[3]].result == 42
        assert jobs[orphan].attempts == 2 and "lease expired" in jobs[orphan].errors[0]["error"]
        assert jobs[later[2]].state is JobState.FAILED and jobs[later[2]].attempts == 2
        assert pgq.get_job(cancel_me).state is JobState.CANCELLED
        assert worker.stats.rescued == 1

        # The CLI with the same role: enqueue, a draining worker process, and the read commands.
        _write_app(tmp_path)
        enqueued = _cli(tmp_path, app_url, "enqueue", "lp_app:pgq", "lp.add", "--args", "[2, 3]")
        assert enqueued.returncode == 0, enqueued.stderr
        cli_job = int(enqueued.stdout.strip())
        drained = _cli(tmp_path, app_url, "worker", "lp_app:pgq", "--drain", "--concurrency", "2")
        assert drained.returncode == 0, drained.stderr[-2000:]
        shown = _cli(tmp_path, app_url, "show", str(cli_job))
        assert shown.returncode == 0, shown.stderr
        data = json.loads(shown.stdout)
        assert (data["state"], data["result"]) == ("succeeded", 5)
        stats = _cli(tmp_path, app_url, "stats")
        assert stats.returncode == 0, stats.stderr
        assert "default" in stats.stdout
        retried = _cli(tmp_path, app_url, "retry", str(later[2]))
        assert retried.returncode == 0, retried.stderr
        cancelled = _cli(tmp_path, app_url, "cancel", str(later[2]))
        assert cancelled.returncode == 0, cancelled.stderr
        pruned = _cli(tmp_path, app_url, "prune")
        assert pruned.returncode == 0 and pruned.stdout.startswith("pruned "), pruned.stderr
    finally:
        pgq.dispose()
        admin.dispose()


def _wait_for_listener(admin: Engine, role: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    with admin.connect() as connection:
        while True:
            found = connection.execute(
                text(
                    """SELECT count(*) FROM pg_stat_activity
                       WHERE usename = :r AND application_name = 'pgqueue-listener'"""
                ),
                {"r": role},
            ).scalar_one()
            if found:
                return
            assert time.monotonic() < deadline, "the worker's LISTEN connection never came up"
            time.sleep(0.05)


def _wait_until_gone(pgq: PgQueue, job_id: int, timeout: float) -> None:
    from pgqueue.errors import JobNotFound

    deadline = time.monotonic() + timeout
    while True:
        try:
            pgq.get_job(job_id)
        except JobNotFound:
            return
        assert time.monotonic() < deadline, f"job {job_id} was never pruned"
        time.sleep(0.1)


def test_migrate_needs_ddl_rights(
    database_url: URL, empty_database_url: URL, app_role: str, tmp_path: Path
) -> None:
    """``pgqueue migrate`` as the DML-only role fails with "permission denied" and changes nothing,
    on a fresh database (no CREATE on the schema) and on a migrated one."""
    fresh = _cli(tmp_path, as_role(empty_database_url, app_role), "migrate")
    assert fresh.returncode != 0
    assert "permission denied for schema public" in fresh.stdout + fresh.stderr
    with _admin(empty_database_url).connect() as connection:
        tables = connection.execute(
            text("SELECT count(*) FROM pg_tables WHERE schemaname = 'public'")
        ).scalar_one()
    assert tables == 0

    again = _cli(tmp_path, as_role(database_url, app_role), "migrate")
    assert again.returncode != 0
    assert "permission denied for table pgqueue_alembic_version" in again.stdout + again.stderr

    # The same call with the owner's rights works: it is the privilege, not the command.
    owner = _cli(tmp_path, empty_database_url, "migrate")
    assert owner.returncode == 0, owner.stderr


def test_migrate_without_ddl_rights_says_so_in_one_line(
    database_url: URL, empty_database_url: URL, app_role: str, tmp_path: Path
) -> None:
    """Insufficient privilege (SQLSTATE 42501) is an expected answer, not a crash: one clear
    line on stderr, no traceback, a non-zero exit, on a fresh and on a migrated database."""
    for url, denied in [
        (empty_database_url, "permission denied for schema public"),
        (database_url, "permission denied for table pgqueue_alembic_version"),
    ]:
        result = _cli(tmp_path, as_role(url, app_role), "migrate")
        assert result.returncode == 1
        assert result.stdout == ""
        [line] = result.stderr.strip().splitlines()
        assert line.startswith("Error: pgqueue migrate: " + denied), line
        assert "(SQLSTATE 42501)" in line and "run migrate as the schema owner" in line
