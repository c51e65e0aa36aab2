"""Least privilege: everything but ``migrate`` runs with DML rights only.

The role is created by running the SQL block of the documentation's "Security and least privilege"
section itself (role, database and password substituted), so the documentation and the test
cannot drift: ``CONNECT`` on the database, ``USAGE`` on the schema, ``SELECT, INSERT, UPDATE,
DELETE`` on pgqueue's tables, ``USAGE`` on the jobs' id sequence and ``EXECUTE`` on
``pgqueue_enqueue`` (tested in ``test_sql_enqueue.py``); no ``CREATE`` anywhere, no
``TEMP``, no version table, no role membership, not the owner of anything. Connected as that
role:

- a full cycle: enqueue (API and CLI), a worker woken by LISTEN running jobs with a retry, a
  failure, a rescue of an expired lease and a prune by its maintenance loop, ``retry``/
  ``cancel``, the ``stats`` and ``show`` commands, and a ``pgqueue worker --drain`` process;
- every other runtime path: ``enqueue_many`` of 5,000 jobs (the COPY path), ``pgqueue pause``/
  ``resume``/``limit`` with their effect on a worker's claims, a periodic task enqueued by the
  worker's scheduler and ``pgqueue schedules``, dependencies (released, and cancelled after a
  failure), a unique key, ``prune`` of old finished jobs, and the Flask dashboard's pages and
  its retry, cancel and delete actions;
- flow control and the job lifecycle: key and rate limits set and enforced, a bounded queue
  refusing an enqueue with ``QueueFull``, a handler that snoozes, reports progress and runs
  durable steps, and the maintenance recount of key counters.

``pgqueue migrate`` fails for that role with PostgreSQL's "permission denied" in one line, and
leaves the database as it was.
"""

from __future__ import annotations

import json
import logging
import re
import subprocess
import sys
import textwrap
import threading
import time
import types
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from sqlalchemy import Engine, create_engine, func, select, text
from sqlalchemy.engine import URL
from support.dashboard import dashboard_app
from support.polling import wait_until
from support.processes import pgqueue_env, run_pgqueue
from support.roles import app_role, as_role, readme_sql
from support.workers import in_thread

from pgqueue import JobContext, PgQueue, QueueFull, Retry, Settings, Snooze
from pgqueue.cli import main as cli_main
from pgqueue.contrib.flask import PgQueue as FlaskPgQueue
from pgqueue.data import enqueue as enqueue_data
from pgqueue.errors import JobNotFound, NotSchemaOwner
from pgqueue.models import Job, MessageQueue, PeriodicTick, metadata
from pgqueue.states import JobState
from pgqueue.testing import ConcurrencyProbe, states_of, wait_for_states
from pgqueue.worker import Worker

__all__ = ["app_role"]  # the fixture, used by name

DML: frozenset[str] = frozenset({"SELECT", "INSERT", "UPDATE", "DELETE"})


def pgqueue_tables() -> list[str]:
    """pgqueue's own tables, from its models (the migration's version table is not one)."""
    return sorted(t.name for t in metadata.sorted_tables)


def _admin(url: URL) -> Engine:
    return create_engine(url, isolation_level="AUTOCOMMIT")


