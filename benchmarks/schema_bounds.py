"""How far a leaner ``pgqueue_jobs`` could take the drain, the bulk and the single enqueue and
the pick-up: an upper bound.

``python -m benchmarks.schema_bounds [--rounds 3] [--jobs 60000] [--bulk 50000]
[--single 1000] [--pickup 300] [--concurrency 10] [--processes 1] [--threads 4] [--batch 200]
[--variant NAME ...]`` on ``$PGQUEUE_DATABASE_URL`` (or a durable embedded server) runs
pgqueue's drain, its bulk and single enqueues and its pick-up on scratch databases whose jobs
table is cut down step by step (``VARIANTS``), beside the raw-SQL ceiling of the same round:

- ``as shipped``: pgqueue's schema;
- ``as shipped, fillfactor 70`` and ``50``: the same with room left on each page, so the claim's
  and the outcome's new versions of a job row can stay on its page (no index is dropped, so
  neither update is heap-only);
- ``no dashboard indexes``: without ``(queue, state, id)`` and ``(task_name, state, id)``;
- ``state indexes holding running jobs``: those two without their predicate (``state <>
  'running'``), as before migration ``pgqueue_0025``, so a claim writes into them;
- ``claim-batch lease rows``: without the lease index, each claim statement recording its jobs
  in one row of a lease table instead, so a claim's update of a job row writes only the
  primary key's entry;
- ``primary key only``: without any secondary index on ``pgqueue_jobs`` (the tickets keep
  theirs: the claim needs them);
- ``primary key only, HOT``: the same with ``fillfactor = 40``, so the claim's and the
  outcome's updates of a job row can stay on its page (heap-only tuples, no index entry);
- ``unchanging-column indexes, HOT``: that, plus indexes only on columns no state change
  touches (``(queue, id)``, ``(task_name, id)``, the concurrency key), as a schema that keeps
  the dashboard's walks could;
- ``live-table design ...``: a design that keeps every feature's index (lease rows in a table
  of their own, a unique key index whose predicate names no state), with the finished-at index
  dropped, kept, or replaced by a log of ended jobs, or with finished jobs moved out at once.

The variants drop indexes that pgqueue's features read (the dashboard's filters and a bounded
queue's depth, the rescuer's lease scan, unique keys, the idle key cleanup), so none is a configuration to run: they
measure what the worker and the enqueue path would reach if the schema cost nothing more than
its primary keys. Each round drains ``--jobs`` no-op jobs once per variant (``pgqueue
worker --drain --concurrency C --processes P``, success lines off) and once with the ceiling
(``--threads`` x ``--batch``), reading the server's and the drain's CPU from ``/proc``
(``benchmarks.scaling``), per job net of the same command run first on the empty database
(start-up and stop), then enqueues ``--bulk`` jobs with ``enqueue_many`` per variant, each
against a raw ``COPY`` of as many rows, as the suite's bulk workload does
(``benchmarks.workloads.enqueue_batch``), then makes ``--single`` single enqueues per variant
(``task.enqueue``, a transaction each; ``--single 0`` leaves them out) against as many
single-row inserts, as the suite's enqueue1 does (``benchmarks.workloads.enqueue1``), and
times ``--pickup`` pick-ups per variant on an idle listening worker against the faster of the
two bare ``LISTEN`` loops of the same round, as the suite's latency workload does
(``--pickup 0`` leaves them out). Ratios are medians of the per-round ratios. Prints a
Markdown table and writes the JSON to ``benchmarks/results/<timestamp>-schema-bounds.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import psycopg
from sqlalchemy.engine import URL

from benchmarks import baseline
from benchmarks import server as server_module
from benchmarks.run import RESULTS_DIR, arguments, machine
from benchmarks.scaling import SAMPLE_INTERVAL, command_cost
from benchmarks.server import Server, libpq
from benchmarks.workloads import (
    enqueue1,
    enqueue_batch,
    fill_pgqueue,
    latency_baseline,
    latency_pgqueue,
    steady_throughput,
    succeeded_after,
    worker_command,
    worker_env,
)

Result = dict[str, Any]

_SECONDARY = (
    "DROP INDEX ix_pgqueue_jobs_lease_expires_at",
    "DROP INDEX ix_pgqueue_jobs_finished_at",
    "DROP INDEX uq_pgqueue_jobs_unique_key_active",
    "DROP INDEX ix_pgqueue_jobs_concurrency_key",
    "DROP INDEX ix_pgqueue_jobs_workflow_id",
)
_DASHBOARD = (
    "DROP INDEX ix_pgqueue_jobs_queue_state_id",
    "DROP INDEX ix_pgqueue_jobs_task_name_state_id",
)
_LIVE_TABLE = (
    *_DASHBOARD,
    *_SECONDARY,
    "CREATE INDEX ix_bounds_queue_id ON pgqueue_jobs (queue, id)",
    "CREATE INDEX ix_bounds_task_name_id ON pgqueue_jobs (task_name, id)",
    "CREATE INDEX ix_bounds_concurrency_key ON pgqueue_jobs (concurrency_key)"
    " WHERE concurrency_key IS NOT NULL",
    "CREATE INDEX ix_bounds_workflow_id ON pgqueue_jobs (workflow_id)"
    " WHERE workflow_id IS NOT NULL",
    "CREATE UNIQUE INDEX uq_bounds_unique_key ON pgqueue_jobs (unique_key)"
    " WHERE unique_key IS NOT NULL",
    "ALTER TABLE pgqueue_jobs SET (fillfactor = 40)",
    "CREATE TABLE bounds_leases (job_id bigint PRIMARY KEY, owner text NOT NULL,"
    " token uuid NOT NULL, expires_at timestamptz NOT NULL)",
    "CREATE INDEX ix_bounds_leases_expires_at ON bounds_leases (expires_at)",
    """CREATE FUNCTION bounds_leases_written() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
        DELETE FROM bounds_leases l USING changed_new n
        WHERE l.job_id = n.id AND n.state <> 'running';
        INSERT INTO bounds_leases (job_id, owner, token, expires_at)
        SELECT n.id, n.lease_owner, n.lease_token, n.lease_expires_at
        FROM changed_new n JOIN changed_old o ON o.id = n.id
        WHERE n.state = 'running' AND o.state <> 'running';
        RETURN NULL;
    END $$""",
    "CREATE TRIGGER bounds_leases_written AFTER UPDATE ON pgqueue_jobs"
    " REFERENCING OLD TABLE AS changed_old NEW TABLE AS changed_new"
    " FOR EACH STATEMENT EXECUTE FUNCTION bounds_leases_written()",
)
# What serves the finished-at order once the job row's index on it is gone: an insert-only log
# of ended jobs, one row per job written by the statement that ends it (here by a
# statement-level trigger, so a bound from below), with block-range indexes, which an update
# of a job row never writes: on the log's finish time for the pruning and the history's moves,
# and on the job's unchanging ``created_at`` for a prune's walk of the oldest jobs.
_ENDED_LOG = (
    "CREATE TABLE bounds_ended (job_id bigint NOT NULL, finished_at timestamptz NOT NULL)",
    "CREATE INDEX ix_bounds_ended_finished_at ON bounds_ended USING brin (finished_at)",
    "CREATE INDEX ix_bounds_jobs_created_at ON pgqueue_jobs USING brin (created_at)",
    """CREATE FUNCTION bounds_ended_written() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
        INSERT INTO bounds_ended (job_id, finished_at)
        SELECT n.id, n.finished_at FROM changed_new n JOIN changed_old o ON o.id = n.id
        WHERE n.finished_at IS NOT NULL AND o.finished_at IS NULL;
        RETURN NULL;
    END $$""",
    "CREATE TRIGGER bounds_ended_written AFTER UPDATE ON pgqueue_jobs"
    " REFERENCING OLD TABLE AS changed_old NEW TABLE AS changed_new"
    " FOR EACH STATEMENT EXECUTE FUNCTION bounds_ended_written()",
)
# The rest of what the live-table design needs for the dashboard's state filters and a bounded
# queue's depth, none of it written by a claim's or a success's update: waiting tickets listed
# per queue, and the rare outcomes (failed, cancelled) flagged in a column that a success never
# changes, with partial indexes on the queue's and the task's jobs so flagged.
_LIVE_LISTS = (
    "CREATE INDEX ix_bounds_tickets_queue ON pgqueue_message_queue (queue, job_id)",
    "ALTER TABLE pgqueue_jobs ADD COLUMN bounds_rare boolean NOT NULL DEFAULT false",
    "CREATE INDEX ix_bounds_rare_queue ON pgqueue_jobs (queue, id) WHERE bounds_rare",
    "CREATE INDEX ix_bounds_rare_task ON pgqueue_jobs (task_name, id) WHERE bounds_rare",
)
# Everything the live-table design needs to keep each feature's proof.
_EVERY_STRUCTURE = (*_LIVE_TABLE, *_ENDED_LOG, *_LIVE_LISTS)
# Name -> the statements that turn a migrated database into the variant.
VARIANTS: dict[str, tuple[str, ...]] = {
    "as shipped": (),
    # Every index kept, room left on each page: an update whose new version fits on the old
    # one's page writes no lock record first and dirties one page, not two.
    "as shipped, fillfactor 70": ("ALTER TABLE pgqueue_jobs SET (fillfactor = 70)",),
    "as shipped, fillfactor 50": ("ALTER TABLE pgqueue_jobs SET (fillfactor = 50)",),
    "no dashboard indexes": _DASHBOARD,
    # The dashboard's indexes holding running jobs too, as before migration pgqueue_0025: the
    # claim's update then writes four index entries (the primary key's, both of these, the
    # lease index's) instead of two.
    "state indexes holding running jobs": (
        *_DASHBOARD,
        "CREATE INDEX ix_pgqueue_jobs_queue_state_id ON pgqueue_jobs (queue, state, id)",
        "CREATE INDEX ix_pgqueue_jobs_task_name_state_id ON pgqueue_jobs (task_name, state, id)",
    ),
    # The first step of a schema whose state changes write no index: the lease index gone from
    # the job row, each claim statement recording its jobs in one lease row (its ids as an
    # array, indexed by expiry) for the rescue to start from. The row is written here by a
    # statement-level trigger over the claim's transition table: one insert per claim, as a
    # CTE of the claim would write it. The trigger also fills a transition table for every
    # outcome and heartbeat statement, which a CTE would not: a bound from below.
    "claim-batch lease rows": (
        "DROP INDEX ix_pgqueue_jobs_lease_expires_at",
        "CREATE TABLE bounds_claims (id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,"
        " owner text NOT NULL, due_at timestamptz NOT NULL, job_ids bigint[] NOT NULL)",
        "CREATE INDEX ix_bounds_claims_due_at ON bounds_claims (due_at)",
        """CREATE FUNCTION bounds_claims_written() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
            INSERT INTO bounds_claims (owner, due_at, job_ids)
            SELECT min(n.lease_owner), min(n.lease_expires_at), array_agg(n.id)
            FROM changed_new n WHERE n.state = 'running' AND n.started_at = now()
            HAVING count(*) > 0;
            RETURN NULL;
        END $$""",
        "CREATE TRIGGER bounds_claims_written AFTER UPDATE ON pgqueue_jobs"
        " REFERENCING NEW TABLE AS changed_new"
        " FOR EACH STATEMENT EXECUTE FUNCTION bounds_claims_written()",
    ),
    "primary key only": _DASHBOARD + _SECONDARY,
    "primary key only, HOT": (
        *_DASHBOARD,
        *_SECONDARY,
        "ALTER TABLE pgqueue_jobs SET (fillfactor = 40)",
    ),
    # What a schema could keep and still update a job row without index writes: indexes on
    # columns no state change touches, with no state in their predicates (the dashboard's
    # queue and task walks in id order, the concurrency key's), and room on the page.
    "unchanging-column indexes, HOT": (
        *_DASHBOARD,
        *_SECONDARY,
        "CREATE INDEX ix_bounds_queue_id ON pgqueue_jobs (queue, id)",
        "CREATE INDEX ix_bounds_task_name_id ON pgqueue_jobs (task_name, id)",
        "CREATE INDEX ix_bounds_concurrency_key ON pgqueue_jobs (concurrency_key)"
        " WHERE concurrency_key IS NOT NULL",
        "ALTER TABLE pgqueue_jobs SET (fillfactor = 40)",
    ),
    # A design that keeps every feature's index: the unchanging-column schema, a unique key
    # index whose predicate names no state (a job would clear its key when it ends), and the
    # leases in a table of their own, a row per running job indexed by expiry, for the
    # rescuer. The lease rows are written by statement-level triggers over the claim's and
    # the outcome's transition tables: one set-based insert or delete per statement, as a
    # CTE of those statements would write them, plus the trigger's own cost (so a bound from
    # below for the design).
    "live-table design (lease rows)": _LIVE_TABLE,
    # The live-table design with the finished-at index kept on the job row: the outcome's
    # update then writes it (and so every index), only the claim's stays heap-only.
    "live-table design, finished-at index kept": tuple(
        statement for statement in _LIVE_TABLE if "ix_pgqueue_jobs_finished_at" not in statement
    ),
    # The live-table design with the finished-at order served by a log of ended jobs.
    "live-table design, ended log": (*_LIVE_TABLE, *_ENDED_LOG),
    # Every structure the design needs to keep each feature's proof, at two fill factors: the
    # lower one leaves room for both updates of every row on its page, the higher one costs
    # a history less space.
    "live-table design, every structure": _EVERY_STRUCTURE,
    "live-table design, every structure, fillfactor 70": (
        *_EVERY_STRUCTURE,
        "ALTER TABLE pgqueue_jobs SET (fillfactor = 70)",
    ),
    # The same, with each finished job moved at once (by the statement that ends it) to a
    # history table that carries the dashboard's state indexes: what keeping only live jobs
    # in pgqueue_jobs costs when the move is paid per job, not deferred.
    "live-table design, finished rows moved": (
        *_LIVE_TABLE,
        "CREATE TABLE bounds_history (LIKE pgqueue_jobs INCLUDING DEFAULTS)",
        "CREATE INDEX ix_bounds_history_queue ON bounds_history (queue, state, id)",
        "CREATE INDEX ix_bounds_history_task ON bounds_history (task_name, state, id)",
        "CREATE INDEX ix_bounds_history_finished ON bounds_history (finished_at)",
        """CREATE FUNCTION bounds_history_moved() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
            INSERT INTO bounds_history SELECT n.* FROM changed_new n
            WHERE n.state IN ('succeeded', 'failed', 'cancelled');
            DELETE FROM pgqueue_jobs j USING changed_new n
            WHERE j.id = n.id AND n.state IN ('succeeded', 'failed', 'cancelled');
            RETURN NULL;
        END $$""",
        "CREATE TRIGGER bounds_history_moved AFTER UPDATE ON pgqueue_jobs"
        " REFERENCING NEW TABLE AS changed_new"
        " FOR EACH STATEMENT EXECUTE FUNCTION bounds_history_moved()",
    ),
}
CEILING = "raw SQL ceiling"

UPDATES = "SELECT n_tup_upd, n_tup_hot_upd FROM pg_stat_user_tables WHERE relname = 'pgqueue_jobs'"


def cut_down(url: URL, variant: str) -> None:
    """Cut a freshly migrated database down to ``variant``."""
    with psycopg.connect(libpq(url), autocommit=True) as conn:
        for statement in VARIANTS[variant]:
            conn.execute(statement)


def _measured_drain(
    url: URL, command: list[str], env: dict[str, str] | None, fill: Callable[[], None]
) -> Result:
    """Run ``command`` once on the empty database (its start-up and stop), then ``fill`` and
    run it again: CPU per job net of the first run, as ``benchmarks.scaling`` reports it."""
    idle = command_cost(url, command, env, SAMPLE_INTERVAL)
    fill()
    with psycopg.connect(libpq(url), autocommit=True) as conn:
        # The fill's dirty pages written now, not during the drain.
        conn.execute("CHECKPOINT")
    cost = command_cost(url, command, env, SAMPLE_INTERVAL)
    return {
        "wall_s": cost.wall_s,
        "server_cpu_s": cost.server_cpu_s or 0.0,
        "client_cpu_s": cost.worker_cpu_s,
        "server_start_stop_cpu_s": idle.server_cpu_s or 0.0,
        "client_start_stop_cpu_s": idle.worker_cpu_s,
        "wal_bytes": cost.wal_bytes,
        "load": cost.load_avg_before[0],
    }


def _per_job(jobs: int, measured: Result, counts: Result) -> Result:
    result = steady_throughput(jobs, counts, measured["wall_s"])
    result.update(measured)
    result.update(
        server_us_per_job=(measured["server_cpu_s"] - measured["server_start_stop_cpu_s"])
        * 1e6
        / jobs,
        client_us_per_job=(measured["client_cpu_s"] - measured["client_start_stop_cpu_s"])
        * 1e6
        / jobs,
        wal_bytes_per_job=measured["wal_bytes"] / jobs,
    )
    return result


def drain_variant(
    server: Server, variant: str, jobs: int, concurrency: int, processes: int = 1
) -> Result:
    """``jobs`` no-op jobs drained by ``pgqueue worker --drain`` on the variant's schema."""
    with server.fresh_database("bounds") as url:
        cut_down(url, variant)
        env = worker_env(url)
        env["PGQUEUE_LOG_SUCCESSES"] = "false"
        measured = _measured_drain(
            url, worker_command(concurrency, processes), env, lambda: fill_pgqueue(url, jobs)
        )
        _moved_back(url, variant)
        result = _per_job(jobs, measured, succeeded_after(url, 0))
        row = _settled_updates(url)
    result.update(variant=variant, processes=processes, updates=row[0], hot_updates=row[1])
    return result


