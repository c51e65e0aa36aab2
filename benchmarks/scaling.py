"""Scale-out on one server: ``python -m benchmarks.scaling [--processes 1,2,4,8] [--jobs N]
[--concurrency C] [--rounds R] [--job-ms MS]``.

For each number of worker processes P, a fresh database is filled with N no-op jobs (with
``--job-ms``, jobs that sleep MS milliseconds, like handlers waiting on I/O) and drained
by ``pgqueue worker benchmarks.app:pgq --processes P --drain``: the command a deployment runs on
one host (the supervisor opens no connection; its children are the same worker processes that P
separate hosts would run). Measured per drain:

- throughput (jobs/s over the steady window, as ``python -m benchmarks`` measures it);
- the server's CPU per 1,000 jobs: utime+stime of the postmaster and every process it started
  (backends, autovacuum, checkpointer, WAL writer), read from ``/proc`` before and after the
  drain, with the exited ones counted through the postmaster's ``cutime``/``cstime``. The
  server must run on this host (the embedded server, or a local ``$PGQUEUE_DATABASE_URL``); the
  sampler's own backend is measured too and left out;
- the workers' CPU per 1,000 jobs: the rusage of the worker command and its children;
- connections to the database: ``pg_stat_activity``'s client backends sampled every 20 ms,
  grouped by ``application_name`` (the peak of each, the peak of their sum, and how many
  distinct backends each opened);
- commits in the database and the server's WAL flushes and bytes, per 1,000 jobs.

The same command is run first on the still empty database: its CPU (start-up, schema check,
one claim, stop) is reported, and left out of the ``*_net`` figures per job.

Rounds alternate over the process counts (1, 2, 4, 8, 1, 2, ...) so a burst of load from other
processes on a shared machine is spread over all of them. Prints a table and writes the JSON to
``benchmarks/results/<timestamp>-scaling.json``.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import resource
import statistics
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
from rich.console import Console
from rich.table import Table
from sqlalchemy.engine import URL

from benchmarks import app
from benchmarks import server as server_module
from benchmarks.run import RESULTS_DIR, machine
from benchmarks.server import Server, libpq
from benchmarks.workloads import (
    WORKER_TIMEOUT,
    fill_pgqueue,
    process,
    steady_throughput,
    succeeded_after,
    worker_command,
    worker_env,
)

console = Console()

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
SAMPLE_INTERVAL = 0.02
REAP_TIMEOUT = 10.0

Result = dict[str, Any]


# -- the server's CPU, from /proc ------------------------------------------------------------


@dataclass(frozen=True)
class ProcStat:
    """The fields of ``/proc/<pid>/stat`` this module reads (times in seconds)."""

    pid: int
    comm: str
    ppid: int
    own: float  # utime + stime
    reaped: float  # cutime + cstime: children that exited and were waited for

    @property
    def total(self) -> float:
        return self.own + self.reaped


def read_stat(pid: int) -> ProcStat | None:
    """``/proc/<pid>/stat``, or None when the process is gone (or never was)."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # comm is in parentheses and may itself hold spaces or parentheses: split at the last one.
    head, _, rest = text.rpartition(")")
    fields = rest.split()
    utime, stime, cutime, cstime = (int(value) for value in fields[11:15])
    return ProcStat(
        pid=pid,
        comm=head.partition("(")[2],
        ppid=int(fields[1]),
        own=(utime + stime) / CLOCK_TICKS,
        reaped=(cutime + cstime) / CLOCK_TICKS,
    )


def children_of(parent: int) -> list[ProcStat]:
    """Every live process whose parent is ``parent``."""
    found = []
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            stat = read_stat(int(entry.name))
            if stat is not None and stat.ppid == parent:
                found.append(stat)
    return found


def postmaster_of(backend_pid: int) -> int | None:
    """The postmaster's pid, from one of its backends' pid (None when that backend is not a
    process of this host, i.e. the server runs elsewhere)."""
    backend = read_stat(backend_pid)
    if backend is None or not backend.comm.startswith("postgres"):
        return None
    postmaster = read_stat(backend.ppid)
    if postmaster is None or not postmaster.comm.startswith("postgres"):
        return None
    return postmaster.pid


