"""The workloads, each on a fresh database, pgqueue and (where it has one) the baseline.

pgqueue's workers run as ``python -m pgqueue worker benchmarks.app:pgq`` subprocesses,
exactly as a deployment runs them; the baseline's workers run as ``python -m
benchmarks.baseline`` subprocesses. Throughput is measured by the database clock, first claim
to last completion, so interpreter start-up is not counted for either side; the wall time
including start-up is kept in the JSON too.
"""

from __future__ import annotations

import asyncio
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psycopg
from psycopg.types.json import Jsonb
from sqlalchemy.engine import URL

from benchmarks import app, baseline
from benchmarks.server import Server, libpq, sqlalchemy_url
from pgqueue import JobState, PgQueue
from pgqueue.sql.common import FINISHED_CHANNEL

REPO_ROOT = Path(__file__).resolve().parent.parent
WORKER_TIMEOUT = 900.0
FILL_CHUNK = 50_000

Result = dict[str, Any]


# -- helpers ---------------------------------------------------------------------------------


def percentiles(values: Sequence[float]) -> dict[str, float]:
    ordered = sorted(values)

    def pick(p: float) -> float:
        return ordered[min(len(ordered) - 1, round(p / 100 * (len(ordered) - 1)))]

    return {
        "p50": pick(50),
        "p95": pick(95),
        "p99": pick(99),
        "max": ordered[-1],
        "mean": statistics.fmean(ordered),
    }


def worker_env(url: URL) -> dict[str, str]:
    """The environment of a worker subprocess draining ``url`` (``benchmarks.app`` reads it)."""
    env = dict(os.environ)
    env["PGQUEUE_BENCH_URL"] = sqlalchemy_url(url)
    env.pop("PGQUEUE_DATABASE_URL", None)
    return env


@contextmanager
def process(
    command: list[str], env: dict[str, str] | None = None
) -> Iterator[subprocess.Popen[str]]:
    """A child process that is stopped (SIGTERM, then SIGKILL) on the way out, whatever happens.

    Its stderr (pgqueue's worker logs a line per job at INFO) goes to a temporary file, not the
    terminal, and its tail is raised with the error when the child fails.
    """
    with tempfile.TemporaryFile("w+") as log:
        child = subprocess.Popen(
            command, cwd=REPO_ROOT, env=env, stdout=subprocess.PIPE, stderr=log, text=True
        )
        try:
            yield child
        except BaseException as exc:
            log.seek(0)
            tail = log.read()[-3000:]
            raise RuntimeError(f"{exc!r}; child stderr tail:\n{tail}") from exc
        finally:
            if child.poll() is None:
                child.send_signal(signal.SIGTERM)
                try:
                    child.wait(30)
                except subprocess.TimeoutExpired:
                    child.kill()
                    child.wait()


def worker_command(concurrency: int, processes: int = 1, drain: bool = True) -> list[str]:
    return [
        sys.executable,
        "-m",
        "pgqueue",
        "worker",
        "benchmarks.app:pgq",
        "--concurrency",
        str(concurrency),
        "--processes",
        str(processes),
        *(["--drain"] if drain else []),
    ]