def _moved_back(url: URL, variant: str) -> None:
    """For a variant that moves finished jobs out of ``pgqueue_jobs``, put them back (after
    the drain was timed), so the drain's jobs are counted where every variant's are."""
    if "bounds_history" not in " ".join(VARIANTS[variant]):
        return
    with psycopg.connect(libpq(url), autocommit=True) as conn:
        conn.execute("ALTER TABLE pgqueue_jobs DISABLE TRIGGER USER")
        conn.execute("INSERT INTO pgqueue_jobs SELECT * FROM bounds_history")


def _settled_updates(url: URL) -> tuple[int, int]:
    """The job table's update counters once they stop changing (at most 10 s): before
    PostgreSQL 15 the statistics reach other sessions through the collector, up to a second or
    more after the worker's backends sent them."""
    last: tuple[int, int] | None = None
    deadline = time.monotonic() + 10.0
    with psycopg.connect(libpq(url), autocommit=True) as conn:
        while True:
            conn.execute("SELECT pg_stat_clear_snapshot()")
            row = conn.execute(UPDATES).fetchone()
            assert row is not None
            current = (int(row[0]), int(row[1]))
            if (current == last and current[0] > 0) or time.monotonic() > deadline:
                return current
            last = current
            time.sleep(0.5)


def drain_ceiling(server: Server, jobs: int, threads: int, batch: int) -> Result:
    """``jobs`` jobs drained by the raw-SQL worker, ``threads`` connections x ``batch``."""
    with server.fresh_database("bounds_raw", migrate=False) as url:
        conninfo = libpq(url)
        baseline.create_schema(conninfo)
        command = [sys.executable, "-m", "benchmarks.baseline", "drain", conninfo]
        measured = _measured_drain(
            url, [*command, str(batch), str(threads)], None, lambda: baseline.fill(conninfo, jobs)
        )
        result = _per_job(jobs, measured, baseline.span(conninfo))
    result.update(variant=CEILING, threads=threads, batch=batch)
    return result