def wait_until_reaped(pids: Iterable[int], timeout: float) -> None:
    """Wait (at most ``timeout`` seconds) until none of ``pids`` is a process any more.

    A backend's CPU moves into the postmaster's ``cutime``/``cstime`` only once the postmaster
    has waited for it; until then an exiting backend may already be gone from its children
    listing, or show the whole-tick floor of its own time, and a reading taken in between
    misses it."""
    deadline = time.monotonic() + timeout
    pending = set(pids)
    while pending and time.monotonic() < deadline:
        pending = {pid for pid in pending if Path(f"/proc/{pid}").exists()}
        if pending:
            time.sleep(0.01)


def server_cpu(postmaster: int) -> float:
    """CPU seconds used so far by the server: the postmaster, the processes it runs now, and
    (through its ``cutime``/``cstime``) those that exited."""
    main = read_stat(postmaster)
    if main is None:
        raise RuntimeError(f"the postmaster (pid {postmaster}) is gone")
    return main.total + sum(child.total for child in children_of(postmaster))


# -- connections, from pg_stat_activity -------------------------------------------------------

# Client backends connected to the measured database, by application_name, leaving out the
# sampler's own. (A benchmark's statement: pgqueue's own SQL lives in pgqueue/sql/.)
CONNECTIONS = (
    "SELECT application_name, pid FROM pg_stat_activity"
    " WHERE datname = %s AND backend_type = 'client backend' AND pid <> pg_backend_pid()"
)


@dataclass
class ConnectionSampler:
    """A thread reading ``pg_stat_activity`` every ``interval`` seconds on its own connection,
    keeping each application's peak, the peak of all of them at once, and the distinct
    backends each one opened."""

    url: URL
    interval: float = SAMPLE_INTERVAL
    peak: Counter[str] = field(default_factory=Counter)
    peak_total: int = 0
    backends: dict[str, set[int]] = field(default_factory=dict)
    samples: int = 0
    backend_pid: int = 0
    _stop: threading.Event = field(default_factory=threading.Event)
    _ready: threading.Event = field(default_factory=threading.Event)
    _error: BaseException | None = None

    @contextmanager
    def running(self) -> Iterator[ConnectionSampler]:
        thread = threading.Thread(target=self._run, name="connection-sampler", daemon=True)
        thread.start()
        if not self._ready.wait(30):
            raise TimeoutError("the connection sampler did not connect within 30 s")
        try:
            yield self
        finally:
            self._stop.set()
            thread.join(30)
        if self._error is not None:
            raise RuntimeError(f"connection sampler failed: {self._error!r}")

    def _run(self) -> None:
        try:
            with psycopg.connect(libpq(self.url), autocommit=True) as conn:
                self.backend_pid = conn.info.backend_pid
                database = self.url.database
                self._ready.set()
                while True:
                    rows = conn.execute(CONNECTIONS, (database,), prepare=True).fetchall()
                    self._record(rows)
                    # Kept open until the caller has read the server's CPU after the drain,
                    # so the sampler's backend is alive (and measurable) at both readings.
                    if self._stop.wait(self.interval):
                        return
        except BaseException as exc:
            self._error = exc
            self._ready.set()

    def _record(self, rows: Sequence[tuple[str, int]]) -> None:
        now = Counter(name or "(none)" for name, _ in rows)
        for name, count in now.items():
            self.peak[name] = max(self.peak[name], count)
        self.peak_total = max(self.peak_total, sum(now.values()))
        for name, pid in rows:
            self.backends.setdefault(name or "(none)", set()).add(pid)
        self.samples += 1

    def worker_backends(self) -> set[int]:
        """Every backend seen so far but the sampler's own: the measured command's, since the
        database is a fresh one of the drain's alone."""
        return {pid for pids in self.backends.values() for pid in pids}

    def report(self) -> Result:
        return {
            "peak_by_application": dict(sorted(self.peak.items())),
            "peak_total": self.peak_total,
            "opened_by_application": {
                name: len(pids) for name, pids in sorted(self.backends.items())
            },
            "samples": self.samples,
            "interval_s": self.interval,
        }


