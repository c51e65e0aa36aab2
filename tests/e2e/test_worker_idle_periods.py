"""Workers left idle for longer than every periodic duty, then given jobs one by one.

A worker spends most of its life waiting: outside its peak a web app enqueues a job every few
minutes. Each of the worker's periodic duties (the prepared-statement refresh, maintenance and
pruning, the registry heartbeat, the metrics gauges) runs several times while it waits, and
the first jobs after the quiet must still be picked up at once, with nothing logged as an error.

Three idle periods (25 s, 40 s, 2 min), each followed by three jobs a couple of seconds apart,
on two workers at once (after a round without a quiet period, which the workers' first use of
each path pays for): one connected directly, one through PgBouncer in transaction mode. The
test process enqueues like the apps that use pgqueue: in its own session's transaction, with a
one-off ``enqueue()``, and from asyncio (``aenqueue``), each on connections that sat idle in
their pools as long as the workers did. After each quiet period a job that waited through it
in ``ctx.wait_for_signal`` is signalled, and a two-step chain is enqueued: the signalled job
and the chain's second step (released by the first's end) must start at once too.

It runs twice: with the finished jobs kept in place, and with the partitioned history, where
the workers' maintenance also moves each finished job out of ``pgqueue_jobs`` 2 s after it ended
(the test's reads cover both tables).
"""

from __future__ import annotations

import asyncio
import json
import time
import urllib.request
from typing import TYPE_CHECKING, Any

import pytest
from sqlalchemy.engine import URL
from support.network import free_port

from pgqueue import PgQueue, Settings, chain

if TYPE_CHECKING:
    from conftest import App, WorkerProcess

IDLE_PERIODS = (25.0, 40.0, 120.0)
JOBS_PER_BURST = 3
SECONDS_BETWEEN_JOBS = 2.0
# A listening worker starts a job within milliseconds of its commit; the poll (1 s) is the
# fallback. Anything past it means a claim failed or the wake-up was lost.
PICKUP_LIMIT = 1.0
# Seconds after finishing at which the partitioned run moves a job to the history.
MOVE_AFTER = 2.0
# The jobs wherever they are: in pgqueue_jobs, or moved to the partitioned history.
JOBS = (
    "(SELECT id, state, created_at, started_at, finished_at FROM pgqueue_jobs"
    " UNION ALL SELECT id, state, created_at, started_at, finished_at FROM pgqueue_job_history)"
)


def _declare_record(pgq: PgQueue) -> Any:
    @pgq.task(name="record", pass_context=True)
    def record(ctx: object, secret: str = "") -> None:
        """The e2e app's ``record`` (run by the workers); declared here to enqueue it."""

    return record


def _declare_await_go(pgq: PgQueue) -> Any:
    @pgq.task(name="await_go", pass_context=True)
    def await_go(ctx: object) -> None:
        """The e2e app's ``await_go``; declared here to enqueue it."""

    return await_go


class Enqueuer:
    """Enqueues ``record`` into one queue the three ways an app does, taking turns."""

    def __init__(self, pgq: PgQueue, queue: str, loop: asyncio.AbstractEventLoop) -> None:
        self.pgq = pgq
        self.record = _declare_record(pgq)
        self.task = self.record.configure(queue=queue)
        self.loop = loop
        self.turn = 0

    def enqueue(self) -> int:
        self.turn += 1
        way = self.turn % 3
        if way == 0:
            with self.pgq.sessions() as session, session.begin():
                return int(self.task.configure(session=session).enqueue())
        if way == 1:
            return int(self.task.enqueue())
        return int(self.loop.run_until_complete(self.task.aenqueue()))


def _pickup_seconds(app: App, job_id: int) -> list[float]:
    """``[seconds from the job's enqueue to its claim]`` (both by the database clock) once it
    is claimed, else ``[]``."""
    [row] = app.rows(
        "SELECT extract(epoch FROM started_at - created_at) AS waited, started_at "
        f"FROM {JOBS} AS j WHERE id = :id",
        id=job_id,
    )
    return [] if row.started_at is None else [float(row.waited)]