def bulk_variant(server: Server, variant: str, jobs: int) -> Result:
    """One ``enqueue_many`` of ``jobs`` on the variant's schema against a raw ``COPY`` of as many
    rows, as the suite's bulk workload times them."""
    return _variant_row(variant, enqueue_batch(server, jobs, 1, shape=_shape(variant)))


def single_variant(server: Server, variant: str, jobs: int) -> Result:
    """``jobs`` single ``task.enqueue`` calls (one transaction each) on the variant's schema
    against as many single-row inserts, as the suite's enqueue1 workload times them."""
    return _variant_row(variant, enqueue1(server, jobs, 1, shape=_shape(variant)))


def _shape(variant: str) -> Callable[[URL], None]:
    """What turns a freshly migrated database into ``variant`` (a paired workload's shape)."""
    return lambda url: cut_down(url, variant)


def _variant_row(variant: str, paired: Result) -> Result:
    """A paired workload's result as the variant's row: its rate, the raw pair's, the ratio."""
    return {
        "variant": variant,
        "jobs_per_s": paired["pgqueue"],
        "raw_jobs_per_s": paired["baseline"],
        "ratio": paired["ratio"],
    }


# Enqueues per second while a pick-up is timed (the suite's latency workload's pace).
PICKUP_RATE = 100.0