# -- commits and WAL flushes, from the statistics views ---------------------------------------

# The measured database's committed transactions, and the server's WAL flushes (fsync or
# fdatasync, each one a wait for the disk) and bytes: the commits a job costs, and how many of
# them waited for the disk alone or shared a flush with others (group commit).
WAL_AND_COMMITS = (
    "SELECT d.xact_commit, w.wal_sync, w.wal_bytes::bigint"
    " FROM pg_stat_database AS d, pg_stat_wal AS w WHERE d.datname = %s"
)
# PostgreSQL 18 counts WAL flushes in pg_stat_io (pg_stat_wal lost its wal_sync column).
WAL_AND_COMMITS_18 = (
    "SELECT d.xact_commit,"
    " (SELECT coalesce(sum(fsyncs), 0)::bigint FROM pg_stat_io WHERE object = 'wal'),"
    " (SELECT wal_bytes::bigint FROM pg_stat_wal)"
    " FROM pg_stat_database AS d WHERE d.datname = %s"
)


def wal_and_commits(url: URL) -> tuple[int, int, int]:
    """(commits in ``url``'s database, WAL flushes, WAL bytes) so far."""
    with psycopg.connect(libpq(url), autocommit=True) as conn:
        query = WAL_AND_COMMITS_18 if conn.info.server_version >= 180000 else WAL_AND_COMMITS
        row = conn.execute(query, (url.database,)).fetchone()
    assert row is not None
    return int(row[0]), int(row[1]), int(row[2])


# -- one drain -------------------------------------------------------------------------------


@dataclass(frozen=True)
class DrainCost:
    """What one run of the worker command cost: wall time, CPU seconds, connections."""

    wall_s: float
    worker_cpu_s: float
    server_cpu_s: float | None  # None: the server is not a process of this host
    sampler_cpu_s: float
    connections: Result
    load_avg_before: tuple[float, float, float]
    commits: int  # in the measured database, the sampler's and the readings' own included
    wal_flushes: int
    wal_bytes: int


def drain_cost(url: URL, processes: int, concurrency: int, interval: float) -> DrainCost:
    """Run ``pgqueue worker --processes P --drain`` on ``url`` until it exits, reading the
    server's and the workers' CPU before and after, and sampling connections meanwhile."""
    return command_cost(url, worker_command(concurrency, processes), worker_env(url), interval)


def command_cost(
    url: URL, command: Sequence[str], env: dict[str, str] | None, interval: float
) -> DrainCost:
    """Run ``command`` (a drain of ``url``'s jobs: pgqueue's worker or the raw-SQL one) until
    it exits, reading the server's and the command's CPU before and after, and sampling the
    database's connections meanwhile."""
    sampler = ConnectionSampler(url, interval)
    load_before = os.getloadavg()
    wal_before = wal_and_commits(url)
    with sampler.running():
        postmaster = postmaster_of(sampler.backend_pid)
        sampler_before = read_stat(sampler.backend_pid)
        server_before = server_cpu(postmaster) if postmaster else None
        workers_before = resource.getrusage(resource.RUSAGE_CHILDREN)
        start = time.perf_counter()
        with process(list(command), env) as child:
            code = child.wait(WORKER_TIMEOUT)
            if code != 0:
                raise RuntimeError(f"{' '.join(command[1:4])} exited with {code}")
        wall = time.perf_counter() - start
        # The worker command was waited for, and it waited for its children: their rusage is
        # now in this process's RUSAGE_CHILDREN.
        workers_after = resource.getrusage(resource.RUSAGE_CHILDREN)
        wait_until_reaped(sampler.worker_backends(), REAP_TIMEOUT)
        server_after = server_cpu(postmaster) if postmaster else None
        sampler_after = read_stat(sampler.backend_pid)
    # After the sampler's backend exited: a backend reports its counts at the latest as it ends.
    wal_after = wal_and_commits(url)
    sampler_cpu = (
        sampler_after.own - sampler_before.own if sampler_before and sampler_after else 0.0
    )
    return DrainCost(
        wall_s=wall,
        worker_cpu_s=(workers_after.ru_utime + workers_after.ru_stime)
        - (workers_before.ru_utime + workers_before.ru_stime),
        server_cpu_s=(
            server_after - server_before - sampler_cpu
            if server_before is not None and server_after is not None
            else None
        ),
        sampler_cpu_s=sampler_cpu,
        connections=sampler.report(),
        load_avg_before=load_before,
        commits=wal_after[0] - wal_before[0],
        wal_flushes=wal_after[1] - wal_before[1],
        wal_bytes=wal_after[2] - wal_before[2],
    )


