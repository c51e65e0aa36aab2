"""What ``pgqueue_0025`` costs the writers of ``pgqueue_jobs``, online and in a caller's transaction.

``python -m benchmarks.migration_online [--jobs 1000000] [--rounds 1]`` on
``$PGQUEUE_DATABASE_URL`` (or a durable embedded server) fills a scratch database at
``pgqueue_0024`` with ``--jobs`` jobs (1 in 10 queued, the rest succeeded), then, while another
connection inserts one job at a time into ``pgqueue_jobs`` (autocommit, as an enqueue commits),
runs 0025's upgrade and its downgrade back to 0024 two ways:

- ``pgqueue migrate``: the command as a user runs it (a subprocess), which lets Alembic own the
  transaction, so the state indexes are built ``CONCURRENTLY``;
- ``migrations.upgrade(connection)`` in a caller's transaction (as a host's revision calls it):
  the indexes are built in that transaction, and the writes wait for the builds.

For each it reports the seconds the step took (for ``pgqueue migrate``, the whole command, of
which ``command_startup_s`` is what ``pgqueue migrate current`` takes) and the longest single
insert meanwhile (and how many went through). Prints a Markdown table and writes the JSON to
``benchmarks/results/<timestamp>-migration-online.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import psycopg
from sqlalchemy import create_engine
from sqlalchemy.engine import URL

from benchmarks import server as server_module
from benchmarks.run import RESULTS_DIR, arguments, machine
from benchmarks.server import libpq, sqlalchemy_url
from pgqueue import migrations

FILL = (
    "INSERT INTO pgqueue_jobs (task_name, queue, state)"
    " SELECT 'bench.task', 'q' || (i %% 4),"
    " CASE WHEN i %% 10 = 0 THEN 'queued' ELSE 'succeeded' END"
    " FROM generate_series(1, %s) AS i"
)
ENQUEUE = "INSERT INTO pgqueue_jobs (task_name, queue) VALUES ('bench.writer', 'q0')"


class Writer:
    """Inserts one job at a time on a connection of its own until stopped; keeps the longest
    insert and how many it made."""

    def __init__(self, url: URL) -> None:
        self.url = url
        self.longest = 0.0
        self.count = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Writer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=60)

    def _run(self) -> None:
        with psycopg.connect(libpq(self.url), autocommit=True) as conn:
            while not self._stop.is_set():
                started = time.perf_counter()
                conn.execute(ENQUEUE)
                self.longest = max(self.longest, time.perf_counter() - started)
                self.count += 1
                time.sleep(0.005)


def pgqueue_migrate(url: URL, *args: str) -> None:
    environment = {k: v for k, v in os.environ.items() if not k.startswith("PGQUEUE_")}
    environment["PGQUEUE_DATABASE_URL"] = sqlalchemy_url(url)
    subprocess.run(
        [sys.executable, "-m", "pgqueue", "migrate", *args],
        env=environment,
        check=True,
        capture_output=True,
        text=True,
    )


def in_caller_transaction(url: URL, action: str) -> None:
    engine = create_engine(sqlalchemy_url(url))
    try:
        with engine.begin() as connection:
            if action == "upgrade":
                migrations.upgrade(connection)
            else:
                migrations.downgrade(connection, "pgqueue_0024")
    finally:
        engine.dispose()


def timed(url: URL, step: Callable[[], None]) -> dict[str, Any]:
    with Writer(url) as writer:
        time.sleep(0.5)  # the writer's own warm-up is not the migration's doing
        started = time.perf_counter()
        step()
        seconds = time.perf_counter() - started
        time.sleep(0.2)
    return {"seconds": seconds, "longest_insert_s": writer.longest, "inserts": writer.count}


def measure(server: server_module.Server, jobs: int) -> list[dict[str, Any]]:
    results = []
    with server.fresh_database("migration_online", migrate=False) as url:
        engine = create_engine(sqlalchemy_url(url))
        try:
            with engine.begin() as connection:
                migrations.upgrade(connection, "pgqueue_0024")
        finally:
            engine.dispose()
        with psycopg.connect(libpq(url), autocommit=True) as conn:
            conn.execute(FILL, [jobs])
            conn.execute("VACUUM ANALYZE pgqueue_jobs")
        ways: dict[str, Callable[[str], None]] = {
            "pgqueue migrate": lambda action: (
                pgqueue_migrate(url)
                if action == "upgrade"
                else pgqueue_migrate(url, "downgrade", "pgqueue_0024")
            ),
            "migrations.upgrade(connection) in a caller's transaction": lambda action: (
                in_caller_transaction(url, action)
            ),
        }
        started = time.perf_counter()
        pgqueue_migrate(url, "current")
        # What the command costs before it migrates anything (Python, imports, connecting).
        startup = time.perf_counter() - started
        for way, run in ways.items():
            for action in ("upgrade", "downgrade"):
                result = timed(url, lambda: run(action))  # noqa: B023 - called at once
                result.update(way=way, action=action, jobs=jobs)
                if way == "pgqueue migrate":
                    result["command_startup_s"] = startup
                print(json.dumps(result), flush=True)
                results.append(result)
    return results


def markdown_table(results: list[dict[str, Any]]) -> str:
    """Per way: the median seconds of each step over the rounds, and the longest insert seen
    in any round."""
    lines = [
        "| how it runs | upgrade | downgrade | longest insert meanwhile (up / down) |",
        "|---|---:|---:|---:|",
    ]
    for way in dict.fromkeys(r["way"] for r in results):
        cells = []
        longest = []
        for action in ("upgrade", "downgrade"):
            mine = [r for r in results if r["way"] == way and r["action"] == action]
            cells.append(f"{statistics.median(r['seconds'] for r in mine):.2f} s")
            longest.append(f"{max(r['longest_insert_s'] for r in mine) * 1000:.0f} ms")
        lines.append(f"| {way} | {cells[0]} | {cells[1]} | {' / '.join(longest)} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.migration_online")
    parser.add_argument("--jobs", type=int, default=1_000_000)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--database-url", default=os.environ.get("PGQUEUE_DATABASE_URL"))
    args = parser.parse_args(argv)
    results: list[dict[str, Any]] = []
    with server_module.start(args.database_url) as server:
        settings = server.settings()
        for round_number in range(1, args.rounds + 1):
            for result in measure(server, args.jobs):
                result["round"] = round_number
                results.append(result)
    print(markdown_table(results))
    report = {
        "workload": "migration-online",
        "arguments": arguments(args),
        "machine": machine(),
        "server": settings,
        "embedded": server.embedded,
        "results": results,
    }
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%S")
    path = RESULTS_DIR / f"{stamp}-migration-online.json"
    path.write_text(json.dumps(report, indent=2, default=str))
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