def _suspended(app: App, job_id: int) -> bool:
    """Whether job ``job_id`` waits in ``ctx.wait_for_signal`` (queued, its wait saved)."""
    return bool(
        app.rows(
            "SELECT 1 FROM pgqueue_jobs j JOIN pgqueue_job_suspensions s ON s.job_id = j.id"
            " WHERE j.id = :id AND j.state = 'queued'",
            id=job_id,
        )
    )


def _resumed_seconds(app: App, job_id: int) -> list[float]:
    """``[seconds from the job's signal to its resumed run's claim]`` once it succeeded."""
    [row] = app.rows(
        "SELECT j.state, extract(epoch FROM j.started_at - s.sent_at) AS waited"
        f" FROM {JOBS} AS j JOIN pgqueue_job_signals s ON s.job_id = j.id WHERE j.id = :id",
        id=job_id,
    )
    return [float(row.waited)] if row.state == "succeeded" else []


def _released_seconds(app: App, first: int, second: int) -> list[float]:
    """``[seconds from a chain's first step's end to its second step's claim]``, once claimed."""
    [row] = app.rows(
        "SELECT extract(epoch FROM b.started_at - a.finished_at) AS waited, b.started_at"
        f" FROM {JOBS} AS a, {JOBS} AS b WHERE a.id = :first AND b.id = :second",
        first=first,
        second=second,
    )
    return [] if row.started_at is None else [float(row.waited)]


def _all_final(app: App, ids: list[int]) -> bool:
    [(done,)] = app.rows(
        f"SELECT count(*) FROM {JOBS} AS j"
        " WHERE id = ANY(:ids) AND state IN ('succeeded', 'failed', 'cancelled')",
        ids=ids,
    )
    return int(done) == len(set(ids))


def _claim_failures(port: int) -> float:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        text = response.read().decode()
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("pgqueue_claim_failures_total")
    )


def _assert_quiet(worker: WorkerProcess) -> None:
    log = worker.log()
    for marker in ("ERROR", "Traceback", "WARNING"):
        assert marker not in log, log