def measure(
    server: Server,
    processes: int,
    jobs: int,
    concurrency: int,
    *,
    task_name: str = app.NOOP,
    task_kwargs: dict[str, Any] | None = None,
    interval: float = SAMPLE_INTERVAL,
) -> Result:
    """Drain ``jobs`` jobs with ``processes`` worker processes of ``concurrency`` slots each on
    a fresh database, measuring throughput, CPU and connections.

    The worker command is first run once on the still empty database: its CPU then is the
    processes' start-up and shut-down (imports, schema check, registry row), which the per-job
    figures leave out (``*_net``), as they would in a worker that runs for days."""
    with server.fresh_database("scale") as url:
        idle = drain_cost(url, processes, concurrency, interval)
        fill_pgqueue(url, jobs, task_name, **(task_kwargs or {}))
        cost = drain_cost(url, processes, concurrency, interval)
        load_after = os.getloadavg()
        result = steady_throughput(jobs, succeeded_after(url, 0), cost.wall_s)
    per_job_ms = 1e6 / jobs  # seconds -> milliseconds per 1,000 jobs

    def net(total: float | None, start_stop: float | None) -> float | None:
        if total is None or start_stop is None:
            return None
        return (total - start_stop) * per_job_ms

    result.update(
        processes=processes,
        concurrency=concurrency,
        task=task_name,
        server_on_this_host=cost.server_cpu_s is not None,
        server_cpu_s=cost.server_cpu_s,
        server_cpu_ms_per_1000=net(cost.server_cpu_s, 0.0),
        server_cpu_ms_per_1000_net=net(cost.server_cpu_s, idle.server_cpu_s),
        worker_cpu_s=cost.worker_cpu_s,
        worker_cpu_ms_per_1000=net(cost.worker_cpu_s, 0.0),
        worker_cpu_ms_per_1000_net=net(cost.worker_cpu_s, idle.worker_cpu_s),
        sampler_cpu_s=cost.sampler_cpu_s,
        start_stop={
            "wall_s": idle.wall_s,
            "worker_cpu_s": idle.worker_cpu_s,
            "server_cpu_s": idle.server_cpu_s,
            "connections": idle.connections,
            "commits": idle.commits,
            "wal_flushes": idle.wal_flushes,
        },
        # CPU seconds per wall second over the whole command: 2.0 is both cores of this box.
        cores_busy=(cost.worker_cpu_s + (cost.server_cpu_s or 0.0)) / cost.wall_s,
        connections=cost.connections,
        # Per 1,000 jobs; the sampler's 50 statements/s count as commits too (``start_stop``
        # has them for a run without jobs).
        commits_per_1000=cost.commits * 1000 / jobs,
        wal_flushes_per_1000=cost.wal_flushes * 1000 / jobs,
        wal_kb_per_1000=cost.wal_bytes / jobs,
        load_avg_before=cost.load_avg_before,
        load_avg_after=load_after,
    )
    return result


# -- the run ---------------------------------------------------------------------------------


