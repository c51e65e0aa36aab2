"""Where a draining worker spends its time, and paired drains of two source trees.

``python -m benchmarks.profile_worker URL [--jobs N] [--concurrency C ...] [--processes P ...]
[--log-successes default|true|false] [--py-spy OUT] [--tree DIR ...] [--baseline-threads T
--baseline-batch B] [--rounds R] [--json PATH]``

Each round drains ``--jobs`` no-op jobs from a fresh database with ``python -m pgqueue worker
benchmarks.app:pgq --drain``, once per ``--tree`` (a checkout of pgqueue; the worker runs with
that directory as its working directory, so it imports that tree's pgqueue), alternating
trees round by round, then the raw baseline with ``T`` threads claiming batches of ``B`` (a
multi-threaded form of ``benchmarks.baseline``'s drain). With ``--py-spy OUT`` the worker
runs under ``py-spy record`` (raw folded stacks in ``OUT``). Prints one JSON line per drain,
with the load average when it began. ``--processes`` runs each drain with that many worker
processes too (every concurrency with every process count). With ``--json`` every drain and a
summary go to ``PATH``: per tree and setting the median jobs/s, the median of its per-round
ratios to the same round's raw baseline, and the median of per-round ratios to the first tree.
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
from pathlib import Path
from typing import Any

import psycopg
from sqlalchemy.engine import URL, make_url

from benchmarks import baseline
from benchmarks.server import Server, libpq
from benchmarks.workloads import (
    fill_pgqueue,
    steady_throughput,
    succeeded_after,
    worker_command,
    worker_env,
)
from pgqueue.database_urls import redact_url

REPO_ROOT = Path(__file__).resolve().parent.parent


def load() -> str:
    return Path("/proc/loadavg").read_text().split(" ", 1)[0]


def drain_tree(
    server: Server,
    tree: Path,
    jobs: int,
    concurrency: int,
    log_successes: bool | None,
    py_spy: str | None,
    processes: int = 1,
) -> dict[str, Any]:
    """One drain of ``jobs`` no-op jobs by a worker of the pgqueue in ``tree``."""
    with server.fresh_database("profile") as url:
        fill_pgqueue(url, jobs)
        env = worker_env(url)
        env.pop("PGQUEUE_LOG_SUCCESSES", None)
        if log_successes is not None:  # else the tree's default
            env["PGQUEUE_LOG_SUCCESSES"] = "true" if log_successes else "false"
        command = worker_command(concurrency, processes)
        if py_spy:
            command = ["py-spy", "record", "--format", "raw", "--rate", "250", "--gil", "--nonblocking", "-o", py_spy,
                       "--", *command]  # fmt: skip
        began = load()
        start = time.perf_counter()
        completed = subprocess.run(
            command, cwd=tree, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
            text=True, timeout=900,
        )  # fmt: skip
        wall = time.perf_counter() - start
        if completed.returncode != 0:
            raise RuntimeError(
                f"worker exited with {completed.returncode}: {completed.stderr[-2000:]}"
            )
        result = steady_throughput(jobs, succeeded_after(url, 0), wall)
        result["log_lines"] = completed.stderr.count("\n")
        result.update(_batches(url))
    result.update(
        tree=str(tree),
        concurrency=concurrency,
        processes=processes,
        log_successes=log_successes,
        load=began,
    )
    return result


def _batches(url: URL) -> dict[str, float]:
    """Claim statements and outcome transactions the drain took, and their mean sizes: each
    claim stamps its jobs' ``started_at`` with its own ``now()``, each outcome transaction
    their ``finished_at``."""
    with psycopg.connect(libpq(url), autocommit=True) as conn:
        row = conn.execute(
            "SELECT count(DISTINCT started_at), count(DISTINCT finished_at), count(*)"
            " FROM pgqueue_jobs"
        ).fetchone()
    assert row is not None
    claims, writes, jobs = row
    return {
        "claims": claims,
        "jobs_per_claim": jobs / max(claims, 1),
        "outcome_writes": writes,
        "jobs_per_write": jobs / max(writes, 1),
    }


def _baseline_thread(conninfo: str, batch: int) -> None:
    with psycopg.connect(conninfo, autocommit=True) as conn:
        while baseline._run_batch(conn, batch):
            pass


def drain_baseline(server: Server, jobs: int, threads: int, batch: int) -> dict[str, Any]:
    """The raw baseline with ``threads`` threads, each claiming and completing ``batch`` at once."""
    with server.fresh_database("profile_base", migrate=False) as url:
        conninfo = libpq(url)
        baseline.create_schema(conninfo)
        baseline.fill(conninfo, jobs)
        began = load()
        start = time.perf_counter()
        workers = [
            threading.Thread(target=_baseline_thread, args=(conninfo, batch))
            for _ in range(threads)
        ]
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join()
        wall = time.perf_counter() - start
        result = steady_throughput(jobs, baseline.span(conninfo), wall)
    result.update(tree="raw", threads=threads, batch=batch, load=began)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("url")
    parser.add_argument("--jobs", type=int, default=30_000)
    parser.add_argument("--concurrency", type=int, action="append")
    parser.add_argument("--log-successes", choices=("default", "true", "false"), default="default")
    parser.add_argument("--py-spy")
    parser.add_argument("--tree", action="append", type=Path)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--baseline-threads", type=int, default=0)
    parser.add_argument("--baseline-batch", type=int, default=100)
    parser.add_argument("--processes", type=int, action="append")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    server = Server(make_url(args.url).set(drivername="postgresql+psycopg"), embedded=False)
    trees = args.tree or [REPO_ROOT]
    log_successes = None if args.log_successes == "default" else args.log_successes == "true"
    drains: list[dict[str, Any]] = []
    for round_ in range(args.rounds):
        for concurrency in args.concurrency or [10]:
            for processes in args.processes or [1]:
                # Each round reverses the order: a load that grows or fades during a round
                # does not favour one tree every round.
                for tree in trees if round_ % 2 == 0 else trees[::-1]:
                    result = drain_tree(
                        server,
                        tree,
                        args.jobs,
                        concurrency,
                        log_successes,
                        args.py_spy,
                        processes,
                    )
                    result["round"] = round_
                    drains.append(result)
                    print(json.dumps(result), flush=True)
        if args.baseline_threads:
            result = drain_baseline(server, args.jobs, args.baseline_threads, args.baseline_batch)
            result["round"] = round_
            drains.append(result)
            print(json.dumps(result), flush=True)
    if args.json:
        summary = summarize(drains, [str(tree) for tree in trees])
        print(json.dumps(summary, indent=1), flush=True)
        # Results files are committed: the server URL's password is hidden.
        command = [redact_url(part) if "://" in part else part for part in sys.argv]
        document = {"command": command, "jobs": args.jobs, "rounds": args.rounds}
        document |= {"summary": summary, "drains": drains, "loadavg_end": os.getloadavg()}
        args.json.write_text(json.dumps(document, indent=1) + "\n")


def summarize(drains: list[dict[str, Any]], trees: list[str]) -> dict[str, Any]:
    """Per tree and setting: median jobs/s, the median of per-round ratios to the round's raw
    baseline (when it ran) and to the first tree's drain of the same setting and round."""
    ceiling = {d["round"]: d["jobs_per_s"] for d in drains if d["tree"] == "raw" and d["ok"]}
    pgqueue = {
        (d["tree"], d["concurrency"], d["processes"], d["round"]): d["jobs_per_s"]
        for d in drains
        if d["tree"] != "raw" and d["ok"]
    }
    settings = sorted({(c, p) for _, c, p, _ in pgqueue})
    rounds = sorted({r for *_, r in pgqueue})
    summary: dict[str, Any] = {
        "ceiling_jobs_per_s": statistics.median(ceiling.values()) if ceiling else None
    }
    for concurrency, processes in settings:
        for tree in trees:
            rates = {r: pgqueue[tree, concurrency, processes, r] for r in rounds
                     if (tree, concurrency, processes, r) in pgqueue}  # fmt: skip
            if not rates:
                continue
            to_ceiling = [rates[r] / ceiling[r] for r in rates if r in ceiling]
            first = [
                rates[r] / pgqueue[trees[0], concurrency, processes, r]
                for r in rates
                if (trees[0], concurrency, processes, r) in pgqueue
            ]
            summary[f"{tree} c={concurrency} p={processes}"] = {
                "jobs_per_s": statistics.median(rates.values()),
                "rounds_jobs_per_s": [rates[r] for r in sorted(rates)],
                "ratio_to_ceiling": statistics.median(to_ceiling) if to_ceiling else None,
                "rounds_ratio_to_ceiling": to_ceiling,
                "ratio_to_first_tree": statistics.median(first) if first else None,
                "rounds_ratio_to_first_tree": first,
            }
    return summary


if __name__ == "__main__":
    main()