def test_the_readme_grants_exactly_dml_rights(database_url: URL, app_role: str) -> None:
    """The documented block only creates the role and grants object privileges (no role
    membership, no attributes), and what the role ends up with is exactly DML on pgqueue's
    tables, USAGE on their id sequences and EXECUTE on the SQL enqueue function (which runs
    with the caller's rights): no DDL, no TEMP, no version table, no superuser."""
    [create, *grants] = readme_sql()
    assert create == "CREATE ROLE app LOGIN PASSWORD '...'"
    for grant in grants:
        assert re.fullmatch(r"GRANT [A-Z, ]+ ON .+ TO app", grant), grant
    with _admin(database_url).connect() as connection:
        sequences = connection.execute(
            text(
                "SELECT pg_get_serial_sequence('pgqueue_jobs', 'id'),"
                " pg_get_serial_sequence('pgqueue_audit', 'id'),"
                " pg_get_serial_sequence('pgqueue_workflows', 'id')"
            )
        ).one()
        held = connection.execute(
            text(
                """SELECT c.relname, a.privilege_type
                   FROM pg_class c CROSS JOIN LATERAL aclexplode(c.relacl) a
                   WHERE a.grantee = CAST(:r AS regrole)"""
            ),
            {"r": app_role},
        ).all()
        # Of functions, EXECUTE on the SQL enqueue (SECURITY INVOKER: no rights of its own).
        functions = connection.execute(
            text(
                """SELECT p.proname, a.privilege_type, p.prosecdef
                   FROM pg_proc p CROSS JOIN LATERAL aclexplode(p.proacl) a
                   WHERE a.grantee = CAST(:r AS regrole)"""
            ),
            {"r": app_role},
        ).all()
        rights = connection.execute(
            text(
                """SELECT
                    has_database_privilege(:r, current_database(), 'CONNECT'),
                    has_schema_privilege(:r, 'public', 'USAGE'),
                    has_schema_privilege(:r, 'public', 'CREATE'),
                    has_database_privilege(:r, current_database(), 'CREATE'),
                    has_database_privilege(:r, current_database(), 'TEMP'),
                    has_table_privilege(:r, 'pgqueue_alembic_version', 'SELECT'),
                    (SELECT rolsuper OR rolcreatedb OR rolcreaterole OR rolbypassrls
                            OR rolreplication FROM pg_roles WHERE rolname = :r),
                    (SELECT count(*) FROM pg_auth_members WHERE member = CAST(:r AS regrole)),
                    (SELECT count(*) FROM pg_class WHERE relowner = CAST(:r AS regrole))"""
            ),
            {"r": app_role},
        ).one()
    assert tuple(sequences) == (
        "public.pgqueue_jobs_id_seq",
        "public.pgqueue_audit_id_seq",
        "public.pgqueue_workflows_id_seq",
    )
    expected = {(table, right) for table in pgqueue_tables() for right in DML}
    expected |= {
        ("pgqueue_jobs_id_seq", "USAGE"),
        ("pgqueue_audit_id_seq", "USAGE"),
        ("pgqueue_workflows_id_seq", "USAGE"),
    }
    assert set(held) == expected
    assert functions == [("pgqueue_enqueue", "EXECUTE", False)]
    assert tuple(rights) == (True, True, False, False, False, False, False, 0, 0)


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
    env = {**pgqueue_env(url), "DB_URL": url.render_as_string(hide_password=False)}
    return run_pgqueue(*args, env=env, cwd=tmp_path)


@pytest.mark.slow
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
        with in_thread(worker, join_timeout=60):
            wait_for_states(pgq, [first, in_session], {JobState.SUCCEEDED}, timeout=30)
            # The worker is idle now; LISTEN must be up before the next enqueue counts as proof.
            _wait_for_listener(admin, app_role)
            # The worker registry: written at start and read back, as the role.
            assert [w.id for w in pgq.admin.list_workers()] == [worker.worker_id]
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
            wait_until(lambda: _gone(pgq, old_done), 30, f"job {old_done} to be pruned")
            cancel_me = greet.configure(delay=3600).enqueue("cancel me")
            assert pgq.cancel_job(cancel_me) is JobState.CANCELLED
            failed_id = later[2]
            pgq.retry_job(failed_id)
            wait_for_states(pgq, [failed_id], {JobState.FAILED}, timeout=30)
        assert pgq.admin.list_workers(include_stale=True) == []  # deleted at the clean stop

        assert woke_after < 15  # far below the 30 s poll: the NOTIFY woke the worker
        jobs = {job_id: pgq.get_job(job_id) for job_id in [first, in_session, orphan, *later]}
        assert jobs[first].result == "hello first"
        assert jobs[later[1]].state is JobState.SUCCEEDED and jobs[later[1]].attempts == 2
        assert jobs[later[1]].errors[0]["error"] == "retry requested: first attempt fails"
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
        shown = _cli(tmp_path, app_url, "show", str(cli_job), "--json")
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
    def listening() -> int:
        with admin.connect() as connection:
            return int(
                connection.execute(
                    text(
                        """SELECT count(*) FROM pg_stat_activity
                           WHERE usename = :r AND application_name = 'pgqueue-listener'"""
                    ),
                    {"r": role},
                ).scalar_one()
            )

    wait_until(listening, timeout, "the worker's LISTEN connection")