@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.parametrize("history", ["in_place", "partitioned"])
def test_idle_workers_pick_up_each_job_at_once_after_long_quiet_periods(
    app: App, bouncer: URL, history: str
) -> None:
    # Every periodic duty comes round during the shortest idle period, pruning included (and
    # the history move, every rescue pass).
    duties: dict[str, Any] = {
        "prune_interval": 20,
        "metrics_interval": 15,
        "history": history,
        "history_move_after": MOVE_AFTER,
    }
    direct_port, bounced_port = free_port(), free_port()
    direct = app.start_worker(
        "--queues", "direct", "--concurrency", "4", metrics_port=direct_port, **duties
    )
    bounced_env = app.env(
        pooler="transaction",
        listen_database_url=app.url_string,
        metrics_port=bounced_port,
        **duties,
    )
    bounced_env["DB_URL"] = bouncer.render_as_string(hide_password=False)
    bounced = app.start_worker_with_env(bounced_env, "--queues", "bounced", "--concurrency", "4")
    app.wait_listening(count=2)

    loop = asyncio.new_event_loop()
    direct_pgq = PgQueue(app.url_string, settings=Settings(history=history))
    bounced_pgq = PgQueue(
        bouncer.render_as_string(hide_password=False),
        settings=Settings(pooler="transaction", history=history),
    )
    enqueuers = {
        "direct": Enqueuer(direct_pgq, "direct", loop),
        "bounced": Enqueuer(bounced_pgq, "bounced", loop),
    }
    waits: dict[str, list[tuple[float, int, float]]] = {name: [] for name in enqueuers}
    pgqs = {"direct": direct_pgq, "bounced": bounced_pgq}
    await_go = {name: _declare_await_go(pgq) for name, pgq in pgqs.items()}

    def one_round(
        idle: float, measured: dict[str, list[tuple[float, int, float]]]
    ) -> dict[str, int]:
        """Sleep ``idle`` s while a job per worker waits for a signal, then signal it, run a
        chain and a burst of jobs on both workers; record each pickup in ``measured``;
        return the signalled jobs."""
        waiting = {name: int(await_go[name].configure(queue=name).enqueue()) for name in pgqs}
        for name, job_id in waiting.items():
            app.wait_until(
                lambda job_id=job_id: _suspended(app, job_id),
                timeout=30,
                what=f"{name} job {job_id} to wait for its signal",
            )
        time.sleep(idle)
        for name, job_id in waiting.items():
            assert pgqs[name].signal(job_id, "go", {"after": idle})
        for name, job_id in waiting.items():
            [waited] = app.wait_until(
                lambda job_id=job_id: _resumed_seconds(app, job_id),
                timeout=30,
                what=f"{name} job {job_id} to resume after its signal, {idle:.0f} s idle",
                interval=0.02,
            )
            measured[name].append((idle, job_id, waited))
        for name, enqueuer in enqueuers.items():
            steps = [enqueuer.record.si().set(queue=name) for _ in range(2)]
            workflow = chain(*steps).enqueue()
            first, second = workflow.job_ids
            [waited] = app.wait_until(
                lambda first=first, second=second: _released_seconds(app, first, second),
                timeout=30,
                what=f"{name} chain {workflow.id}'s second step, {idle:.0f} s idle",
                interval=0.02,
            )
            measured[name].append((idle, second, waited))
        for _ in range(JOBS_PER_BURST):
            ids = {name: enqueuer.enqueue() for name, enqueuer in enqueuers.items()}
            for name, job_id in ids.items():
                [waited] = app.wait_until(
                    lambda job_id=job_id: _pickup_seconds(app, job_id),
                    timeout=30,
                    what=f"{name} job {job_id} to be claimed after {idle:.0f} s idle",
                    interval=0.02,
                )
                measured[name].append((idle, job_id, waited))
            time.sleep(SECONDS_BETWEEN_JOBS)
        return waiting

    try:
        # Each path's first use in a worker process builds and compiles its statements, which
        # a loaded machine can stretch past the pickup limit: one round without a quiet period
        # first, so the rounds measured show what the quiet costs.
        one_round(0.0, {name: [] for name in enqueuers})
        for idle in IDLE_PERIODS:
            waiting = one_round(idle, waits)
        ids = [job_id for name in waits for _, job_id, _ in waits[name]]
        app.wait_until(lambda: _all_final(app, ids), timeout=30, what=f"{len(ids)} jobs to end")
        for name, job_id in waiting.items():
            assert pgqs[name].get_job(job_id).result == {"after": IDLE_PERIODS[-1]}
        if history == "partitioned":
            # The first quiet period's jobs ended minutes ago: the idle workers moved them all.
            first = {
                job_id
                for name in waits
                for idle, job_id, _ in waits[name]
                if idle == IDLE_PERIODS[0]
            }
            [(moved,)] = app.rows(
                "SELECT count(*) FROM pgqueue_job_history WHERE id = ANY(:ids)", ids=list(first)
            )
            assert moved == len(first)
        claim_failures = {
            "direct": _claim_failures(direct_port),
            "bounced": _claim_failures(bounced_port),
        }
    finally:
        loop.run_until_complete(direct_pgq.adispose())
        loop.run_until_complete(bounced_pgq.adispose())
        loop.close()
        direct_pgq.dispose()
        bounced_pgq.dispose()

    print(json.dumps(waits))
    for name, measured in waits.items():
        slow = [(idle, job_id, round(w, 3)) for idle, job_id, w in measured if w > PICKUP_LIMIT]
        assert not slow, f"{name}: jobs picked up late (idle s, id, s): {slow}"
    assert claim_failures == {"direct": 0.0, "bounced": 0.0}
    _assert_quiet(direct)
    _assert_quiet(bounced)
    assert direct.popen.poll() is None and bounced.popen.poll() is None
