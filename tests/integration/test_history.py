"""The partitioned history (``history="partitioned"``): finished jobs move out of
``pgqueue_jobs`` by the maintenance loop, stay readable through ``get_job`` and the admin
listings, are read-only there, and are pruned by dropping a day's partition.

Partitions are created and dropped by ``pgq.maintain_history()`` (``pgqueue history
maintain``) as the schema owner; what a DML-only role may and may not do is in
``test_least_privilege.py``.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import time
from collections.abc import Iterator

import pytest
from click.testing import CliRunner
from flask import Flask
from sqlalchemy import Engine, create_engine, inspect, text
from sqlalchemy.engine import URL
from sqlalchemy.orm import Session
from support.polling import wait_until
from support.workers import in_thread

from pgqueue import PgQueue, Settings, chord, migrations
from pgqueue.cli import main as cli_main
from pgqueue.contrib.flask import PgQueue as FlaskPgQueue
from pgqueue.contrib.flask.cli import pgqueue_group
from pgqueue.data import history as history_data
from pgqueue.data import maintenance as maintenance_data
from pgqueue.db import executor_for
from pgqueue.errors import InvalidStateTransition, JobNotFound
from pgqueue.models import JOB_COLUMN_NAMES
from pgqueue.states import JobState
from pgqueue.worker import Worker

DAY = 86_400.0


@pytest.fixture
def history_pgq(database_url: URL) -> Iterator[PgQueue]:
    settings = Settings(
        poll_interval=0.2,
        rescue_interval=0.2,
        lease_seconds=10.0,
        history="partitioned",
        history_move_after=0.5,
    )
    queue = PgQueue(database_url.render_as_string(hide_password=False), settings=settings)
    yield queue
    queue.dispose()


def where_is(engine: Engine, job_id: int) -> tuple[int, ...]:
    """How many rows of job ``job_id`` ``pgqueue_jobs`` and ``pgqueue_job_history`` hold."""
    with engine.connect() as connection:
        row = connection.execute(
            text(
                "SELECT (SELECT count(*) FROM pgqueue_jobs WHERE id = :id),"
                " (SELECT count(*) FROM pgqueue_job_history WHERE id = :id)"
            ),
            {"id": job_id},
        ).one()
    return tuple(row)


def test_a_finished_job_is_moved_by_maintenance_and_read_back_unchanged(
    history_pgq: PgQueue, engine: Engine
) -> None:
    pgq = history_pgq
    assert pgq.maintain_history(days_ahead=1).created  # today's and tomorrow's partitions

    @pgq.task(name="history.add", queue="hist")
    def add(a: int, b: int) -> dict[str, int]:
        return {"sum": a + b}

    job_id = add.enqueue(2, 3)
    worker = Worker(pgq, queues=["hist"], concurrency=1)
    with in_thread(worker):
        finished = pgq.wait_for(job_id, timeout=30)
        wait_until(
            lambda: where_is(engine, job_id) == (0, 1), 30, "the job moved to the history", 0.1
        )
    moved = pgq.get_job(job_id)
    for name in JOB_COLUMN_NAMES:
        assert getattr(moved, name) == getattr(finished, name), name
    assert moved.state is JobState.SUCCEEDED and moved.result == {"sum": 5}
    assert moved.steps == []
    # The listings and counts of the admin API (CLI and dashboard) find it too.
    assert [j.id for j in pgq.admin.list_jobs().jobs] == [job_id]
    assert [j.id for j in pgq.admin.list_jobs(queue="hist", state="succeeded").jobs] == [job_id]
    assert [j.id for j in pgq.admin.list_jobs(task_name="history.add").jobs] == [job_id]
    assert pgq.admin.capped_counts()["hist"][JobState.SUCCEEDED] == 1
    assert pgq.admin.queue_names() == ["hist"]
    throughput = pgq.admin.recent_throughput()
    assert sum(throughput.series["hist"][JobState.SUCCEEDED]) == 1
    # Read-only: a re-run says why instead of "no such job".
    with pytest.raises(InvalidStateTransition, match="moved to the history"):
        pgq.retry_job(job_id)
    # A signal to it is refused as to any finished job, not as to a job that never existed.
    with pytest.raises(InvalidStateTransition, match="moved to the history"):
        pgq.signal(job_id, "go")

    async def signal_async() -> None:
        try:
            with pytest.raises(InvalidStateTransition, match="moved to the history"):
                await pgq.asignal(job_id, "go")
        finally:
            await pgq.adispose()

    asyncio.run(signal_async())
    with pytest.raises(JobNotFound):
        pgq.signal(job_id + 1_000_000, "go")
    with engine.connect() as connection:
        assert connection.execute(text("SELECT count(*) FROM pgqueue_job_signals")).scalar() == 0
    result = CliRunner().invoke(
        cli_main,
        [
            "show",
            str(job_id),
            "--json",
            "--database-url",
            str(pgq.engine.url.render_as_string(False)),
        ],
        env={"PGQUEUE_HISTORY": "partitioned"},
    )
    assert result.exit_code == 0, result.output
    assert '"succeeded"' in result.output


def chart_counts(pgq: PgQueue, queue: str) -> dict[JobState, int]:
    """The dashboard chart's jobs of ``queue`` over its window, by state."""
    series = pgq.admin.recent_throughput().series.get(queue, {})
    return {state: sum(counts) for state, counts in series.items() if sum(counts)}


