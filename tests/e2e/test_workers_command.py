"""``pgqueue workers`` against real worker processes: it lists the running ones, drops a
SIGKILLed one once it goes stale, and a SIGTERMed one at once; ``--processes N`` children each
appear."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import time
from typing import TYPE_CHECKING, Any

from support.cli_invoke import invoke

from pgqueue import PgQueue, Settings

if TYPE_CHECKING:
    from conftest import App

# Short enough for a quick test, long enough that a busy machine never misses a refresh (the
# workers refresh three times within it).
STALE = {"worker_stale_seconds": 4, "rescue_interval": 0.3}


def pgqueue_cli(app: App, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "pgqueue", *args, "--database-url", app.url_string],
        cwd=app.directory,
        env=app.env(**STALE),
        capture_output=True,
        text=True,
        timeout=60,
    )


def listed(app: App, *extra: str) -> dict[int, dict[str, Any]]:
    """``pgqueue workers --json``: the workers listed, by pid (run in this process: the waits
    below ask again and again, and the table above runs the real command)."""
    done = invoke(
        ["-m", "pgqueue", "workers", "--json", *extra, "--database-url", app.url_string],
        env=app.env(**STALE),
        cwd=app.directory,
    )
    assert done.returncode == 0, done.stderr
    return {worker["pid"]: worker for worker in json.loads(done.stdout)}


def listed_when(app: App, count: int) -> dict[int, dict[str, Any]] | None:
    found = listed(app)
    return found if len(found) == count else None


def test_workers_lists_two_workers_and_drops_a_killed_one_once_stale(app: App) -> None:
    first = app.start_worker(
        "--queues", "default,mail", "--concurrency", "3", "--shutdown-timeout", "1", **STALE
    )
    second = app.start_worker("--queues", "reports", "--concurrency", "5", **STALE)
    both = app.wait_until(lambda: listed_when(app, 2), 30, "two workers listed")
    assert set(both) == {first.pid, second.pid}
    host = socket.gethostname()
    assert {
        (w["host"], tuple(w["queues"]), w["concurrency"], w["live"]) for w in both.values()
    } == {
        (host, ("default", "mail"), 3, True),
        (host, ("reports",), 5, True),
    }
    assert both[first.pid]["id"].startswith(f"{host}:{first.pid}:")
    assert {w["pool"] for w in both.values()} == {"thread"}  # the default pool, recorded

    # The plain table names both, in full (output is not a terminal: no cut columns).
    table = pgqueue_cli(app, "workers")
    assert table.returncode == 0, table.stderr
    for worker in both.values():
        assert worker["id"] in table.stdout
    assert "default,mail" in table.stdout and "reports" in table.stdout

    # A running job names its worker (``pgqueue show``), which counts it as running.
    [job_id] = app.module.sleep.enqueue_many([{"seconds": 60}])
    app.wait_until(lambda: app.ledger("start"), 30, "the job to start")
    shown = pgqueue_cli(app, "show", str(job_id), "--json")
    assert shown.returncode == 0, shown.stderr
    holder = json.loads(shown.stdout)["worker"]
    assert (holder["id"], holder["pid"], holder["host"], holder["live"]) == (
        both[first.pid]["id"],
        first.pid,
        host,
        True,
    )
    assert {pid: w["running"] for pid, w in listed(app).items()} == {first.pid: 1, second.pid: 0}

    # Still listed while its last heartbeat is recent: only going stale removes it. Read the way
    # the command reads it, in this process: starting the command can take longer than the
    # stale period on a busy machine.
    reader = PgQueue(
        app.url_string, settings=Settings(worker_stale_seconds=STALE["worker_stale_seconds"])
    )
    try:
        second.signal(signal.SIGKILL)
        assert second.wait(10) == -signal.SIGKILL
        assert second.pid in {worker.pid for worker in reader.admin.list_workers()}
    finally:
        reader.dispose()
    app.wait_until(lambda: set(listed(app)) == {first.pid}, 30, "the killed worker to go")
    # And the survivor's maintenance deleted its row.
    app.wait_until(
        lambda: app.scalars("SELECT pid FROM pgqueue_workers") == [first.pid],
        30,
        "the stale row to be deleted",
    )
    assert listed(app, "--all").keys() == {first.pid}

    first.signal(signal.SIGTERM)
    assert first.wait(30) == 0
    assert app.scalars("SELECT count(*) FROM pgqueue_workers") == [0]
    assert listed(app, "--all") == {}


def test_each_child_of_a_process_group_registers(app: App) -> None:
    group = app.start_worker("--processes", "2", "--concurrency", "2", **STALE)
    children = app.wait_until(
        lambda: kids if len(kids := app.children_of(group.pid)) == 2 else None, 30, "two children"
    )
    app.wait_until(lambda: set(listed(app)) == set(children), 30, "both children listed")
    group.signal(signal.SIGTERM)
    assert group.wait(30) == 0
    assert listed(app, "--all") == {}


def test_one_elected_worker_reads_the_queue_gauges_and_another_takes_over(app: App) -> None:
    from test_worker_metrics import free_port, scrape, table_counts

    def figures(port: int) -> dict[tuple[str, str], float]:
        """The worker's non-zero ``pgqueue_queue_jobs`` samples."""
        return {
            (dict(labels)["queue"], dict(labels)["state"]): value
            for labels, value in scrape(port).get("pgqueue_queue_jobs", {}).items()
            if value
        }

    fast = {**STALE, "metrics_interval": 0.2}
    ports = {}
    for _ in range(2):
        port = free_port()
        ports[app.start_worker("--metrics-port", str(port), **fast).pid] = port
    workers = app.wait_until(lambda: listed_when(app, 2), 30, "two workers listed")
    # The live worker with the smallest id reads; the other never shows a reading.
    elected, other = sorted(workers, key=lambda pid: workers[pid]["id"])
    ids = app.module.record.enqueue_many([{}] * 7)
    app.wait_final(ids, timeout=30)
    expected = table_counts(app)
    assert expected == {("default", "succeeded"): 7}
    app.wait_until(lambda: figures(ports[elected]) == expected, 30, "the elected one's reading")
    for _ in range(5):  # a few more rounds of both workers' gauge threads
        time.sleep(0.3)
        assert figures(ports[other]) == {}

    [process] = [p for p in app.processes if p.pid == elected]
    process.signal(signal.SIGTERM)
    assert process.wait(30) == 0
    app.wait_until(lambda: figures(ports[other]) == expected, 30, "the other worker's reading")