def wait_until(predicate: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(0.05)


def fill_pgqueue(url: URL, n: int, task_name: str = app.NOOP, **kwargs: Any) -> None:
    """``n`` jobs through ``enqueue_many`` (in chunks, to bound the statement's arrays)."""
    pgq = app.build(sqlalchemy_url(url))
    try:
        task = pgq.registry.get(task_name)
        for start in range(0, n, FILL_CHUNK):
            task.enqueue_many(
                [kwargs or {"n": i} for i in range(start, min(n, start + FILL_CHUNK))]
            )
    finally:
        pgq.dispose()


# Succeeded and total counts, first claim -> last completion, and the 10th -> 90th percentile
# of completion times: the steady-state window, which leaves out worker start-up (a second
# process importing pgqueue competes for the CPU with the first one already working) and the
# tail where fewer jobs than slots remain.
STEADY_COLUMNS = (
    "count(*) FILTER (WHERE state = 'succeeded'), count(*),"
    " extract(epoch FROM max(finished_at) - min(started_at))::float8,"
    " extract(epoch FROM percentile_disc(0.9) WITHIN GROUP (ORDER BY finished_at)"
    " - percentile_disc(0.1) WITHIN GROUP (ORDER BY finished_at))::float8"
)


def steady_counts(row: Any) -> dict[str, Any]:
    """A ``STEADY_COLUMNS`` row as the named counts ``steady_throughput`` reads."""
    return {"succeeded": row[0], "total": row[1], "span_s": row[2], "steady_s": row[3]}


def steady_throughput(n: int, counts: dict[str, Any], wall: float) -> Result:
    """Jobs/s over the steady window (the table's number), plus first-to-last and wall."""
    ok = counts["succeeded"] == n and counts["total"] == n
    span = counts["span_s"] or float("nan")
    steady = counts["steady_s"] or float("nan")
    return {
        "jobs": n,
        "jobs_per_s": 0.8 * n / steady if ok else 0.0,
        "jobs_per_s_first_to_last": n / span if ok else 0.0,
        "span_s": span,
        "steady_s": steady,
        "wall_s": wall,
        "succeeded": counts["succeeded"],
        "ok": ok,
    }


# -- enqueue ---------------------------------------------------------------------------------


def _paired(rounds: list[tuple[float, float]], jobs: int) -> Result:
    """Per-round (pgqueue, baseline) rates -> medians and the median of per-round ratios.

    The two sides alternate round by round, so a burst of load from other processes on this
    shared machine hits both rather than whichever side happened to run at that moment.
    """
    return {
        "jobs_per_round": jobs,
        "rounds": [{"pgqueue": p, "baseline": b, "ratio": p / b} for p, b in rounds],
        "pgqueue": statistics.median(p for p, _ in rounds),
        "baseline": statistics.median(b for _, b in rounds),
        "ratio": statistics.median(p / b for p, b in rounds),
        "unit": "jobs/s",
    }


def enqueue1(
    server: Server, n: int, rounds: int, shape: Callable[[URL], None] | None = None
) -> Result:
    """``n`` jobs per round through ``task.enqueue`` (one transaction each) vs. single-row
    autocommit INSERTs, ``rounds`` alternating rounds; ``shape`` changes pgqueue's freshly
    migrated database first (``benchmarks.schema_bounds``)."""
    with server.app_beside_baseline("enq1", shape) as (pgq, raw):
        task = pgq.registry.get(app.NOOP)
        with psycopg.connect(raw, autocommit=True) as conn:
            for i in range(20):  # warm-up: pool connections, statement caches, prepares
                task.enqueue(n=i)
                baseline.insert_one(conn, i)
            results = []
            for _ in range(rounds):
                start = time.perf_counter()
                for i in range(n):
                    task.enqueue(n=i)
                pg = n / (time.perf_counter() - start)
                start = time.perf_counter()
                for i in range(n):
                    baseline.insert_one(conn, i)
                results.append((pg, n / (time.perf_counter() - start)))
    return _paired(results, n)


def enqueue_batch(
    server: Server, n: int, rounds: int, shape: Callable[[URL], None] | None = None
) -> Result:
    """``n`` jobs per round in one ``enqueue_many`` call vs. one COPY, alternating rounds;
    ``shape`` changes pgqueue's freshly migrated database first (``benchmarks.schema_bounds``)."""
    with (
        server.fresh_database("enqB") as url,
        server.fresh_database("enqB_base", migrate=False) as base_url,
    ):
        if shape is not None:
            shape(url)
        baseline.create_schema(libpq(base_url))
        pgq = app.build(sqlalchemy_url(url))
        try:
            task = pgq.registry.get(app.NOOP)
            task.enqueue_many([{"n": i} for i in range(10)])  # warm-up
            baseline.enqueue_copy(libpq(base_url), 10)
            results, two_rows = [], []
            for _ in range(rounds):
                items = [{"n": i} for i in range(n)]
                start = time.perf_counter()
                ids = task.enqueue_many(items)
                pg = n / (time.perf_counter() - start)
                if len(ids) != n:
                    raise RuntimeError(f"enqueue_many returned {len(ids)} ids for {n} jobs")
                results.append((pg, n / baseline.enqueue_copy(libpq(base_url), n)))
                two_rows.append((pg, n / baseline.enqueue_copy_two_rows(libpq(base_url), n)))
        finally:
            pgq.dispose()
    # The ceiling is COPY of one row per job; COPY of a job and a ticket row per job (as many
    # rows as pgqueue writes) is beside it, paired with the same pgqueue rounds.
    return _paired(results, n) | {"two_rows": _paired(two_rows, n)}


# -- drain -----------------------------------------------------------------------------------


def drain_pgqueue(
    server: Server,
    n: int,
    concurrency: int,
    *,
    processes: int = 1,
    task_name: str = app.NOOP,
    history: int = 0,
    task_kwargs: dict[str, Any] | None = None,
    log_successes: bool | None = None,
) -> Result:
    """``n`` jobs drained by ``pgqueue worker --drain``. ``log_successes`` sets
    ``PGQUEUE_LOG_SUCCESSES`` (``False`` is the documented high-throughput setting: no INFO
    line per succeeded job); ``None`` leaves the worker's own default, whatever the caller's
    environment says."""
    with server.fresh_database("drain") as url:
        if history:
            add_history(url, history)
        fill_pgqueue(url, n, task_name, **(task_kwargs or {}))
        start = time.perf_counter()
        env = worker_env(url)
        if log_successes is None:
            env.pop("PGQUEUE_LOG_SUCCESSES", None)
        else:
            env["PGQUEUE_LOG_SUCCESSES"] = "true" if log_successes else "false"
        with process(worker_command(concurrency, processes), env) as child:
            code = child.wait(WORKER_TIMEOUT)
            if code != 0:
                raise RuntimeError(f"pgqueue worker exited with {code}")
        wall = time.perf_counter() - start
        result = steady_throughput(n, succeeded_after(url, history), wall)
    result.update(
        concurrency=concurrency, processes=processes, history=history, log_successes=log_successes
    )
    return result


def succeeded_after(url: URL, history: int) -> dict[str, Any]:
    """Like ``pgqueue_span`` but ignoring the ``history`` pre-finished rows (ids 1..history)."""
    with psycopg.connect(libpq(url), autocommit=True) as conn:
        row = conn.execute(
            f"SELECT {STEADY_COLUMNS} FROM pgqueue_jobs WHERE id > %s",
            (history,),
        ).fetchone()
    assert row is not None
    return steady_counts(row)


def drain_baseline(
    server: Server, n: int, batch: int, threads: int = 1, async_claims: bool = False
) -> Result:
    """``n`` jobs drained by the raw-SQL worker: ``threads`` connections claiming ``batch`` each
    (``async_claims``: claims that commit without waiting for their WAL flush)."""
    with server.fresh_database("drain_base", migrate=False) as url:
        baseline.create_schema(libpq(url))
        baseline.fill(libpq(url), n)
        start = time.perf_counter()
        command = [
            *(sys.executable, "-m", "benchmarks.baseline", "drain"),
            *(libpq(url), str(batch), str(threads)),
            *(("async",) if async_claims else ()),
        ]
        with process(command) as child:
            code = child.wait(WORKER_TIMEOUT)
            if code != 0:
                raise RuntimeError(f"baseline worker exited with {code}")
        wall = time.perf_counter() - start
        result = steady_throughput(n, baseline.span(libpq(url)), wall)
    result.update(batch=batch, threads=threads, async_claims=async_claims)
    return result


def add_history(url: URL, rows: int) -> None:
    """``rows`` finished jobs in one INSERT ... SELECT, then VACUUM ANALYZE (as autovacuum
    would have done by the time that much history has accumulated)."""
    with psycopg.connect(libpq(url), autocommit=True) as conn:
        conn.execute(
            """
            INSERT INTO pgqueue_jobs (task_name, queue, args, kwargs, state, priority, attempts,
                max_attempts, run_at, created_at, started_at, finished_at, updated_at, result)
            SELECT %s, 'default', '[]', json_build_object('n', g), 'succeeded', 0, 1, 3,
                t, t, t, t + interval '2 ms', t + interval '2 ms', 'null'
            FROM generate_series(1, %s) AS g,
                LATERAL (SELECT now() - interval '2 days' + g * interval '100 ms' AS t) AS ts
            """,
            (app.NOOP, rows),
        )
        conn.execute("VACUUM ANALYZE pgqueue_jobs")


# -- latency ---------------------------------------------------------------------------------


def _listener_connected(url: URL, application_name: str) -> Callable[[], bool]:
    def check() -> bool:
        with psycopg.connect(libpq(url), autocommit=True) as conn:
            row = conn.execute(
                "SELECT count(*) FROM pg_stat_activity"
                " WHERE datname = current_database() AND application_name = %s"
                " AND query ILIKE 'LISTEN%%'",
                (application_name,),
            ).fetchone()
        return bool(row and row[0])

    return check


def _paced(n: int, rate: float) -> Iterator[int]:
    start = time.perf_counter()
    for i in range(n):
        pause = start + i / rate - time.perf_counter()
        if pause > 0:
            time.sleep(pause)
        yield i


def latency_pgqueue(
    server: Server, n: int, rate: float, shape: Callable[[URL], None] | None = None
) -> Result:
    """Delays from ``n`` enqueues' commits (``rate`` per second) to their handlers' first line
    on an idle listening worker; ``shape`` changes the freshly migrated database first
    (``benchmarks.schema_bounds``)."""
    with server.fresh_database("lat") as url:
        if shape is not None:
            shape(url)
        pgq = app.build(sqlalchemy_url(url))
        try:
            task = pgq.registry.get(app.PROBE)
            with process(worker_command(10, drain=False), worker_env(url)) as child:
                wait_until(_listener_connected(url, "pgqueue-listener"), 60, "the worker's LISTEN")
                warm = [task.enqueue(n=-i - 1) for i in range(10)]
                wait_until(lambda: _probe_done(url, len(warm)), 60, "warm-up jobs")
                sent: dict[int, float] = {}
                for i in _paced(n, rate):
                    job_id = task.enqueue(n=i)
                    sent[job_id] = time.time()  # commit acknowledged
                wait_until(lambda: _probe_done(url, n + len(warm)), 60, "probe jobs")
                assert child.poll() is None, "worker died"
            started = _probe_starts(url)
        finally:
            pgq.dispose()
    delays = [(started[job_id] - t) * 1000 for job_id, t in sent.items()]
    return {"jobs": n, "rate": rate, **percentiles(delays), "unit": "ms", "delays": delays}


def _probe_done(url: URL, expected: int) -> bool:
    with psycopg.connect(libpq(url), autocommit=True) as conn:
        row = conn.execute("SELECT count(*) FROM pgqueue_jobs WHERE state = 'succeeded'").fetchone()
    return bool(row and row[0] >= expected)


def _probe_starts(url: URL) -> dict[int, float]:
    with psycopg.connect(libpq(url), autocommit=True) as conn:
        rows = conn.execute(
            "SELECT id, result::text FROM pgqueue_jobs WHERE state = 'succeeded'"
        ).fetchall()
    return {job_id: float(result) for job_id, result in rows}


def latency_baseline(server: Server, n: int, rate: float, async_claims: bool = False) -> Result:
    """The bare LISTEN loop's pick-up (``async_claims``: see ``drain_baseline``)."""
    with server.fresh_database("lat_base", migrate=False) as url:
        conninfo = libpq(url)
        baseline.create_schema(conninfo)
        command = [sys.executable, "-m", "benchmarks.baseline", "listen", conninfo, "10"]
        command += ["async"] if async_claims else []
        with process(command) as child, psycopg.connect(conninfo) as conn:
            assert child.stdout is not None
            assert child.stdout.readline().strip() == "listening"
            for i in range(10):
                baseline.enqueue_notify(conn, -i - 1)
            wait_until(lambda: len(baseline.probe_results(conninfo)) >= 10, 60, "warm-up")
            conn.execute("DELETE FROM baseline_jobs")
            conn.commit()
            sent: dict[int, float] = {}
            for i in _paced(n, rate):
                with conn.transaction():
                    row = conn.execute(
                        baseline.INSERT_ONE, ("probe", Jsonb([i])), prepare=True
                    ).fetchone()
                    conn.execute("SELECT pg_notify(%s, '')", (baseline.CHANNEL,), prepare=True)
                assert row is not None
                sent[row[0]] = time.time()
            wait_until(lambda: len(baseline.probe_results(conninfo)) >= n, 60, "probe jobs")
            started = baseline.probe_results(conninfo)
    delays = [(started[job_id] - t) * 1000 for job_id, t in sent.items()]
    return {
        "jobs": n,
        "rate": rate,
        **percentiles(delays),
        "unit": "ms",
        "delays": delays,
        "async_claims": async_claims,
    }


def paired_latency(rounds: list[tuple[Result, Result]]) -> Result:
    """Per-round (pgqueue, baseline) latency results -> each side's median of per-round p50s,
    the median of per-round p50 ratios, and p95/p99/max over all rounds' samples.

    As for the throughput pairs, the sides alternate round by round: a p50 of under a
    millisecond moves by a third with the machine's load, and a single pgqueue run minutes
    before a single baseline run compared two different machines."""

    def side(index: int) -> Result:
        samples = [d for pair in rounds for d in pair[index]["delays"]]
        return {
            **percentiles(samples),
            "p50": statistics.median(pair[index]["p50"] for pair in rounds),
            "jobs": len(samples),
            "unit": "ms",
        }

    return {
        "rounds": [
            {"pgqueue": pg["p50"], "baseline": base["p50"], "ratio": pg["p50"] / base["p50"]}
            for pg, base in rounds
        ],
        "pgqueue": side(0),
        "baseline": side(1),
        "p50_ratio": statistics.median(pg["p50"] / base["p50"] for pg, base in rounds),
        "rounds_detail": [{"pgqueue": pg, "baseline": base} for pg, base in rounds],
    }


# -- waiting for a result ----------------------------------------------------------------------

# Long enough that each wait has begun (its first read done) before the job ends, so what is
# measured is the wake-up by the job's announcement, not a read that finds it finished.
AWAITED_JOB_MS = 20.0


class _Announcements:
    """A bare LISTEN client on the channel where ended jobs are announced: when each job id's
    announcement reached it (wall clock), to tell pgqueue's share of a wait from the commit's."""

    def __init__(self, url: URL) -> None:
        self.arrived: dict[int, float] = {}
        self._stop = threading.Event()
        self._listening = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(libpq(url),), daemon=True)

    def __enter__(self) -> _Announcements:
        self._thread.start()
        assert self._listening.wait(60), "the bare LISTEN client never listened"
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(10)

    def _run(self, conninfo: str) -> None:
        with psycopg.connect(conninfo, autocommit=True) as conn:
            conn.execute(f'LISTEN "{FINISHED_CHANNEL}"')  # a constant identifier
            self._listening.set()
            while not self._stop.is_set():
                for notify in conn.notifies(timeout=0.2):
                    now = time.time()
                    for job_id in notify.payload.split(","):
                        self.arrived[int(job_id)] = now