def test_the_chart_counts_moved_jobs_once_from_the_moves_minute_counts(
    database_url: URL, engine: Engine
) -> None:
    """The throughput chart of the whole hour reads the moved jobs' per-minute counts, written
    by the move itself, never the history's rows: each job is counted once before and after
    its move, a row put into the history some other way is not counted, the migration fills
    the counts from the history it finds, and ``maintain`` drops the counts of expired days."""
    settings = Settings(history="partitioned", history_move_after=3600.0)
    pgq = PgQueue(database_url.render_as_string(hide_password=False), settings=settings)
    try:
        pgq.maintain_history(days_ahead=1, retention_days=7)

        @pgq.task(name="history.maybe", queue="chart", max_attempts=1)
        def maybe(fail: bool) -> None:
            if fail:
                raise ValueError("asked to fail")

        for fail in (False, False, True, False, True, False, False):
            maybe.enqueue(fail)
        assert pgq.run_worker(drain=True, concurrency=2).failed == 2
        expected = {JobState.SUCCEEDED: 5, JobState.FAILED: 2}
        assert chart_counts(pgq, "chart") == expected

        with Session(engine) as session, session.begin():
            assert history_data.move_to_history(executor_for(session), age=0.0, limit=100) == 7
        assert history_ids(engine) and where_is(engine, min(history_ids(engine))) == (0, 1)
        assert chart_counts(pgq, "chart") == expected
        # The overview's read of a quiet hour: the same counts in 5-minute buckets, and the
        # moved jobs' waits from the history's rows.
        activity = pgq.admin.recent_activity(quiet_jobs=60, quiet_width=300)
        assert (activity.throughput.window, activity.throughput.width) == (3600, 300)
        assert activity.throughput.series["chart"] == {
            JobState.SUCCEEDED: [5] + [0] * 11,
            JobState.FAILED: [2] + [0] * 11,
        }
        assert [w and w.jobs for w in activity.waits["chart"]] == [7] + [None] * 11
        assert pgq.admin.throughput()["chart"][JobState.SUCCEEDED][0] in (0, 5)
        assert sum(pgq.admin.throughput()["chart"][JobState.FAILED]) == 2

        # Three more, still in the live table: counted from their rows, beside the moved ones.
        for _ in range(3):
            maybe.enqueue(False)
        assert pgq.run_worker(drain=True, concurrency=2).succeeded == 3
        expected = {JobState.SUCCEEDED: 8, JobState.FAILED: 2}
        assert chart_counts(pgq, "chart") == expected
        # More live jobs than the cap: the window shrinks to them, whatever was moved.
        shortened = pgq.admin.recent_throughput(cap=2)
        assert shortened.shortened and shortened.window < 3600
        assert 2 <= sum(map(sum, shortened.series["chart"].values())) <= 10

        staged = stage_history(engine, 0, 3)  # queue "default", finished now
        assert "default" not in pgq.admin.recent_throughput().series
        with engine.begin() as connection:
            migrations.downgrade(connection, "pgqueue_0013")
            migrations.upgrade(connection)
        assert chart_counts(pgq, "default") == {JobState.SUCCEEDED: len(staged)}
        assert chart_counts(pgq, "chart") == expected

        with engine.begin() as connection:
            connection.execute(
                text(
                    "INSERT INTO pgqueue_finished_minutes (minute, queue, state, jobs)"
                    " VALUES (date_bin('1 minute', now() - interval '8 days',"
                    " TIMESTAMPTZ '1970-01-01 00:00:00+00'), 'chart', 'succeeded', 4)"
                )
            )
        pgq.maintain_history(days_ahead=1, retention_days=7)
        with engine.connect() as connection:
            kept = connection.execute(
                text("SELECT queue, state, sum(jobs) FROM pgqueue_finished_minutes GROUP BY 1, 2")
            ).all()
        assert sorted(kept) == [
            ("chart", "failed", 2),
            ("chart", "succeeded", 5),  # the three still live are in no count
            ("default", "succeeded", 3),
        ]
    finally:
        pgq.dispose()


