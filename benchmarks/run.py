"""The entry point: ``python -m benchmarks [--quick | --soak] [--peers] [--json PATH]``.

Runs every workload against a fresh database on one server (a durable embedded PostgreSQL, or
``$PGQUEUE_DATABASE_URL``), prints a table of pgqueue vs. the raw-SQL baseline with the ratio
and the target (the drain's against the ceiling: the best point of the raw-SQL threads x batch
sweep), with ``--peers`` also pgqueuer and procrastinate side by side (``benchmarks/peers.py``),
and writes the JSON to ``benchmarks/results/<timestamp>.json`` (and ``--json``).
No speed threshold is asserted: the exit status is 1 when a workload crashed or lost a job
(``failures``), else 0. ``python -m benchmarks.report FILE`` prints a results file's tables again.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import statistics
import sys
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from benchmarks import server as server_module
from benchmarks import workloads as w
from pgqueue.database_urls import redact_url

RESULTS_DIR = Path(__file__).resolve().parent / "results"
console = Console()


@dataclass(frozen=True)
class Sizes:
    """How much work each workload does; ``quick`` keeps the whole run under a minute."""

    enqueue1: int
    enqueue_batch: int
    enqueue_rounds: int
    drain: int
    drain_concurrency: tuple[int, ...]
    drain_processes: tuple[int, ...]
    baseline_threads: tuple[int, ...]
    baseline_batches: tuple[int, ...]
    drain_rounds: int
    latency: int
    latency_rounds: int
    history_rows: int
    history_rounds: int
    cpu: int
    memory: int
    awaited: int


QUICK = Sizes(
    enqueue1=150,
    enqueue_batch=5_000,
    enqueue_rounds=2,
    drain=2_000,
    drain_concurrency=(10, 50),
    drain_processes=(1,),
    baseline_threads=(1, 4),
    baseline_batches=(50,),
    drain_rounds=1,
    latency=200,
    latency_rounds=1,
    history_rows=50_000,
    history_rounds=1,
    cpu=300,
    memory=0,
    awaited=50,
)
FULL = Sizes(
    enqueue1=500,
    enqueue_batch=50_000,
    enqueue_rounds=5,
    drain=100_000,
    drain_concurrency=(10, 50, 100, 200),
    drain_processes=(1, 2),
    baseline_threads=(1, 2, 4, 8),
    # Up to 5,000 (more than pgqueue's largest claim, 2,000), so the ceiling is where the
    # sweep peaks rather than where it stops.
    baseline_batches=(50, 200, 500, 1_000, 2_000, 5_000),
    drain_rounds=3,
    latency=1_000,
    latency_rounds=3,
    history_rows=1_000_000,
    history_rounds=3,
    cpu=3_000,
    memory=200_000,
    awaited=50,
)
LATENCY_RATE = 100.0
# The worker's concurrency when none is given (``pgqueue worker``'s default): the "default" drain.
DEFAULT_CONCURRENCY = 10


def machine() -> dict[str, Any]:
    model = "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    try:
        load = os.getloadavg()
    except OSError:
        load = (0.0, 0.0, 0.0)
    return {
        "cpu": model,
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "load_avg_at_start": load,
    }


WORKLOADS = ("enqueue1", "enqueueB", "drain", "latency", "await", "history", "cpu", "memory")


def _step(results: dict[str, Any]) -> Any:
    """A runner of one named step that logs it, times it, records the load average after it in
    ``results["load_avg"]``, and records a failure in ``results["errors"]`` (returning None)
    instead of ending the run."""

    def step(name: str, fn: Any, *args: Any, **kwargs: Any) -> Any:
        console.log(f"[bold]{name}[/bold] ...")
        started = time.perf_counter()
        try:
            value = fn(*args, **kwargs)
        except Exception as exc:
            console.log(f"[red]{name} failed:[/red] {exc}")
            traceback.print_exc()
            results.setdefault("errors", {})[name] = repr(exc)
            return None
        # The shared machine's load beside each number, as the report gives it.
        results.setdefault("load_avg", {})[name] = os.getloadavg()
        console.log(f"{name} done in {time.perf_counter() - started:.1f} s")
        return value

    return step


def run_drain(step: Any, srv: server_module.Server, sizes: Sizes) -> dict[str, Any]:
    """The ceiling sweep (raw SQL, threads x batch), pgqueue's concurrency sweep (without a log
    line per success), then paired rounds: pgqueue at its defaults, pgqueue at the best point of
    its sweep, and the ceiling at the best point of its sweep, one after the other each round.
    """
    ceiling_sweep = [
        step(f"ceiling drain threads={t} batch={b}", w.drain_baseline, srv, sizes.drain, b, t)
        for t in sizes.baseline_threads
        for b in sizes.baseline_batches
    ]
    sweep = [
        step(
            f"drain c={c} processes={p}, log_successes off",
            w.drain_pgqueue,
            srv,
            sizes.drain,
            c,
            processes=p,
            log_successes=False,
        )
        for p in sizes.drain_processes
        for c in sizes.drain_concurrency
    ]
    ceiling_ok = [r for r in ceiling_sweep if r and r["ok"]]
    sweep_ok = [r for r in sweep if r and r["ok"]]
    ceiling = max(ceiling_ok, key=lambda r: r["jobs_per_s"]) if ceiling_ok else None
    best = max(sweep_ok, key=lambda r: r["jobs_per_s"]) if sweep_ok else None
    best_c = best["concurrency"] if best else sizes.drain_concurrency[-1]
    best_p = best["processes"] if best else 1
    threads = ceiling["threads"] if ceiling else sizes.baseline_threads[-1]
    batch = ceiling["batch"] if ceiling else sizes.baseline_batches[-1]
    # The best point again with claims that commit without waiting for their WAL flush (a
    # bare loop may; pgqueue's claims do not); the rounds' ceiling commits them the faster way.
    async_point = step(
        f"ceiling drain threads={threads} batch={batch}, async claims",
        w.drain_baseline,
        srv,
        sizes.drain,
        batch,
        threads,
        async_claims=True,
    )
    async_claims = bool(
        ceiling
        and async_point
        and async_point["ok"]
        and async_point["jobs_per_s"] > ceiling["jobs_per_s"]
    )
    default_pairs, best_pairs = [], []
    round_runs: list[dict[str, Any] | None] = []
    for r in range(sizes.drain_rounds):
        # The worker's own defaults: no PGQUEUE_* setting, the CLI's default concurrency.
        default = step(
            f"drain round {r + 1}: c={DEFAULT_CONCURRENCY}, defaults",
            w.drain_pgqueue,
            srv,
            sizes.drain,
            DEFAULT_CONCURRENCY,
        )
        tuned = step(
            f"drain round {r + 1}: c={best_c} processes={best_p}, log_successes off",
            w.drain_pgqueue,
            srv,
            sizes.drain,
            best_c,
            processes=best_p,
            log_successes=False,
        )
        ceil = step(
            f"drain round {r + 1}: ceiling threads={threads} batch={batch}"
            + (", async claims" if async_claims else ""),
            w.drain_baseline,
            srv,
            sizes.drain,
            batch,
            threads,
            async_claims=async_claims,
        )
        round_runs += [default, tuned, ceil]
        if not (ceil and ceil["ok"]):
            continue
        if default and default["ok"]:
            default_pairs.append((default["jobs_per_s"], ceil["jobs_per_s"]))
        if tuned and tuned["ok"]:
            best_pairs.append((tuned["jobs_per_s"], ceil["jobs_per_s"]))
    setting = {"threads": threads, "batch": batch, "async_claims": async_claims}
    return {
        "ceiling": (setting | {"sweep_jobs_per_s": ceiling["jobs_per_s"]}) if ceiling else None,
        "ceiling_sweep": ceiling_sweep,
        "ceiling_async_point": async_point,
        "ceiling_grid": ceiling_grid(ceiling_sweep),
        "round_runs": round_runs,
        "sweep": sweep,
        "best_concurrency": best["concurrency"] if best else None,
        "default": (
            {"concurrency": DEFAULT_CONCURRENCY, "ceiling": setting}
            | w._paired(default_pairs, sizes.drain)
            if default_pairs
            else None
        ),
        "best": (
            {
                "concurrency": best_c,
                "processes": best_p,
                "log_successes": False,
                "ceiling": setting,
            }
            | w._paired(best_pairs, sizes.drain)
            if best_pairs
            else None
        ),
    }


def ceiling_grid(sweep: Sequence[dict[str, Any] | None]) -> dict[str, Any]:
    """The ceiling sweep as a threads x batch grid of jobs/s (None where a point failed), with
    the peak and, per thread count, the batch where it peaked (did the sweep reach the top?)."""
    points = [r for r in sweep if r]
    threads = sorted({r["threads"] for r in points})
    batches = sorted({r["batch"] for r in points})
    rate = {(r["threads"], r["batch"]): r["jobs_per_s"] if r["ok"] else None for r in points}
    ok = [key for key, value in rate.items() if value]
    peak = max(ok, key=lambda key: rate[key] or 0.0) if ok else None
    return {
        "threads": threads,
        "batches": batches,
        "jobs_per_s": [[rate.get((t, b)) for b in batches] for t in threads],
        "peak": {"threads": peak[0], "batch": peak[1], "jobs_per_s": rate[peak]} if peak else None,
    }


def run_suite(
    srv: server_module.Server, sizes: Sizes, only: Sequence[str] = WORKLOADS
) -> dict[str, Any]:
    """Run the workloads named in ``only`` (all by default), in the table's order."""
    results: dict[str, Any] = {}
    step = _step(results)

    if "enqueue1" in only:
        results["enqueue1"] = step(
            "enqueue1", w.enqueue1, srv, sizes.enqueue1, sizes.enqueue_rounds
        )
    if "enqueueB" in only:
        results["enqueueB"] = step(
            "enqueueB", w.enqueue_batch, srv, sizes.enqueue_batch, sizes.enqueue_rounds
        )

    best_c = sizes.drain_concurrency[-1]
    if "drain" in only:
        results["drain"] = drain = run_drain(step, srv, sizes)
        if drain["best_concurrency"]:
            best_c = drain["best_concurrency"]

    if "latency" in only:
        latency_pairs = []
        latency_bases: list[list[float | None]] = []  # each round's (durable, async) p50
        for r in range(sizes.latency_rounds):
            pg = step(f"latency round {r + 1}", w.latency_pgqueue, srv, sizes.latency, LATENCY_RATE)
            # The bare loop both ways (claims durable, and asynchronous, which pgqueue's are
            # not); the round's baseline is the faster of the two.
            bases = [
                step(
                    f"latency round {r + 1}: baseline, {'async' if a else 'durable'} claims",
                    w.latency_baseline,
                    srv,
                    sizes.latency,
                    LATENCY_RATE,
                    async_claims=a,
                )
                for a in (False, True)
            ]
            ran = [b for b in bases if b]
            if pg and ran:
                latency_pairs.append((pg, min(ran, key=lambda b: b["p50"])))
                latency_bases.append([b and b["p50"] for b in bases])
        if latency_pairs:
            results["latency"] = w.paired_latency(latency_pairs)
            results["latency"]["baseline_p50_durable_async"] = latency_bases

    if "await" in only:
        results["await"] = step("await", w.await_pgqueue, srv, sizes.awaited)

    if "history" in only:
        empty, full = [], []
        for r in range(sizes.history_rounds):
            empty.append(
                step(f"history round {r + 1}: empty", w.drain_pgqueue, srv, sizes.drain, best_c)
            )
            full.append(
                step(
                    f"history round {r + 1}: {sizes.history_rows:,} finished jobs",
                    w.drain_pgqueue,
                    srv,
                    sizes.drain,
                    best_c,
                    history=sizes.history_rows,
                )
            )
        results["history"] = {"empty": empty, "history": full, "rows": sizes.history_rows}

    if "cpu" in only:
        spin = {"ms": 2.0}
        results["cpu"] = {
            "one": step(
                "cpu 1 process",
                w.drain_pgqueue,
                srv,
                sizes.cpu,
                10,
                task_name="bench.spin",
                task_kwargs=spin,
            ),
            "two": step(
                "cpu 2 processes",
                w.drain_pgqueue,
                srv,
                sizes.cpu,
                10,
                processes=2,
                task_name="bench.spin",
                task_kwargs=spin,
            ),
        }
    if sizes.memory and "memory" in only:
        results["memory"] = step("memory", w.memory, srv, sizes.memory, best_c)
    return results


