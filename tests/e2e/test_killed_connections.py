"""Connections the server ends are not the caller's problem: enqueues ride through them.

A web process enqueues on pgqueue's own engine; its pooled connections die whenever the server
ends sessions (restart, failover, ``pg_terminate_backend``, a proxy's idle timeout). The next
enqueue must not raise, and must not insert its job twice.
"""

from __future__ import annotations

import threading
import time
from typing import TYPE_CHECKING

import pytest
from sqlalchemy import create_engine, text

from pgqueue import PgQueue, Settings, backoff

if TYPE_CHECKING:
    from conftest import App

# Every connection pgqueue opened itself: the workers' (and a test process's own PgQueue's).
TERMINATE_PGQUEUE = (
    "SELECT count(*) FILTER (WHERE pg_terminate_backend(pid)) FROM pg_stat_activity "
    "WHERE datname = current_database() AND pid <> pg_backend_pid() "
    "AND application_name LIKE 'pgqueue%'"
)


def test_enqueue_after_its_pooled_connections_were_terminated(app: App) -> None:
    work = app.module.work
    first = work.enqueue()
    killer = create_engine(app.url, isolation_level="AUTOCOMMIT")
    with killer.connect() as connection:
        assert connection.execute(text(TERMINATE_PGQUEUE)).scalar_one() >= 1
    killer.dispose()
    time.sleep(0.1)  # the terminated backend's goodbye reaches the pooled socket
    second = work.enqueue()
    assert app.scalars("SELECT id FROM pgqueue_jobs ORDER BY id") == [first, second]


@pytest.mark.slow
def test_web_loop_enqueues_while_worker_connections_are_terminated_every_500ms(app: App) -> None:
    # The web process enqueues on its own engine (named "web"); every connection of the worker
    # processes is terminated every 500 ms. A statement sent in the microseconds between a
    # kill and the arrival of the server's goodbye meets a reset socket with no error code,
    # which cannot be told apart from a crash after commit, so it is not retried: killing the
    # enqueuer's own connections mid-stream is covered by the test above, one kill at a time.
    worker = app.start_worker("--processes", "2", "--concurrency", "4")
    app.wait_listening(count=2)
    web_engine = create_engine(app.url, connect_args={"application_name": "web"})
    web = PgQueue(web_engine, settings=Settings())

    # Declared as the worker's app declares it: the enqueuing side's declaration writes the
    # job's max_attempts and backoff, and three attempts can all meet a kill round.
    @web.task(name="work", pass_context=True, max_attempts=25, retry=backoff.constant(0.2))
    def work(ctx: object, seconds: float = 0.0, start_mark: bool = False) -> None:
        """Declared to enqueue the worker's ``work`` from the web side."""

    returned: list[int] = []
    errors: list[BaseException] = []
    stop = threading.Event()

    def web_loop() -> None:
        while not stop.is_set():
            try:
                returned.append(work.enqueue())
            except BaseException as exc:  # every failure is the finding
                errors.append(exc)
            time.sleep(0.005)

    enqueuer = threading.Thread(target=web_loop)
    enqueuer.start()
    terminated: list[int] = []
    killer = create_engine(app.url, isolation_level="AUTOCOMMIT")
    try:
        with killer.connect() as connection:
            for _ in range(20):  # 10 s
                tick = time.monotonic()
                terminated.append(connection.execute(text(TERMINATE_PGQUEUE)).scalar_one())
                time.sleep(max(0.0, 0.5 - (time.monotonic() - tick)))
    finally:
        stop.set()
        enqueuer.join()
        killer.dispose()
        web_engine.dispose()
    print(f"{len(returned)} enqueues; terminated per round {terminated}")
    assert errors == []
    assert all(count >= 1 for count in terminated)
    # Exactly the jobs whose enqueue returned: none lost, none inserted twice.
    assert sorted(app.scalars("SELECT id FROM pgqueue_jobs")) == sorted(returned)
    final = app.wait_final(returned, timeout=120)
    without_done = {
        job_id: (job.state, job.attempts, job.last_error)
        for job_id, job in final.items()
        if job_id not in app.done_counts()
    }
    assert without_done == {}, worker.log()[-4000:]
    assert "Traceback" not in worker.log()