def stage_history(engine: Engine, days_ago: float, count: int) -> list[int]:
    """``count`` succeeded jobs put straight into the history, finished ``days_ago`` ago."""
    with engine.begin() as connection:
        rows = connection.execute(
            text(
                """INSERT INTO pgqueue_job_history
                     (id, finished_at, task_name, queue, args, kwargs, state, priority, attempts,
                      max_attempts, run_at, created_at, updated_at, errors, cancel_requested,
                      atomic, awaited, snoozes)
                   SELECT nextval('pgqueue_jobs_id_seq'), now() - make_interval(days => :d),
                          'history.staged', 'default', '[]', '{}', 'succeeded', 0, 1, 3,
                          now(), now(), now(), '[]', false, false, false, 0
                   FROM generate_series(1, :n)
                   RETURNING id"""
            ),
            {"d": days_ago, "n": count},
        )
        return sorted(r[0] for r in rows)


def history_ids(engine: Engine) -> set[int]:
    with engine.connect() as connection:
        return set(connection.execute(text("SELECT id FROM pgqueue_job_history")).scalars())


def partitions(engine: Engine) -> set[str]:
    return {t for t in inspect(engine).get_table_names() if t.startswith("pgqueue_job_history_")}


def test_maintain_adopts_the_default_partition_and_drops_exactly_the_expired_day(
    pgq: PgQueue, engine: Engine
) -> None:
    # Days without a partition: the DEFAULT partition catches them.
    five = stage_history(engine, 5, 3)
    four = stage_history(engine, 4, 4)
    one = stage_history(engine, 1, 2)
    report = pgq.maintain_history(days_ahead=2, retention_days=10)
    assert report.from_default == 9 and report.dropped == ()
    today = dt.datetime.now(dt.UTC).date()
    days = {today - dt.timedelta(days=d) for d in (5, 4, 1)} | {
        today + dt.timedelta(days=d) for d in (0, 1, 2)
    }
    expected = {f"pgqueue_job_history_p{d:%Y%m%d}" for d in days}
    assert partitions(engine) == expected | {"pgqueue_job_history_default"}
    with engine.connect() as connection:
        assert (
            connection.execute(text("SELECT count(*) FROM pgqueue_job_history_default")).scalar()
            == 0
        )
    assert history_ids(engine) == set(five + four + one)
    # Retention of 4 days: the day 5 days ago is wholly older, the day 4 days ago is not.
    report = pgq.maintain_history(days_ahead=2, retention_days=4)
    assert report.dropped == (f"pgqueue_job_history_p{today - dt.timedelta(days=5):%Y%m%d}",)
    assert history_ids(engine) == set(four + one)
    # Again: nothing left to do.
    again = pgq.maintain_history(days_ahead=2, retention_days=4)
    assert again.created == () and again.dropped == () and again.from_default == 0


def test_cli_history_maintain_says_what_it_did(database_url: URL, engine: Engine) -> None:
    stage_history(engine, 2, 3)
    url = database_url.render_as_string(hide_password=False)
    result = CliRunner().invoke(
        cli_main, ["history", "maintain", "--days-ahead", "1", "--database-url", url]
    )
    assert result.exit_code == 0, result.output
    assert "3 partitions created" in result.output
    assert "3 jobs found in the DEFAULT partition" in result.output
    bad = CliRunner().invoke(
        cli_main, ["history", "maintain", "--days-ahead", "0", "--database-url", url]
    )
    assert bad.exit_code == 2 and "days-ahead" in bad.output


def test_flask_history_maintain_runs_against_the_apps_database(
    database_url: URL, engine: Engine
) -> None:
    stage_history(engine, 2, 4)
    app = Flask("history_maintain")
    app.config["PGQUEUE_DATABASE_URL"] = database_url.render_as_string(hide_password=False)
    flask_pgq = FlaskPgQueue(app)
    try:
        result = app.test_cli_runner().invoke(
            pgqueue_group, ["history", "maintain", "--days-ahead", "1"]
        )
        assert result.exit_code == 0, result.output
        assert "3 partitions created" in result.output
        assert "4 jobs found in the DEFAULT partition" in result.output
        assert len(history_ids(engine)) == 4
        bad = app.test_cli_runner().invoke(
            pgqueue_group, ["history", "maintain", "--days-ahead", "0"]
        )
        assert bad.exit_code == 2 and "days-ahead" in bad.output
    finally:
        with app.app_context():
            flask_pgq.state(app).queue.dispose()