def await_pgqueue(server: Server, n: int) -> Result:
    """``n`` jobs, one at a time, each awaited with ``await pgq.await_job``, then ``n`` more
    with ``pgq.wait_for``, run by an idle listening worker process. For each: how long after
    its ``finished_at`` (the start of its outcome's transaction, by the database clock of this
    host, so the outcome's statement and commit are included) the wait returned (wall clock),
    and how long after a bare LISTEN client received the job's announcement (pgqueue's share)."""
    with server.fresh_database("await") as url:
        pgq = app.build(sqlalchemy_url(url))
        try:
            with (
                process(worker_command(10, drain=False), worker_env(url)) as child,
                _Announcements(url) as announcements,
            ):
                wait_until(_listener_connected(url, "pgqueue-listener"), 60, "the worker's LISTEN")
                awaited = asyncio.run(_awaited_jobs(pgq, n))
                waited = _waited_jobs(pgq, n)
                assert child.poll() is None, "worker died"
        finally:
            pgq.dispose()

    def summary(returns: list[tuple[Any, float]]) -> Result:
        finished = [(at - job.finished_at.timestamp()) * 1000 for job, at in returns]
        # A job whose announcement the bare client never heard is counted, not measured: the
        # wait itself returned, and which side missed the announcement is for the count to show.
        heard = [(job, at) for job, at in returns if job.id in announcements.arrived]
        announced = [(at - announcements.arrived[job.id]) * 1000 for job, at in heard]
        return {
            **percentiles(finished),
            "unit": "ms",
            "delays": finished,
            "after_announcement": {
                **(percentiles(announced) if announced else {}),
                "delays": announced,
                "not_heard": [job.id for job, _ in returns if job.id not in announcements.arrived],
            },
        }

    return {
        "jobs": n,
        "job_ms": AWAITED_JOB_MS,
        "await_job": summary(awaited),
        "wait_for": summary(waited),
    }