def failures(results: dict[str, Any]) -> list[str]:
    """What went wrong in a run, one line each: every step that raised (a workload that crashed,
    a worker that exited non-zero, a timeout) and every run whose jobs did not all succeed
    exactly once (``"ok": False``), named by where it sits in the results."""
    found = [f"{name}: {error}" for name, error in (results.get("errors") or {}).items()]

    def walk(value: Any, path: str) -> None:
        if isinstance(value, dict):
            if value.get("ok") is False:
                found.append(
                    f"{path}: {value.get('succeeded', '?')} of {value.get('jobs', '?')} jobs"
                    " succeeded"
                )
            for key, item in value.items():
                if key != "errors":
                    walk(item, f"{path}.{key}" if path else str(key))
        elif isinstance(value, list):
            for index, item in enumerate(value):
                walk(item, f"{path}[{index}]")

    walk(results, "")
    return found


def _median_rate(runs: list[Any]) -> float | None:
    rates = sorted(r["jobs_per_s"] for r in runs if r and r["ok"])
    return rates[len(rates) // 2] if rates else None


def summarize(results: dict[str, Any]) -> list[dict[str, Any]]:
    """Rows of (workload, pgqueue, baseline, ratio, target, met) for the table and the JSON."""
    rows: list[dict[str, Any]] = []

    def add(
        workload: str,
        pg: float | None,
        base: float | None,
        unit: str,
        target: str,
        met: bool | None,
        ratio: float | None = None,
    ) -> None:
        if ratio is None and pg is not None and base:
            ratio = pg / base
        rows.append(
            {
                "workload": workload,
                "pgqueue": pg,
                "baseline": base,
                "unit": unit,
                "ratio": ratio,
                "target": target,
                "met": met,
            }
        )

    def ratio_row(
        name: str,
        pg: float | None,
        base: float | None,
        unit: str,
        minimum: float,
        ratio: float | None = None,
        against: str = "baseline",
    ) -> None:
        if ratio is None:
            ratio = pg / base if pg is not None and base else None
        add(
            name,
            pg,
            base,
            unit,
            f">= {minimum}x {against}",
            None if ratio is None else ratio >= minimum,
            ratio,  # the median of per-round ratios where rounds were paired, as judged
        )

    e1, eb = results.get("enqueue1"), results.get("enqueueB")
    ratio_row(
        "enqueue1", e1 and e1["pgqueue"], e1 and e1["baseline"], "jobs/s", 0.85, e1 and e1["ratio"]
    )
    ratio_row(
        "enqueueB (enqueue_many vs COPY of one row per job)",
        eb and eb["pgqueue"],
        eb and eb["baseline"],
        "jobs/s",
        0.6,
        eb and eb["ratio"],
        "COPY",
    )

    two = (eb or {}).get("two_rows")
    add(
        "enqueueB vs COPY of a job and a ticket row per job (as many rows as pgqueue writes)",
        two and two["pgqueue"],
        two and two["baseline"],
        "jobs/s",
        "(informative)",
        None,
        two and two["ratio"],
    )

    d = results.get("drain") or {}
    ceiling = d.get("ceiling")
    rounds = d.get("best") or d.get("default")
    add(
        (
            f"drain ceiling (raw SQL, {ceiling['threads']} threads x batch {ceiling['batch']},"
            " the best of the threads x batch sweep; median of the paired rounds)"
        )
        if ceiling
        else "drain ceiling",
        None,
        rounds["baseline"] if rounds else None,
        "jobs/s",
        "(the ceiling)",
        None,
    )
    for key, label, minimum in (
        ("default", "drain default (c={concurrency}, the worker's default settings", 0.5),
        ("best", "drain best (c={concurrency}, {processes} process(es), log_successes off", 0.7),
    ):
        paired = d.get(key)
        name = (
            label.format(concurrency=paired["concurrency"], processes=paired.get("processes", 1))
            if paired
            else label.split(" (")[0]
        )
        if paired:
            name += f", median of {len(paired['rounds'])} rounds paired with the ceiling)"
        ratio_row(
            name,
            paired and paired["pgqueue"],
            paired and paired["baseline"],
            "jobs/s",
            minimum,
            paired and paired["ratio"],
            "ceiling",
        )

    lat = results.get("latency") or {}
    lp, lb = lat.get("pgqueue"), lat.get("baseline")
    p50_ratio = lat.get("p50_ratio")
    latency_rounds = len(lat.get("rounds", []))
    per_round = lp["jobs"] // latency_rounds if lp and latency_rounds else 0
    add(
        f"latency p50 (idle listening worker vs the faster bare loop, durable or async claims;"
        f" median of {latency_rounds} paired rounds"
        f" of {per_round:,} jobs)",
        lp and lp["p50"],
        lb and lb["p50"],
        "ms",
        "<= 1.2x baseline",
        None if p50_ratio is None else p50_ratio <= 1.2,
        p50_ratio,
    )
    # The pick-up an idle worker gives a user, whatever the baseline does on this server.
    add(
        "latency p50, absolute",
        lp and lp["p50"],
        None,
        "ms",
        "< 5 ms",
        None if not lp else lp["p50"] < 5,
    )
    add("latency p95", lp and lp["p95"], lb and lb["p95"], "ms", "(informative)", None)
    add(
        "latency p99",
        lp and lp["p99"],
        lb and lb["p99"],
        "ms",
        "< 10 ms",
        None if not lp else lp["p99"] < 10,
    )

    awaited = results.get("await") or {}
    for name, target in (("await_job", "< 10 ms"), ("wait_for", "(informative)")):
        waits = awaited.get(name)
        add(
            f"{name} p50 after the job finished ({awaited.get('jobs', 0)} jobs of"
            f" {awaited.get('job_ms', 0):g} ms, one at a time)",
            waits and waits["p50"],
            None,
            "ms",
            target,
            None if not waits or target.startswith("(") else waits["p50"] < 10,
        )
        not_heard = len(waits["after_announcement"].get("not_heard", [])) if waits else 0
        add(
            f"{name} p50 after a bare LISTEN client heard the job end"
            + (f" ({not_heard} ends it never heard)" if not_heard else ""),
            waits and waits["after_announcement"].get("p50"),
            None,
            "ms",
            "(informative)",
            None,
        )

    h = results.get("history") or {}
    empty, full = _median_rate(h.get("empty", [])), _median_rate(h.get("history", []))
    # Each round drains on an empty table and then with the history, minutes apart at most:
    # the median of the per-round ratios, as for the other paired workloads.
    round_ratios = [
        f["jobs_per_s"] / e["jobs_per_s"]
        for e, f in zip(h.get("empty", []), h.get("history", []), strict=False)
        if e and f and e["ok"] and f["ok"]
    ]
    hratio = statistics.median(round_ratios) if round_ratios else None
    add(
        f"history ({h.get('rows', 0):,} finished) vs empty"
        f" (median of {len(round_ratios)} paired rounds)",
        full,
        empty,
        "jobs/s",
        ">= 0.9x empty",
        None if hratio is None else hratio >= 0.9,
        hratio,
    )

    c = results.get("cpu") or {}
    one, two = c.get("one"), c.get("two")
    r1 = one["jobs_per_s"] if one and one["ok"] else None
    r2 = two["jobs_per_s"] if two and two["ok"] else None
    cratio = r2 / r1 if r1 and r2 else None
    add(
        "cpu 2 ms jobs: 2 processes vs 1",
        r2,
        r1,
        "jobs/s",
        ">= 1.4x one",
        None if cratio is None else cratio >= 1.4,
    )

    m = results.get("memory")
    if m:
        growth = m.get("growth_mb")
        add(
            f"memory RSS growth over {m['jobs']:,} jobs",
            growth,
            None,
            "MB",
            "< 20 MB",
            None if growth is None else growth < 20,
        )
    return rows


def _fmt(value: float | None, unit: str) -> str:
    if value is None:
        return "-"
    if unit == "ms":
        return f"{value:.2f} ms"
    if unit == "MB":
        return f"{value:.1f} MB"
    return f"{value:,.0f}"


def print_table(rows: list[dict[str, Any]], title: str) -> None:
    table = Table(title=title)
    for name, justify in (
        ("workload", "left"),
        ("pgqueue", "right"),
        ("baseline", "right"),
        ("ratio", "right"),
        ("target", "left"),
        ("met", "center"),
    ):
        table.add_column(name, justify=justify)  # type: ignore[arg-type]
    for row in rows:
        met = {True: "[green]yes[/green]", False: "[red]no[/red]", None: ""}[row["met"]]
        table.add_row(
            row["workload"],
            _fmt(row["pgqueue"], row["unit"]),
            _fmt(row["baseline"], row["unit"]),
            "-" if row["ratio"] is None else f"{row['ratio']:.2f}x",
            row["target"],
            met,
        )
    console.print(table)


def markdown_table(rows: list[dict[str, Any]]) -> str:
    lines = [
        "| workload | pgqueue | baseline | ratio | target | met |",
        "|---|---:|---:|---:|---|:---:|",
    ]
    for row in rows:
        met = {True: "yes", False: "**no**", None: ""}[row["met"]]
        ratio = "-" if row["ratio"] is None else f"{row['ratio']:.2f}x"
        lines.append(
            f"| {row['workload']} | {_fmt(row['pgqueue'], row['unit'])} | "
            f"{_fmt(row['baseline'], row['unit'])} | {ratio} | {row['target']} | {met} |"
        )
    return "\n".join(lines)


def grid_markdown(grid: dict[str, Any] | None) -> str:
    """The ceiling sweep as a Markdown table, threads down and batch across, the peak in bold."""
    if not grid or not grid.get("threads"):
        return ""
    peak = grid.get("peak") or {}
    lines = [
        "| threads | " + " | ".join(f"batch {b:,}" for b in grid["batches"]) + " |",
        "|---:|" + "---:|" * len(grid["batches"]),
    ]
    for threads, rates in zip(grid["threads"], grid["jobs_per_s"], strict=True):
        cells = []
        for batch, rate in zip(grid["batches"], rates, strict=True):
            cell = _fmt(rate, "jobs/s")
            if (threads, batch) == (peak.get("threads"), peak.get("batch")):
                cell = f"**{cell}**"
            cells.append(cell)
        lines.append(f"| {threads} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def standalone(
    run: Callable[[server_module.Server, argparse.Namespace], dict[str, Any]],
    args: argparse.Namespace,
) -> dict[str, Any]:
    """The report of a benchmark module's ``run(server, args)`` on ``$PGQUEUE_DATABASE_URL``
    (or a durable embedded server), with the server's settings, the machine and the
    arguments."""
    with server_module.start(os.environ.get("PGQUEUE_DATABASE_URL")) as server:
        report = run(server, args)
        report["settings"] = server.settings()
    report["machine"] = machine()
    report["arguments"] = arguments(args)
    return report


def arguments(args: argparse.Namespace) -> dict[str, Any]:
    """A run's arguments for its report, the database URL's password hidden: results files are
    committed."""
    values = dict(vars(args))
    if values.get("database_url"):
        values["database_url"] = redact_url(values["database_url"])
    return values


def write_json(report: dict[str, Any], extra_path: str | None) -> Path:
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    stamp = dt.datetime.now().strftime("%Y%m%dT%H%M%S")
    path = RESULTS_DIR / f"{stamp}-{report['mode']}.json"
    text = json.dumps(report, indent=2, default=str)
    path.write_text(text)
    if extra_path:
        Path(extra_path).write_text(text)
    return path


# The peers' bulk enqueue is as large as pgqueue's, for one bulk row.
PEERS_QUICK = {
    "enqueue1": 50,
    "bulk": QUICK.enqueue_batch,
    "drain": 1_000,
    "rounds": 1,
    "latency": 30,
    "latency_rounds": 1,
}
PEERS_FULL = {
    "enqueue1": 500,
    "bulk": FULL.enqueue_batch,
    "drain": 20_000,
    "rounds": 3,
    "latency": 500,
    "latency_rounds": 3,
}


def run_peers(report: dict[str, Any], srv: server_module.Server, quick: bool) -> None:
    """The peers' workloads after the suite's, and the side-by-side table, into ``report``."""
    # Imported here: the peers' packages are an optional extra the suite runs without.
    from benchmarks import peers

    sizes = QUICK if quick else FULL
    results = report["results"]
    drain = results.get("drain") or {}
    ceiling = drain.get("ceiling") or {
        "threads": sizes.baseline_threads[-1],
        "batch": sizes.baseline_batches[-1],
    }
    peer_sizes = peers.PeerSizes(**(PEERS_QUICK if quick else PEERS_FULL))
    report["peer_sizes"] = peer_sizes.__dict__
    results["peers"] = peers.run(
        srv,
        peer_sizes,
        {"threads": ceiling["threads"], "batch": ceiling["batch"]},
        sizes.drain,
        LATENCY_RATE,
        _step(results),
    )
    report["peers_table"] = peers.table(results, results["peers"])
    report["load_avg_after_peers"] = os.getloadavg()


def print_peers(rows: list[dict[str, str]]) -> None:
    from benchmarks import peers

    if not rows:
        return
    table = Table(title="peers, side by side (ratios: median of rounds paired with raw SQL)")
    for i, name in enumerate(rows[0]):
        table.add_column(name, justify="left" if i == 0 else "right")
    for row in rows:
        table.add_row(*row.values())
    console.print(table)
    print(peers.markdown(rows))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__)
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--quick", action="store_true", help="small N, under a minute (CI smoke)")
    mode.add_argument("--soak", action="store_true", help="only the sustained-load soak")
    parser.add_argument(
        "--peers",
        action="store_true",
        help="also run pgqueuer and procrastinate (pip install -e '.[peers]') side by side",
    )
    parser.add_argument("--soak-seconds", type=float, default=300.0)
    parser.add_argument("--soak-rate", type=float, default=500.0)
    parser.add_argument(
        "--soak-quiet",
        type=float,
        default=40.0,
        help="seconds of no enqueue between the soak's one-minute bursts (0: none)",
    )
    parser.add_argument(
        "--only",
        action="append",
        choices=WORKLOADS,
        help="run only this workload (repeatable; default all)",
    )
    parser.add_argument("--json", dest="json_path", default=None, help="also write JSON here")
    parser.add_argument(
        "--database-url",
        default=os.environ.get("PGQUEUE_DATABASE_URL"),
        help="an existing server (default $PGQUEUE_DATABASE_URL, else a durable embedded one)",
    )
    args = parser.parse_args(argv)
    mode_name = "soak" if args.soak else "quick" if args.quick else "full"
    started = time.perf_counter()
    report: dict[str, Any] = {
        "mode": mode_name,
        "started_at": dt.datetime.now(dt.UTC).isoformat(),
        "machine": machine(),
    }
    with server_module.start(args.database_url) as srv:
        report["server"] = {"embedded": srv.embedded, **srv.settings()}
        console.log(f"server: {report['server']}")
        if args.soak:
            from benchmarks import soak

            report["soak"] = soak.run(
                srv, seconds=args.soak_seconds, rate=args.soak_rate, quiet=args.soak_quiet
            )
            soak.print_report(report["soak"], console)
        else:
            sizes = QUICK if args.quick else FULL
            report["sizes"] = sizes.__dict__
            report["results"] = run_suite(srv, sizes, args.only or WORKLOADS)
            report["summary"] = summarize(report["results"])
            if args.peers:
                run_peers(report, srv, args.quick)
            print_table(report["summary"], f"pgqueue vs raw-SQL baseline ({mode_name} run)")
            print(markdown_table(report["summary"]))
            grid = (report["results"].get("drain") or {}).get("ceiling_grid")
            if grid:
                print("\nThe ceiling's sweep (raw SQL drain, jobs/s):\n")
                print(grid_markdown(grid))
            if args.peers:
                print_peers(report["peers_table"])
    report["elapsed_s"] = time.perf_counter() - started
    report["failures"] = problems = failures(report.get("results") or {})
    path = write_json(report, args.json_path)
    console.log(f"{mode_name} run took {report['elapsed_s']:.0f} s; JSON: {path}")
    for problem in problems:
        console.print(f"[red]failed:[/red] {problem}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