def test_downgrade_drops_the_history_with_its_partitions(database_url: URL) -> None:
    pgq = PgQueue(database_url.render_as_string(hide_password=False))
    try:
        pgq.maintain_history(days_ahead=3)
    finally:
        pgq.dispose()
    engine = create_engine(database_url)
    try:
        assert len(partitions(engine)) == 5
        with engine.begin() as connection:
            migrations.downgrade(connection, "pgqueue_0012")
        assert partitions(engine) == set()
        assert "pgqueue_job_history" not in inspect(engine).get_table_names()
        with engine.begin() as connection:
            migrations.upgrade(connection)
        assert partitions(engine) == {"pgqueue_job_history_default"}
    finally:
        engine.dispose()


def test_members_of_a_running_workflow_stay_until_it_ends(
    history_pgq: PgQueue, engine: Engine
) -> None:
    """A chord's callback reads its members' results from their rows when it is released, and
    ``get_workflow`` lists the members: neither the history move nor pruning takes a member of
    a workflow that is still running, however long ago the member finished."""
    pgq = history_pgq
    pgq.maintain_history(days_ahead=1, retention_days=7)

    @pgq.task(name="history.part", queue="parts")
    def part(n: int) -> int:
        return n

    @pgq.task(name="history.sum", queue="merge")
    def total(results: list[int]) -> list[int]:
        return results

    wf = chord([part.s(n) for n in range(3)], total.s()).enqueue()
    # The members run; the callback's queue is not served yet.
    assert pgq.run_worker(drain=True, queues=["parts"]).succeeded == 3
    time.sleep(0.6)  # past history_move_after
    with Session(engine) as session, session.begin():
        moved = history_data.move_to_history(executor_for(session), age=0.0, limit=100)
        pruned = maintenance_data.prune_finished(
            executor_for(session), succeeded_before=0.0, failed_before=0.0, limit=100
        )
    assert (moved, pruned) == (0, 0)
    assert len(pgq.get_workflow(wf.id).jobs) == 4

    pgq.run_worker(drain=True, queues=["merge"])
    done = pgq.wait_for_workflow(wf.id, timeout=30)
    assert (done.state, done.result) == ("succeeded", [0, 1, 2])
    # Now they move: by this call, or already by the worker's own history duty.
    left, moved = _move_workflow(engine, wf.id)
    assert (left, moved >= 4) == (0, True)


def test_an_ended_workflow_keeps_its_result_once_its_jobs_are_moved(
    history_pgq: PgQueue, engine: Engine
) -> None:
    """Once a workflow has ended its jobs are moved like any other finished job, and
    ``get_workflow`` still gives the result of its final job from the history."""
    pgq = history_pgq
    pgq.maintain_history(days_ahead=1, retention_days=7)

    @pgq.task(name="history.piece", queue="pieces")
    def piece(n: int) -> int:
        return n * 10

    @pgq.task(name="history.collect", queue="pieces")
    def collect(results: list[int]) -> list[int]:
        return sorted(results)

    wf = chord([piece.s(n) for n in range(3)], collect.s()).enqueue()
    pgq.run_worker(drain=True, queues=["pieces"])
    assert pgq.wait_for_workflow(wf.id, timeout=30).result == [0, 10, 20]
    # They move by this call, or already by the drain's own history duty.
    left, moved = _move_workflow(engine, wf.id)
    assert (left, moved) == (0, 5)  # three pieces, the callback and the closing marker
    ended = pgq.get_workflow(wf.id)
    assert (ended.state, ended.result) == ("succeeded", [0, 10, 20])


