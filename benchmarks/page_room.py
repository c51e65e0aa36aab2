"""What room on each page of ``pgqueue_jobs`` changes: WAL records per job and the table's size.

``python -m benchmarks.page_room [--jobs 30000] [--cycles 4] [--fillfactor 100 --fillfactor 50
...]`` on ``$PGQUEUE_DATABASE_URL`` (or a durable embedded server). For each fillfactor, on a
fresh database migrated to pgqueue's head and set to it (``ALTER TABLE ... SET (fillfactor)``):
``--cycles`` times, enqueue ``--jobs`` no-op jobs (``enqueue_many``), drain them with one worker
process (``pgqueue worker --drain``), then ``VACUUM`` the table, as autovacuum would between
busy spells. The first cycle's drain is read with ``pg_walinspect`` (created in the scratch
database; a superuser's server): the drain's WAL records per job by kind (a heap ``LOCK`` record
precedes every update whose new version leaves its page) and its bytes per job. After each
cycle the table's size in pages is read. On a server without ``pg_walinspect`` (PostgreSQL 14)
the record kinds are left out. Prints a Markdown table and writes the JSON to
``benchmarks/results/<timestamp>-page-room.json``.

A measurement for the schema decisions of ``benchmarks.schema_bounds``'s fillfactor variants,
not a throughput benchmark: the drains are not timed against a ceiling.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from typing import Any

import psycopg
from sqlalchemy.engine import URL

from benchmarks.run import standalone, write_json
from benchmarks.server import Server, libpq
from benchmarks.workloads import fill_pgqueue, worker_command, worker_env

# The drain's WAL by record kind, per job: count and bytes (full-page images included).
WAL_KINDS = """SELECT "resource_manager/record_type", count, combined_size
FROM pg_get_wal_stats(%s, %s, true) WHERE count > 0 ORDER BY combined_size DESC"""
# Where the next WAL record goes: unlike ``pg_current_wal_lsn`` (what was written out), it
# counts a drain's records at once on a server without synchronous commits (the test server's).
WAL_INSERTED = "SELECT pg_current_wal_insert_lsn()"
FLUSH_WAL = (
    "SELECT set_config('synchronous_commit', 'on', true),"
    " pg_logical_emit_message(true, 'pgqueue.page_room', '')"
)
SIZE = "SELECT pg_relation_size('pgqueue_jobs'), current_setting('block_size')::int"
# PostgreSQL 14 has no pg_walinspect: there the kinds are left empty (the bytes are core).
AVAILABLE = "SELECT count(*) FROM pg_available_extensions WHERE name = 'pg_walinspect'"


def _drain(url: URL) -> None:
    subprocess.run(worker_command(10), env=worker_env(url), check=True, capture_output=True)


def _wal_read(
    conn: psycopg.Connection[Any], start: str, jobs: int, walinspect: bool
) -> tuple[float, dict[str, dict[str, float]]]:
    """The WAL written since ``start``: bytes per job, and per record kind (when
    ``pg_walinspect`` is there) records and bytes per job."""
    end = conn.execute(WAL_INSERTED).fetchone()[0]
    # pg_walinspect reads WAL from disk, and on a server without synchronous commits the
    # drain's last records may not be flushed yet. A transaction that writes WAL and commits
    # synchronously flushes them (its own records come after ``end``). Not a checkpoint: that
    # lets a busy server remove the segment where ``start`` is.
    with conn.transaction():
        conn.execute(FLUSH_WAL)
    written = conn.execute("SELECT pg_wal_lsn_diff(%s, %s)", (end, start)).fetchone()[0]
    kinds = conn.execute(WAL_KINDS, (start, end)).fetchall() if walinspect else []
    by_kind = {kind: {"per_job": n / jobs, "bytes_per_job": size / jobs} for kind, n, size in kinds}
    return float(written) / jobs, by_kind


def measure(server: Server, fillfactor: int, jobs: int, cycles: int) -> dict[str, Any]:
    """Cycles of fill, drain and VACUUM at ``fillfactor``: the first drain's WAL per job by
    kind, and the table's pages after each cycle."""
    with server.fresh_database(f"room{fillfactor}") as url:
        with psycopg.connect(libpq(url), autocommit=True) as conn:
            walinspect = bool(conn.execute(AVAILABLE).fetchone()[0])
            if walinspect:
                conn.execute("CREATE EXTENSION IF NOT EXISTS pg_walinspect")
            # A literal: ALTER TABLE takes no parameters (an int from argparse).
            conn.execute(f"ALTER TABLE pgqueue_jobs SET (fillfactor = {int(fillfactor)})")
        wal_bytes, wal = 0.0, {}
        pages: list[int] = []
        for cycle in range(cycles):
            fill_pgqueue(url, jobs)
            with psycopg.connect(libpq(url), autocommit=True) as conn:
                conn.execute("CHECKPOINT")  # the fill's pages written before the drain
                start = conn.execute(WAL_INSERTED).fetchone()[0]
            _drain(url)
            with psycopg.connect(libpq(url), autocommit=True) as conn:
                if cycle == 0:
                    wal_bytes, wal = _wal_read(conn, start, jobs, walinspect)
                conn.execute("VACUUM pgqueue_jobs")
                size, block = conn.execute(SIZE).fetchone()
                pages.append(size // block)
    return {
        "fillfactor": fillfactor,
        "jobs_per_cycle": jobs,
        "wal_bytes_per_job": wal_bytes,
        "wal": wal,
        "pages_after_cycle": pages,
        "bytes_per_job_kept": size / (jobs * cycles),
    }


def markdown_table(results: list[dict[str, Any]]) -> str:
    lines = [
        "| fillfactor | drain WAL bytes/job | heap LOCK records/job | heap UPDATE records/job"
        " | pages after each cycle | bytes per finished job kept |",
        "|---:|---:|---:|---:|---|---:|",
    ]
    for r in results:
        lock = r["wal"].get("Heap/LOCK", {}).get("per_job", 0.0)
        update = r["wal"].get("Heap/UPDATE", {}).get("per_job", 0.0)
        pages = ", ".join(f"{p:,}" for p in r["pages_after_cycle"])
        lines.append(
            f"| {r['fillfactor']} | {r['wal_bytes_per_job']:,.0f} | {lock:.2f} | {update:.2f}"
            f" | {pages} | {r['bytes_per_job_kept']:,.0f} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.page_room")
    parser.add_argument("--jobs", type=int, default=30_000)
    parser.add_argument("--cycles", type=int, default=4)
    parser.add_argument("--fillfactor", type=int, action="append", dest="fillfactors")
    args = parser.parse_args(argv)
    fillfactors = args.fillfactors or [100, 70, 50]
    if any(not 10 <= f <= 100 for f in fillfactors):
        parser.error("a fillfactor is a percentage from 10 to 100")
    report = standalone(
        lambda server, a: {"rows": [measure(server, f, a.jobs, a.cycles) for f in fillfactors]},
        args,
    )
    report["mode"] = "page-room"
    print(markdown_table(report["rows"]))
    print(f"JSON: {write_json(report, None)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
