"""10,000 jobs, 8 workers in 2 processes, every job run exactly once."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from sqlalchemy import func, select, text
from sqlalchemy.engine import URL

from pgqueue import JobState, PgQueue
from pgqueue.models import Job

WORKER_MODULE = """
import os
from sqlalchemy import text
from pgqueue import JobContext, PgQueue, Settings

pgq = PgQueue(os.environ["DB_URL"], settings=Settings(poll_interval=0.2))


@pgq.task(name="ledger_write", pass_context=True)
def ledger_write(ctx: JobContext) -> None:
    ctx.session.execute(text("INSERT INTO ledger (job_id, pid) VALUES (:id, :pid)"),
                        {"id": ctx.job_id, "pid": os.getpid()})
"""


@pytest.mark.slow
def test_ten_thousand_jobs_eight_workers_two_processes(
    database_url: URL, engine, tmp_path: Path
) -> None:
    url = database_url.render_as_string(hide_password=False)
    (tmp_path / "ledger_app.py").write_text(textwrap.dedent(WORKER_MODULE))
    with engine.begin() as connection:
        connection.execute(text("CREATE TABLE ledger (job_id bigint NOT NULL, pid int NOT NULL)"))

    producer = PgQueue(url)

    @producer.task(name="ledger_write", pass_context=True)
    def ledger_write(ctx: object) -> None:  # same name as the workers' task; never run here
        raise AssertionError("producer never runs jobs")

    ids = ledger_write.enqueue_many([[] for _ in range(10_000)])
    assert len(set(ids)) == 10_000

    env = {**os.environ, "DB_URL": url}
    command = [
        sys.executable,
        "-m",
        "pgqueue",
        "worker",
        "ledger_app:pgq",
        "--concurrency",
        "4",
        "--drain",
    ]
    workers = [subprocess.Popen(command, cwd=tmp_path, env=env) for _ in range(2)]
    try:
        codes = [w.wait(timeout=600) for w in workers]
    finally:
        for w in workers:
            if w.poll() is None:
                w.kill()
    assert codes == [0, 0]

    with engine.connect() as connection:
        rows = connection.execute(text("SELECT count(*), count(DISTINCT job_id) FROM ledger")).one()
        pids = connection.execute(text("SELECT count(DISTINCT pid) FROM ledger")).scalar_one()
        states = dict(connection.execute(select(Job.state, func.count()).group_by(Job.state)).all())
        attempts = connection.execute(select(func.max(Job.attempts), func.min(Job.attempts))).one()
        tickets = connection.execute(text("SELECT count(*) FROM pgqueue_message_queue")).scalar()
    assert rows == (10_000, 10_000)
    assert pids == 2, "both worker processes took part"
    assert states == {JobState.SUCCEEDED: 10_000}
    assert tuple(attempts) == (1, 1)
    assert tickets == 0
    with engine.connect() as connection:
        ledger_ids = {r[0] for r in connection.execute(text("SELECT job_id FROM ledger"))}
    assert ledger_ids == set(ids)
    producer.dispose()