def _gone(pgq: PgQueue, job_id: int) -> bool:
    try:
        pgq.get_job(job_id)
    except JobNotFound:
        return True
    return False


def _invoke(*args: str) -> str:
    """Run a ``pgqueue`` command in this process (click's runner); its output."""
    result = CliRunner().invoke(cli_main, list(args), catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return result.output


@pytest.mark.slow
def test_every_runtime_path_with_dml_rights_only(
    database_url: URL,
    app_role: str,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    app_url = as_role(database_url, app_role)
    url = app_url.render_as_string(hide_password=False)
    admin = _admin(database_url)
    pgq = PgQueue(
        url,
        settings=Settings(
            poll_interval=0.1,
            rescue_interval=0.2,  # the scheduler's pass runs this often
            prune_interval=2.0,  # the maintenance prune and limit recount run 0.2 s after start
            succeeded_retention=3600.0,
            failed_retention=7200.0,
            log_successes=False,
        ),
    )
    probe = ConcurrencyProbe()

    @pgq.task(name="lp.bulk", queue="bulk")
    def bulk(n: int) -> int:
        return n

    @pgq.task(name="lp.held", queue="paused")
    def held(n: int) -> int:
        return n

    @pgq.task(name="lp.limited", queue="limited")
    def limited(n: int) -> int:
        probe.run(0.1)
        return n

    @pgq.task(name="lp.step")
    def step(name: str) -> str:
        return name

    @pgq.task(name="lp.broken", max_attempts=1)
    def broken() -> None:
        raise ValueError("always broken")

    @pgq.periodic("* * * * * *", name="lp.every_second")  # croniter's 6th field: seconds
    @pgq.task(name="lp.beat")
    def beat() -> str:
        return "beat"

    # The CLI commands that take an application path find this queue under this module name.
    module = types.ModuleType("pgqueue_least_privilege_app")
    module.pgq = pgq  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, module.__name__, module)
    monkeypatch.setenv("PGQUEUE_DATABASE_URL", url)
    copies: list[int] = []
    copy_jobs = enqueue_data.copy_jobs

    def counting_copy_jobs(*args: Any) -> list[int]:
        copies.append(len(args[2]))
        return copy_jobs(*args)

    monkeypatch.setattr(enqueue_data, "copy_jobs", counting_copy_jobs)
    caplog.set_level(logging.WARNING)

    try:
        # Bulk enqueue in its own transaction: from 1,000 jobs on, COPY with ids from the
        # sequence.
        bulk_ids = bulk.enqueue_many([{"n": i} for i in range(5000)])
        assert copies == [5000]
        assert len(set(bulk_ids)) == 5000

        # Queue control through the CLI.
        assert "paused" in _invoke("pause", "paused", "--new")
        assert "limit 1" in _invoke("limit", "limited", "1", "--new")
        assert pgq.admin.queue_settings()["paused"].paused is True
        assert pgq.admin.queue_settings()["limited"].concurrency_limit == 1
        held_ids = [held.enqueue(i) for i in range(3)]
        limited_ids = [limited.enqueue(i) for i in range(6)]

        # Dependencies: released after success, cancelled after a failure for good.
        first = step.enqueue("first")
        then = step.configure(depends_on=[first]).enqueue("then")
        doomed_parent = broken.enqueue()
        doomed = step.configure(depends_on=[doomed_parent]).enqueue("never")
        assert states_of(pgq, [then, doomed]) == {then: JobState.WAITING, doomed: JobState.WAITING}

        # A unique key: the second enqueue finds the first job (INSERT ... ON CONFLICT).
        unique = step.configure(unique_key="lp-once").enqueue("once")
        assert step.configure(unique_key="lp-once").enqueue("twice") == unique

        # Retention: old finished jobs (staged by the owner) are pruned, a recent one is kept.
        old_ok, old_failed, recent_ok = (step.configure(delay=3600).enqueue(n) for n in "abc")
        with admin.connect() as connection:
            connection.execute(
                text("DELETE FROM pgqueue_message_queue WHERE job_id IN (:a, :b, :c)"),
                {"a": old_ok, "b": old_failed, "c": recent_ok},
            )
            for job_id, state, age in [
                (old_ok, "succeeded", "2 hours"),
                (old_failed, "failed", "3 hours"),
                (recent_ok, "succeeded", "1 minute"),
            ]:
                connection.execute(
                    text(
                        """UPDATE pgqueue_jobs SET state = :state, attempts = 1,
                           finished_at = now() - CAST(:age AS interval) WHERE id = :id"""
                    ),
                    {"state": state, "age": age, "id": job_id},
                )
        assert pgq.prune() == 2
        assert sorted(states_of(pgq, [old_ok, old_failed, recent_ok])) == [recent_ok]

        assert "lp.every_second" in _invoke("schedules", f"{module.__name__}:pgq")

        with in_thread(Worker(pgq, concurrency=8), join_timeout=60):
            _wait_for_queue(pgq, "bulk", JobState.SUCCEEDED, 5000, timeout=120)
            wait_for_states(pgq, limited_ids, {JobState.SUCCEEDED}, timeout=60)
            wait_for_states(pgq, [first, then, unique], {JobState.SUCCEEDED}, timeout=30)
            wait_for_states(pgq, [doomed_parent], {JobState.FAILED}, timeout=30)
            wait_for_states(pgq, [doomed], {JobState.CANCELLED}, timeout=30)
            beats = _wait_for_beats(pgq, timeout=30)
            # The paused queue was passed over by every claim of all the above.
            assert set(states_of(pgq, held_ids).values()) == {JobState.QUEUED}
            assert "resumed" in _invoke("resume", "paused")
            wait_for_states(pgq, held_ids, {JobState.SUCCEEDED}, timeout=30)

        assert probe.peak == 1  # the limit held with 8 free slots and 6 ready jobs
        assert "removed" in _invoke("limit", "limited", "none")
        limited = pgq.admin.queue_settings()["limited"]
        assert (limited.paused, limited.concurrency_limit, limited.running) == (False, None, 0)
        first_job, then_job = pgq.get_job(first), pgq.get_job(then)
        assert then_job.started_at is not None and first_job.finished_at is not None
        assert then_job.started_at >= first_job.finished_at
        assert then_job.result == "then"
        assert pgq.get_job(unique).result == "once"
        assert pgq.get_job(beats[0]).result == "beat"
        with pgq.sessions() as session:
            ticked = session.scalars(
                select(PeriodicTick.job_id).where(PeriodicTick.schedule_name == "lp.every_second")
            ).all()
        assert set(beats) <= set(ticked)

        # The dashboard's pages and actions, as the role.
        waiting = step.configure(delay=3600).enqueue("to cancel")
        # TESTING: errors (a permission denied) propagate instead of becoming a 500 page.
        with dashboard_app(
            FlaskPgQueue(), app_url, "least_privilege_dashboard", TESTING=True
        ) as app:
            client = app.test_client()
            overview = client.get("/pgqueue/")
            assert overview.status_code == 200
            assert 'data-queue="bulk"' in overview.text
            listing = client.get("/pgqueue/jobs?queue=bulk&state=succeeded")
            assert listing.status_code == 200 and f"/pgqueue/jobs/{bulk_ids[-1]}" in listing.text
            page = client.get(f"/pgqueue/jobs/{doomed_parent}")
            assert page.status_code == 200
            token = re.search(r'name="csrf_token" value="([^"]+)"', page.text)
            assert token is not None
            form = {"csrf_token": token.group(1)}
            for job_id, action in [
                (doomed_parent, "retry"),
                (waiting, "cancel"),
                (bulk_ids[0], "delete"),
            ]:
                response = client.post(f"/pgqueue/jobs/{job_id}/{action}", data=form)
                assert response.status_code == 302, (action, response.text)
        assert states_of(pgq, [doomed_parent, waiting, bulk_ids[0]]) == {
            doomed_parent: JobState.QUEUED,
            waiting: JobState.CANCELLED,
        }
        with pgq.sessions() as session:
            tickets = session.scalars(
                select(MessageQueue.job_id).where(MessageQueue.job_id.in_([doomed_parent, waiting]))
            ).all()
        assert tickets == [doomed_parent]
    finally:
        pgq.dispose()
        admin.dispose()
    # Maintenance passes log and carry on after an error: none may have been refused.
    assert "permission denied" not in caplog.text
    assert "42501" not in caplog.text


def test_flow_control_and_job_lifecycle_with_dml_rights_only(
    database_url: URL, app_role: str, caplog: pytest.LogCaptureFixture
) -> None:
    app_url = as_role(database_url, app_role)
    pgq = PgQueue(
        app_url.render_as_string(hide_password=False),
        settings=Settings(poll_interval=0.1, rescue_interval=0.2, prune_interval=0.5),
    )
    admin = _admin(database_url)
    probe = ConcurrencyProbe()
    snoozed: dict[int, int] = {}
    step_runs: list[str] = []

    @pgq.task(name="lp.keyed", concurrency_key=lambda account: f"account:{account}", key_limit=1)
    def keyed(account: int) -> None:
        probe.run(0.05)

    @pgq.task(name="lp.rated", queue="rated")
    def rated(n: int) -> int:
        return n

    @pgq.task(name="lp.bounded", queue="bounded")
    def bounded(n: int) -> int:
        return n

    @pgq.task(name="lp.lifecycle", pass_context=True)
    def lifecycle(ctx: JobContext) -> str:
        snoozed[ctx.job_id] = snoozed.get(ctx.job_id, 0) + 1
        ctx.progress(0.5, "half way")
        if snoozed[ctx.job_id] < 3:
            raise Snooze(0)
        return str(ctx.step("charge", lambda: step_runs.append("charge") or "charged"))

    caplog.set_level(logging.WARNING)
    try:
        pgq.set_key_limit("account:", 1)
        pgq.set_rate_limit("rated", 100, per=1)
        pgq.set_queue_max_depth("bounded", 2)
        keyed_ids = keyed.enqueue_many([[1]] * 3 + [[2]] * 3)
        rated_ids = rated.enqueue_many([[n] for n in range(5)])
        bounded_ids = [bounded.enqueue(1), bounded.enqueue(2)]
        with pytest.raises(QueueFull):
            bounded.enqueue(3)
        [lifecycle_id] = lifecycle.enqueue_many([[]])
        stats = pgq.run_worker(drain=True, concurrency=4)
        assert stats.failed == 0
        assert probe.peak == 2  # one per key, two keys
        ids = [*keyed_ids, *rated_ids, *bounded_ids, lifecycle_id]
        assert set(states_of(pgq, ids).values()) == {JobState.SUCCEEDED}
        job = pgq.get_job(lifecycle_id)
        assert (job.attempts, job.result, step_runs) == (1, "charged", ["charge"])
        assert [step.name for step in job.steps] == ["charge"]
        # The maintenance recount of key counters runs with the same rights: a counter changed
        # behind pgqueue's back is set right.
        with admin.begin() as c:
            c.execute(text("UPDATE pgqueue_concurrency_keys SET running = 5"))

        def counters() -> list[tuple[Any, ...]]:
            with admin.connect() as c:
                rows = c.execute(
                    text("SELECT key, running FROM pgqueue_concurrency_keys ORDER BY key")
                ).all()
            return [tuple(row) for row in rows]

        with in_thread(Worker(pgq, concurrency=1)):
            wait_until(
                lambda: counters() == [("account:1", 0), ("account:2", 0)],
                30,
                "the maintenance recount to set both key counters to 0",
                interval=0.2,
            )
    finally:
        pgq.dispose()
        admin.dispose()
    assert "permission denied" not in caplog.text
    assert "42501" not in caplog.text


def _wait_for_queue(pgq: PgQueue, queue: str, state: JobState, count: int, timeout: float) -> None:
    """Wait until ``count`` jobs of ``queue`` are in ``state`` (one count per poll: a state
    query over thousands of ids would compete with the worker for the server)."""

    def counted() -> bool:
        with pgq.sessions() as session:
            found = session.scalar(
                select(func.count()).where(Job.queue == queue, Job.state == state)
            )
        return found == count

    wait_until(counted, timeout, f"{count} {queue} jobs {state.value}", interval=0.1)


def _wait_for_beats(pgq: PgQueue, timeout: float) -> list[int]:
    """Ids of the periodic task's jobs once one of them SUCCEEDED."""

    def succeeded() -> list[int]:
        with pgq.sessions() as session:
            rows = session.execute(
                select(Job.id, Job.state).where(Job.task_name == "lp.beat").order_by(Job.id)
            ).all()
        return [job_id for job_id, state in rows if state == JobState.SUCCEEDED]

    return wait_until(succeeded, timeout, "a periodic job to succeed")


@pytest.mark.slow
def test_migrate_needs_ddl_rights(
    database_url: URL, empty_database_url: URL, app_role: str, tmp_path: Path
) -> None:
    """``pgqueue migrate`` as the DML-only role, on a fresh database (no CREATE on the schema)
    and on a migrated one: PostgreSQL's "permission denied" (SQLSTATE 42501) as one clear line on
    stderr, no traceback, exit 1, and the database left as it was."""
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
    with _admin(empty_database_url).connect() as connection:
        tables = connection.execute(
            text("SELECT count(*) FROM pg_tables WHERE schemaname = 'public'")
        ).scalar_one()
    assert tables == 0

    # The same call with the owner's rights works: it is the privilege, not the command.
    owner = _cli(tmp_path, empty_database_url, "migrate")
    assert owner.returncode == 0, owner.stderr


def _stage_finished(admin: Engine, count: int, age_seconds: float) -> list[int]:
    """``count`` succeeded jobs in ``pgqueue_jobs``, finished ``age_seconds`` ago."""
    with admin.connect() as connection:
        rows = connection.execute(
            text(
                """INSERT INTO pgqueue_jobs (task_name, state, attempts, finished_at)
                   SELECT 'lp.history', 'succeeded', 1, now() - make_interval(secs => :age)
                   FROM generate_series(1, :n) RETURNING id"""
            ),
            {"n": count, "age": age_seconds},
        )
        return sorted(r[0] for r in rows)


def test_partitioned_history_moves_with_dml_rights_but_partitions_need_the_owner(
    database_url: URL, app_role: str, tmp_path: Path
) -> None:
    """Under ``history="partitioned"`` the role's worker moves finished jobs (DML) and reads
    them back; creating or dropping partitions (DDL) is refused with one clear line, and works
    for the owner."""
    admin = _admin(database_url)
    app_url = as_role(database_url, app_role)
    settings = Settings(rescue_interval=0.2, history="partitioned", history_move_after=1.0)
    pgq = PgQueue(app_url.render_as_string(hide_password=False), settings=settings)
    try:
        with pytest.raises(NotSchemaOwner, match=r"SQLSTATE 42501.*schema owner"):
            pgq.maintain_history()
        denied = _cli(tmp_path, app_url, "history", "maintain")
        assert denied.returncode == 1 and denied.stdout == ""
        [line] = denied.stderr.strip().splitlines()
        assert "(SQLSTATE 42501)" in line and "pgqueue history maintain" in line, line
        assert _cli(tmp_path, database_url, "history", "maintain").returncode == 0
        staged = _stage_finished(admin, 3, 120.0)

        def moved() -> int:
            with admin.connect() as connection:
                return int(
                    connection.execute(
                        text("SELECT count(*) FROM pgqueue_job_history")
                    ).scalar_one()
                )

        with in_thread(Worker(pgq, queues=["lp-history-idle"], concurrency=1)):
            wait_until(
                lambda: moved() == len(staged), 30, "the staged jobs moved to the history table"
            )
        assert pgq.get_job(staged[0]).state is JobState.SUCCEEDED
        assert {j.id for j in pgq.admin.list_jobs().jobs} == set(staged)
    finally:
        pgq.dispose()
        admin.dispose()


def test_the_default_layout_never_reads_the_history_table(database_url: URL, app_role: str) -> None:
    """With no rights at all on ``pgqueue_job_history``, the default layout still enqueues,
    runs, prunes, reads, lists, counts and charts jobs: none of its statements touches it."""
    admin = _admin(database_url)
    with admin.connect() as connection:
        connection.execute(text(f"REVOKE ALL ON pgqueue_job_history FROM {app_role}"))
    app_url = as_role(database_url, app_role)
    pgq = PgQueue(
        app_url.render_as_string(hide_password=False),
        settings=Settings(poll_interval=0.1, rescue_interval=0.2, prune_interval=0.5),
    )
    try:

        @pgq.task(name="lp.default_layout")
        def add(a: int, b: int) -> int:
            return a + b

        old = _stage_finished(admin, 2, 400 * 86_400.0)
        job_id = add.enqueue(1, 2)
        stats = pgq.run_worker(drain=True, concurrency=2)
        assert stats.failed == 0
        assert pgq.get_job(job_id).result == 3
        with pytest.raises(JobNotFound):
            pgq.get_job(10**9)
        with pytest.raises(JobNotFound):
            pgq.retry_job(10**9)
        assert job_id in {j.id for j in pgq.admin.list_jobs().jobs}
        assert job_id in {j.id for j in pgq.admin.list_jobs(state="succeeded").jobs}
        assert pgq.admin.capped_counts()["default"][JobState.SUCCEEDED] >= 1
        assert pgq.admin.queue_names() == ["default"]
        assert pgq.admin.recent_throughput().series
        # Pruned by the worker's maintenance or by this call, whichever came first.
        pgq.prune()
        for job in old:
            with pytest.raises(JobNotFound):
                pgq.get_job(job)
    finally:
        pgq.dispose()
        admin.dispose()


def test_an_atomic_timeout_ends_the_roles_own_session_with_dml_rights_only(
    database_url: URL, app_role: str
) -> None:
    """Ending a timed-out atomic attempt's transaction terminates the role's own backend, which
    PostgreSQL allows any role: no pg_signal_backend membership needed."""
    pgq = PgQueue(
        as_role(database_url, app_role).render_as_string(hide_password=False),
        settings=Settings(poll_interval=0.1),
    )
    release = threading.Event()

    @pgq.task(name="lp.atomic_sleeps", atomic=True, timeout=1.0, max_attempts=1)
    def atomic_sleeps() -> None:
        release.wait(10)

    job_id = atomic_sleeps.enqueue()
    try:
        with in_thread(Worker(pgq, concurrency=1), before_stop=release.set):
            assert wait_for_states(pgq, [job_id], timeout=30) == {job_id: JobState.FAILED}
            assert not release.is_set()  # failed while its handler still ran
        job = pgq.get_job(job_id)
        assert "JobTimeout" in (job.last_error or ""), job.last_error
    finally:
        pgq.dispose()