def test_a_new_job_may_depend_on_jobs_moved_to_the_history(
    history_pgq: PgQueue, engine: Engine
) -> None:
    pgq = history_pgq
    pgq.maintain_history(days_ahead=1)
    ran: list[str] = []

    @pgq.task(name="history.step", queue="hist", max_attempts=1)
    def step(name: str, fail: bool = False) -> str:
        if fail:
            raise RuntimeError(f"{name} fails")
        ran.append(name)
        return name

    succeeded = step.enqueue("parent")
    failed = step.enqueue("bad parent", fail=True)
    worker = Worker(pgq, queues=["hist"], concurrency=2)
    with in_thread(worker):
        wait_until(
            lambda: (where_is(engine, succeeded), where_is(engine, failed)) == ((0, 1), (0, 1)),
            30,
            "both parents moved to the history",
            0.1,
        )

        # A moved parent counts by the state it ended in: the dependent of the one that
        # succeeded runs, the dependent of the one that failed is cancelled at its enqueue.
        runs = step.configure(depends_on=[succeeded]).enqueue("after the parent")
        assert pgq.wait_for(runs, timeout=30).state is JobState.SUCCEEDED
        cancelled = pgq.get_job(step.configure(depends_on=[succeeded, failed]).enqueue("never"))
        assert cancelled.state is JobState.CANCELLED
        assert cancelled.last_error == f"dependency {failed} ended failed; not run"

        # With a parent still in pgqueue_jobs beside it, the job waits for that one alone.
        later = step.configure(delay=3600).enqueue("later parent")
        waiting = step.configure(depends_on=[succeeded, later]).enqueue("after both")
        assert pgq.get_job(waiting).state is JobState.WAITING
        assert pgq.get_job(later).dependents == [waiting]

        async def enqueue_async() -> int:
            try:
                return await step.configure(depends_on=[succeeded]).aenqueue("async dependent")
            finally:
                await pgq.adispose()

        assert pgq.wait_for(asyncio.run(enqueue_async()), timeout=30).state is JobState.SUCCEEDED
    assert ran == ["parent", "after the parent", "async dependent"]
    # An id in neither table is still refused, and nothing of the batch is written. Both tables
    # are counted: the stopped worker's maintenance thread may still finish a move meanwhile.
    both = text(
        "SELECT (SELECT count(*) FROM pgqueue_jobs) + (SELECT count(*) FROM pgqueue_job_history)"
    )
    with engine.connect() as connection:
        before = connection.execute(both).scalar()
    with pytest.raises(JobNotFound, match=str(succeeded + 1_000_000)):
        step.configure(depends_on=[succeeded, succeeded + 1_000_000]).enqueue("orphan")
    with engine.connect() as connection:
        assert connection.execute(both).scalar() == before


def test_reads_of_jobs_follow_the_settings_the_queue_uses(
    database_url: URL, engine: Engine
) -> None:
    """Where a queue reads jobs is asked of ``pgq.settings`` at each unit of work: settings
    replaced after its connections were made move its reads, in its own units and in a
    caller's session alike."""
    pgq = PgQueue(database_url.render_as_string(hide_password=False), settings=Settings())
    try:

        @pgq.task(name="history.parent", queue="follow")
        def parent() -> None:
            return None

        parent_id = parent.enqueue()
        assert pgq.run_worker(drain=True).succeeded == 1
        with Session(engine) as session, session.begin():
            assert history_data.move_to_history(executor_for(session), age=0.0, limit=100) == 1
        # The default layout never reads the history: for this queue the job is gone.
        with pytest.raises(JobNotFound):
            pgq.get_job(parent_id)
        assert pgq.admin.queue_names() == []
        with pytest.raises(JobNotFound):
            parent.configure(depends_on=[parent_id]).enqueue()

        pgq.settings = pgq.settings.replace(history="partitioned")
        assert pgq.get_job(parent_id).state is JobState.SUCCEEDED
        assert pgq.admin.queue_names() == ["follow"]
        own = parent.configure(depends_on=[parent_id]).enqueue()
        with Session(engine) as session, session.begin():
            joined = parent.configure(depends_on=[parent_id], session=session).enqueue()
        assert pgq.get_job(own).state is JobState.QUEUED
        assert pgq.get_job(joined).state is JobState.QUEUED
    finally:
        pgq.dispose()


def _move_workflow(engine: Engine, workflow_id: int) -> tuple[int, int]:
    """Move every finished job to the history now; then (jobs of the workflow left in
    ``pgqueue_jobs``, jobs of it in the history), whoever moved them."""
    with Session(engine) as session, session.begin():
        history_data.move_to_history(executor_for(session), age=0.0, limit=100)
    with engine.connect() as connection:
        left, moved = connection.execute(
            text(
                "SELECT (SELECT count(*) FROM pgqueue_jobs WHERE workflow_id = :w),"
                " (SELECT count(*) FROM pgqueue_job_history WHERE workflow_id = :w)"
            ),
            {"w": workflow_id},
        ).one()
    return int(left), int(moved)