def run(
    server: Server,
    processes: Sequence[int],
    jobs: int,
    concurrency: int,
    rounds: int,
    job_ms: float = 0.0,
) -> list[Result]:
    """``rounds`` rounds, each draining once per process count, in order; with ``job_ms``,
    jobs that sleep that long (``benchmarks.app.SLEEP``) instead of no-op jobs."""
    task_name, task_kwargs = (app.SLEEP, {"ms": job_ms}) if job_ms else (app.NOOP, None)
    results = []
    for round_index in range(rounds):
        for count in processes:
            console.log(f"round {round_index + 1}: {count} process(es), {jobs} jobs ...")
            result = measure(
                server, count, jobs, concurrency, task_name=task_name, task_kwargs=task_kwargs
            )
            result["round"] = round_index + 1
            console.log(_line(result))
            results.append(result)
    return results


def _line(result: Result) -> str:
    return (
        f"P={result['processes']}: {result['jobs_per_s']:,.0f} jobs/s, server "
        f"{_gross_net(result, 'server')} ms CPU/1000 jobs, workers "
        f"{_gross_net(result, 'worker')} ms CPU/1000 jobs, peak connections "
        f"{result['connections']['peak_total']} {result['connections']['peak_by_application']}, "
        f"load {result['load_avg_before'][0]:.2f}"
    )


def summarize(results: Sequence[Result]) -> list[Result]:
    """Per process count: the median over rounds of each figure, and the per-round values."""
    rows = []
    for count in dict.fromkeys(r["processes"] for r in results):
        runs = [r for r in results if r["processes"] == count]

        def median(key: str, runs: list[Result] = runs) -> float | None:
            values = [r[key] for r in runs if r.get(key) is not None]
            return statistics.median(values) if values else None

        peaks: Counter[str] = Counter()
        for r in runs:
            for name, value in r["connections"]["peak_by_application"].items():
                peaks[name] = max(peaks[name], value)
        rows.append(
            {
                "processes": count,
                "rounds": len(runs),
                "jobs_per_s": median("jobs_per_s"),
                "jobs_per_s_each": [r["jobs_per_s"] for r in runs],
                "server_cpu_ms_per_1000": median("server_cpu_ms_per_1000"),
                "server_cpu_ms_per_1000_net": median("server_cpu_ms_per_1000_net"),
                "worker_cpu_ms_per_1000": median("worker_cpu_ms_per_1000"),
                "worker_cpu_ms_per_1000_net": median("worker_cpu_ms_per_1000_net"),
                "commits_per_1000": median("commits_per_1000"),
                "wal_flushes_per_1000": median("wal_flushes_per_1000"),
                "cores_busy": median("cores_busy"),
                "peak_connections": max(r["connections"]["peak_total"] for r in runs),
                "peak_by_application": dict(sorted(peaks.items())),
                "load_avg_1min": [r["load_avg_before"][0] for r in runs],
                "ok": all(r["ok"] for r in runs),
            }
        )
    return rows


def _number(value: float | None, digits: int = 0) -> str:
    return "n/a" if value is None else f"{value:,.{digits}f}"


def _gross_net(row: Result, side: str) -> str:
    """``gross (net of start-up and shut-down)`` for one side's CPU per 1,000 jobs."""
    key = f"{side}_cpu_ms_per_1000"
    return f"{_number(row[key])} ({_number(row[key + '_net'])})"


def print_table(rows: Sequence[Result], title: str) -> None:
    table = Table(title=title)
    for column in (
        "processes",
        "jobs/s (median)",
        "jobs/s per round",
        "server CPU ms / 1,000 jobs (net)",
        "worker CPU ms / 1,000 jobs (net)",
        "cores busy",
        "commits / WAL flushes per 1,000 jobs",
        "peak connections",
        "load (1 min)",
    ):
        table.add_column(column, justify="right")
    for row in rows:
        table.add_row(
            str(row["processes"]),
            _number(row["jobs_per_s"]),
            ", ".join(_number(v) for v in row["jobs_per_s_each"]),
            _gross_net(row, "server"),
            _gross_net(row, "worker"),
            _number(row["cores_busy"], 2),
            f"{_number(row['commits_per_1000'])} / {_number(row['wal_flushes_per_1000'])}",
            f"{row['peak_connections']} {row['peak_by_application']}",
            ", ".join(f"{v:.1f}" for v in row["load_avg_1min"]),
        )
    console.print(table)