async def _awaited_jobs(pgq: PgQueue, n: int) -> list[tuple[Any, float]]:
    task = pgq.registry.get(app.SPIN)
    for _ in range(5):  # warm-up: the listener's connection, the worker's first claims
        await pgq.await_job(task.enqueue(ms=AWAITED_JOB_MS), timeout=60)
    returns = []
    for _ in range(n):
        job = await pgq.await_job(task.enqueue(ms=AWAITED_JOB_MS), timeout=60)
        returns.append((job, time.time()))
        assert job.state is JobState.SUCCEEDED, job.state
    return returns


def _waited_jobs(pgq: PgQueue, n: int) -> list[tuple[Any, float]]:
    task = pgq.registry.get(app.SPIN)
    returns = []
    for _ in range(n):
        job = pgq.wait_for(task.enqueue(ms=AWAITED_JOB_MS), timeout=60)
        returns.append((job, time.time()))
        assert job.state is JobState.SUCCEEDED, job.state
    return returns


# -- memory ----------------------------------------------------------------------------------


def _rss_mb(pid: int) -> float | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


def memory(server: Server, n: int, concurrency: int) -> Result:
    """Worker RSS while it drains ``n`` jobs; growth after the first 5% (warm-up) is what counts."""
    with server.fresh_database("mem") as url:
        fill_pgqueue(url, n)
        samples: list[tuple[int, float]] = []  # (jobs done, RSS MB)
        with (
            process(worker_command(concurrency), worker_env(url)) as child,
            psycopg.connect(libpq(url), autocommit=True) as conn,
        ):
            while child.poll() is None:
                rss = _rss_mb(child.pid)
                row = conn.execute("SELECT count(*) FROM pgqueue_message_queue").fetchone()
                if rss is not None and row is not None:
                    samples.append((n - row[0], rss))
                time.sleep(0.5)
            if child.returncode != 0:
                raise RuntimeError(f"pgqueue worker exited with {child.returncode}")
        counts = succeeded_after(url, 0)
    warm = [rss for done, rss in samples if done >= n * 0.05]
    if not warm:
        warm = [rss for _, rss in samples]
    return {
        "jobs": n,
        "concurrency": concurrency,
        "rss_start_mb": samples[0][1] if samples else None,
        "rss_after_warmup_mb": warm[0] if warm else None,
        "rss_end_mb": warm[-1] if warm else None,
        "rss_max_mb": max(warm) if warm else None,
        "growth_mb": (warm[-1] - warm[0]) if warm else None,
        "samples": samples[:: max(1, len(samples) // 50)],
        "succeeded": counts["succeeded"],
        "ok": counts["succeeded"] == n,
    }