def pickup_variant(server: Server, variant: str, jobs: int) -> Result:
    """The p50 delay from ``jobs`` enqueues' commits to their handlers' first line on an idle
    listening worker, on the variant's schema, as the suite's latency workload times it."""
    measured = latency_pgqueue(server, jobs, PICKUP_RATE, shape=_shape(variant))
    return {"variant": variant, "p50_ms": measured["p50"]}


def pickup_ceiling(server: Server, jobs: int) -> Result:
    """The faster p50 of the two bare LISTEN loops (claims committed durably, and not), as the
    suite's latency workload takes its baseline."""
    durable = latency_baseline(server, jobs, PICKUP_RATE)["p50"]
    fast = latency_baseline(server, jobs, PICKUP_RATE, async_claims=True)["p50"]
    return {"variant": CEILING, "p50_ms": min(durable, fast), "durable_p50_ms": durable}


def summarize(
    drains: list[Result],
    bulks: list[Result],
    variants: list[str] | None = None,
    singles: list[Result] | None = None,
    pickups: list[Result] | None = None,
) -> list[Result]:
    """Per variant (``variants``, default all): median drain rate, its per-round ratio to the
    ceiling, CPU per job, HOT share, the bulk ratio to COPY, the single enqueue's to a
    single-row insert, and the pick-up's p50 to the faster bare loop's of the same round."""
    rounds = sorted({d["round"] for d in drains})
    ceiling = {d["round"]: d for d in drains if d["variant"] == CEILING}
    rows = []
    for variant in [*(VARIANTS if variants is None else variants), CEILING]:
        mine = [d for d in drains if d["variant"] == variant]
        bulk = [b for b in bulks if b["variant"] == variant]
        single = [e for e in singles or [] if e["variant"] == variant]
        bare = {p["round"]: p["p50_ms"] for p in pickups or [] if p["variant"] == CEILING}
        pickup = [p for p in pickups or [] if p["variant"] == variant]
        row: Result = {
            "variant": variant,
            "drain_jobs_per_s": statistics.median(d["jobs_per_s"] for d in mine),
            "drain_ratios": [d["jobs_per_s"] / ceiling[d["round"]]["jobs_per_s"] for d in mine],
            "server_us_per_job": statistics.median(d["server_us_per_job"] for d in mine),
            "client_us_per_job": statistics.median(d["client_us_per_job"] for d in mine),
            "hot_share": (
                statistics.median(d["hot_updates"] / max(d["updates"], 1) for d in mine)
                if variant != CEILING
                else None
            ),
            "bulk_ratios": [b["ratio"] for b in bulk],
            "single_ratios": [e["ratio"] for e in single],
            "pickup_ratios": [p["p50_ms"] / bare[p["round"]] for p in pickup],
        }
        row["drain_ratio"] = statistics.median(row["drain_ratios"])
        row["bulk_ratio"] = statistics.median(row["bulk_ratios"]) if bulk else None
        row["single_ratio"] = statistics.median(row["single_ratios"]) if single else None
        row["pickup_ratio"] = statistics.median(row["pickup_ratios"]) if pickup else None
        row["rounds"] = len(rounds)
        rows.append(row)
    return rows