def markdown_table(rows: Sequence[Result]) -> str:
    lines = [
        "| processes | jobs/s (median) | per round | server CPU ms / 1,000 jobs (net) "
        "| worker CPU ms / 1,000 jobs (net) | cores busy | commits / WAL flushes per 1,000 jobs "
        "| peak connections (by application) | load (1 min) |",
        "|---:|---:|---:|---:|---:|---:|---:|---|---|",
    ]
    for row in rows:
        apps = ", ".join(f"{name} {count}" for name, count in row["peak_by_application"].items())
        lines.append(
            f"| {row['processes']} | {_number(row['jobs_per_s'])} "
            f"| {' / '.join(_number(v) for v in row['jobs_per_s_each'])} "
            f"| {_gross_net(row, 'server')} "
            f"| {_gross_net(row, 'worker')} | {_number(row['cores_busy'], 2)} "
            f"| {_number(row['commits_per_1000'])} / {_number(row['wal_flushes_per_1000'])} "
            f"| {row['peak_connections']} ({apps}) "
            f"| {' / '.join(f'{v:.1f}' for v in row['load_avg_1min'])} |"
        )
    return "\n".join(lines)


def _counts(text: str) -> list[int]:
    try:
        counts = [int(part) for part in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected comma-separated positive integers, got {text!r}"
        ) from None
    if not counts or any(count < 1 for count in counts):
        raise argparse.ArgumentTypeError(
            f"expected comma-separated positive integers, got {text!r}"
        )
    return counts


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return value


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.scaling", description=__doc__)
    parser.add_argument("--processes", type=_counts, default=[1, 2, 4, 8])
    parser.add_argument("--jobs", type=_positive, default=40_000)
    parser.add_argument("--concurrency", type=_positive, default=10)
    parser.add_argument("--rounds", type=_positive, default=1)
    parser.add_argument(
        "--job-ms",
        type=float,
        default=0.0,
        help="jobs that sleep this many milliseconds (handlers waiting on I/O); 0: no-op jobs",
    )
    parser.add_argument("--json", dest="json_path", default=None, help="also write JSON here")
    parser.add_argument(
        "--database-url",
        default=os.environ.get("PGQUEUE_DATABASE_URL"),
        help="a server on this host (default $PGQUEUE_DATABASE_URL, else a durable embedded one)",
    )
    args = parser.parse_args(argv)
    started = time.perf_counter()
    report: Result = {
        "mode": "scaling",
        "started_at": dt.datetime.now(dt.UTC).isoformat(),
        "machine": machine(),
        "jobs": args.jobs,
        "concurrency": args.concurrency,
        "processes": args.processes,
        "rounds": args.rounds,
        "job_ms": args.job_ms,
    }
    with server_module.start(args.database_url) as srv:
        report["server"] = {"embedded": srv.embedded, **srv.settings()}
        console.log(f"server: {report['server']}")
        report["results"] = run(
            srv, args.processes, args.jobs, args.concurrency, args.rounds, args.job_ms
        )
    report["summary"] = summarize(report["results"])
    report["elapsed_s"] = time.perf_counter() - started
    kind = f"{args.job_ms:g} ms sleeping" if args.job_ms else "no-op"
    title = (
        f"{args.jobs:,} {kind} jobs, concurrency {args.concurrency} per process, "
        f"server {report['server']['server_version']}"
    )
    print_table(report["summary"], title)
    print(markdown_table(report["summary"]))
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    stamp = dt.datetime.now().strftime("%Y%m%dT%H%M%S")
    path = RESULTS_DIR / f"{stamp}-scaling.json"
    text = json.dumps(report, indent=2, default=str)
    path.write_text(text)
    if args.json_path:
        Path(args.json_path).write_text(text)
    console.log(f"took {report['elapsed_s']:.0f} s; JSON: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