def markdown_table(rows: list[Result]) -> str:
    def ratios(values: list[float]) -> str:
        return ", ".join(f"{value:.2f}" for value in values)

    lines = [
        "| pgqueue_jobs | drain jobs/s | drain / ceiling (rounds) | server us/job | drain's"
        " own us/job | HOT updates | bulk / COPY (rounds) | single enqueue / insert (rounds)"
        " | pick-up p50 / bare loop (rounds) |",
        "|---|---:|---|---:|---:|---:|---|---|---|",
    ]
    for row in rows:
        hot = "" if row["hot_share"] is None else f"{row['hot_share']:.0%}"
        bulk = (
            "" if row["bulk_ratio"] is None
            else f"{row['bulk_ratio']:.2f}x ({ratios(row['bulk_ratios'])})"
        )  # fmt: skip
        single = (
            "" if not row.get("single_ratio")
            else f"{row['single_ratio']:.2f}x ({ratios(row['single_ratios'])})"
        )  # fmt: skip
        pickup = (
            "" if not row.get("pickup_ratio")
            else f"{row['pickup_ratio']:.2f}x ({ratios(row['pickup_ratios'])})"
        )  # fmt: skip
        lines.append(
            f"| {row['variant']} | {row['drain_jobs_per_s']:,.0f}"
            f" | {row['drain_ratio']:.2f}x ({ratios(row['drain_ratios'])})"
            f" | {row['server_us_per_job']:.1f} | {row['client_us_per_job']:.1f} | {hot} | {bulk}"
            f" | {single} | {pickup} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.schema_bounds")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--jobs", type=int, default=60_000)
    parser.add_argument("--bulk", type=int, default=50_000)
    parser.add_argument("--single", type=int, default=1_000, help="single enqueues per round")
    parser.add_argument("--pickup", type=int, default=300, help="pick-ups timed per round")
    parser.add_argument("--concurrency", type=int, default=10)
    parser.add_argument("--processes", type=int, default=1)
    parser.add_argument("--threads", type=int, default=4)
    parser.add_argument("--batch", type=int, default=200)
    parser.add_argument(
        "--variant",
        action="append",
        dest="variants",
        help="a variant to run (repeat for more; default: all)",
    )
    parser.add_argument(
        "--database-url",
        default=os.environ.get("PGQUEUE_DATABASE_URL"),
        help="a server on this host (default $PGQUEUE_DATABASE_URL, else a durable embedded one)",
    )
    args = parser.parse_args(argv)
    chosen = args.variants or list(VARIANTS)
    unknown = [name for name in chosen if name not in VARIANTS]
    if unknown:
        parser.error(f"unknown variants {unknown}; known: {'; '.join(VARIANTS)}")
    drains: list[Result] = []
    bulks: list[Result] = []
    singles: list[Result] = []
    pickups: list[Result] = []
    with server_module.start(args.database_url) as server:
        settings = server.settings()
        for round_number in range(1, args.rounds + 1):
            for variant in chosen:
                result = drain_variant(server, variant, args.jobs, args.concurrency, args.processes)
                drains.append({**result, "round": round_number})
                print(json.dumps(drains[-1]), flush=True)
            result = drain_ceiling(server, args.jobs, args.threads, args.batch)
            drains.append({**result, "round": round_number})
            print(json.dumps(drains[-1]), flush=True)
            for variant in chosen:
                bulks.append({**bulk_variant(server, variant, args.bulk), "round": round_number})
                print(json.dumps(bulks[-1]), flush=True)
            for variant in chosen if args.single else ():
                single = single_variant(server, variant, args.single)
                singles.append({**single, "round": round_number})
                print(json.dumps(singles[-1]), flush=True)
            if args.pickup:
                for result in (
                    pickup_ceiling(server, args.pickup),
                    *(pickup_variant(server, variant, args.pickup) for variant in chosen),
                ):
                    pickups.append({**result, "round": round_number})
                    print(json.dumps(pickups[-1]), flush=True)
    rows = summarize(drains, bulks, chosen, singles, pickups)
    print(markdown_table(rows))
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%S")
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    path = RESULTS_DIR / f"{stamp}-schema-bounds.json"
    report = {"machine": machine(), "server": settings, "args": arguments(args), "rows": rows,
              "drains": drains, "bulks": bulks, "singles": singles,
              "pickups": pickups}  # fmt: skip
    path.write_text(json.dumps(report, indent=2, default=str))
    print(f"JSON: {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
