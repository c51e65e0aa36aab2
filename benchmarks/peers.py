"""Peers in the suite: pgqueuer and procrastinate on the same server, in the same run.

``python -m benchmarks --peers`` (with the ``peers`` extra installed) runs, for each peer on a
fresh database with the peer's own schema installer: single enqueues, one bulk enqueue, a drain
of no-op jobs by its worker in a child process at its default setting and at the best point of a
small sweep, and the latency of an idle worker (jobs enqueued at a steady rate, commit
acknowledged -> handler start). Every round is paired with the raw-SQL side of the same
workload run right after it (single INSERTs, COPY, the drain ceiling at its best point, the
LISTEN/NOTIFY worker), and each ratio is the median of the per-round ratios, as for pgqueue.

Each peer is one module (``benchmarks/peers_<name>.py``) with the same functions; this module
and those are imported only when ``--peers`` is given, so the suite runs without the extra.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import json
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import psycopg

from benchmarks import baseline
from benchmarks import workloads as w
from benchmarks.server import Server, libpq

PEERS = ("pgqueuer", "procrastinate")
PROBE_WARMUP = 10


@dataclass(frozen=True)
class PeerSizes:
    """How much work each peer workload does, per round."""

    enqueue1: int
    bulk: int
    drain: int
    rounds: int
    latency: int
    latency_rounds: int


def _relabel(paired: dict[str, Any]) -> dict[str, Any]:
    """The suite's paired results name their sides pgqueue/baseline; here they are peer/raw."""
    names = {"pgqueue": "peer", "baseline": "raw"}
    out = {names.get(k, k): v for k, v in paired.items()}
    if "rounds" in out:
        out["rounds"] = [{names.get(k, k): v for k, v in r.items()} for r in out["rounds"]]
    if "rounds_detail" in out:
        out["rounds_detail"] = [
            {names.get(k, k): v for k, v in r.items()} for r in out["rounds_detail"]
        ]
    return out


def load(name: str) -> ModuleType:
    return importlib.import_module(f"benchmarks.peers_{name}")


def worker_command(
    peer: ModuleType, conninfo: str, setting: dict[str, int], starts: str | None
) -> list[str]:
    """The peer module's child process: it drains (``starts`` None) or listens and records the
    probe handlers' starts in the file ``starts``."""
    mode = ["drain", conninfo, json.dumps(setting)]
    if starts is not None:
        mode = ["listen", conninfo, json.dumps(setting), starts]
    return [sys.executable, "-m", peer.__name__, *mode]


def _fresh(server: Server, peer: ModuleType, label: str) -> Any:
    return server.fresh_database(f"{peer.NAME}_{label}", migrate=False)


def _enqueue1(server: Server, peer: ModuleType, n: int) -> tuple[float, float]:
    with _fresh(server, peer, "enq1") as url, _fresh(server, peer, "enq1_raw") as raw:
        peer.install(libpq(url))
        baseline.create_schema(libpq(raw))
        rate = peer.enqueue1(libpq(url), n)
        with psycopg.connect(libpq(raw), autocommit=True) as conn:
            for i in range(20):  # warm-up, as the peer's
                baseline.insert_one(conn, i)
            start = time.perf_counter()
            for i in range(n):
                baseline.insert_one(conn, i)
            raw_rate = n / (time.perf_counter() - start)
    return rate, raw_rate


def _bulk(server: Server, peer: ModuleType, n: int) -> tuple[float, float]:
    with _fresh(server, peer, "bulk") as url, _fresh(server, peer, "bulk_raw") as raw:
        peer.install(libpq(url))
        baseline.create_schema(libpq(raw))
        rate = peer.enqueue_bulk(libpq(url), n)
        baseline.enqueue_copy(libpq(raw), 10)
        return rate, n / baseline.enqueue_copy(libpq(raw), n)


def drain(server: Server, peer: ModuleType, n: int, setting: dict[str, int]) -> w.Result:
    """``n`` no-op jobs through the peer's bulk enqueue, drained by its worker process."""
    with _fresh(server, peer, "drain") as url:
        peer.install(libpq(url))
        peer.fill(libpq(url), n)
        start = time.perf_counter()
        with w.process(worker_command(peer, libpq(url), setting, None)) as child:
            code = child.wait(w.WORKER_TIMEOUT)
            if code != 0:
                raise RuntimeError(f"{peer.NAME} worker exited with {code}")
        result = w.steady_throughput(n, peer.span(libpq(url)), time.perf_counter() - start)
    result.update(setting=setting)
    return result


def _started(path: Path) -> dict[int, float]:
    """Probe index -> handler start, from the lines the worker has finished writing."""
    starts = {}
    # The last element is empty or a line still being written: left for the next read.
    for line in path.read_text().split("\n")[:-1]:
        index, at = line.split()
        starts[int(index)] = float(at)
    return starts


def _count_at_least(path: Path, expected: int) -> Callable[[], bool]:
    return lambda: len(_started(path)) >= expected


def latency(server: Server, peer: ModuleType, n: int, rate: float) -> w.Result:
    """An idle worker at the peer's defaults; ``n`` probe jobs enqueued at ``rate`` per second;
    commit acknowledged -> handler start (wall clock, one host)."""
    with (
        _fresh(server, peer, "lat") as url,
        tempfile.TemporaryDirectory(prefix="pgqueue-peers-") as tmp,
    ):
        conninfo = libpq(url)
        peer.install(conninfo)
        starts = Path(tmp) / "starts"
        starts.touch()
        with w.process(worker_command(peer, conninfo, peer.DEFAULT, str(starts))) as child:
            # Two warm-ups a second apart: the second is picked up by the worker's LISTEN (not
            # its first poll), so the measured jobs start on a worker that is listening.
            for stage in range(2):
                first = -(stage + 1) * PROBE_WARMUP
                peer.probes(conninfo, iter(range(first, first + PROBE_WARMUP)))
                expected = (stage + 1) * PROBE_WARMUP
                w.wait_until(_count_at_least(starts, expected), 60, "warm-up jobs")
                time.sleep(1.0)
            sent = peer.probes(conninfo, w._paced(n, rate))
            w.wait_until(lambda: len(_started(starts)) >= n + 2 * PROBE_WARMUP, 60, "probe jobs")
            assert child.poll() is None, f"{peer.NAME} worker died"
        started = _started(starts)
    delays = [(started[i] - t) * 1000 for i, t in sent.items()]
    return {"jobs": n, "rate": rate, **w.percentiles(delays), "unit": "ms", "delays": delays}


def run_peer(
    name: str,
    server: Server,
    sizes: PeerSizes,
    ceiling: dict[str, int],
    ceiling_jobs: int,
    latency_rate: float,
    step: Any,
    sweep: tuple[dict[str, int], ...] | None = None,
) -> dict[str, Any]:
    """Every workload for one peer, each round paired with its raw-SQL side; ``sweep``
    replaces the peer's own list of settings to try for the best drain."""
    peer = load(name)
    out: dict[str, Any] = {"setting_default": peer.DEFAULT}

    def paired(label: str, fn: Any, *args: Any) -> list[tuple[float, float]]:
        pairs = []
        for r in range(sizes.rounds):
            got = step(f"{name} {label} round {r + 1}", fn, server, peer, *args)
            if got:
                pairs.append(got)
        return pairs

    if pairs := paired("enqueue1", _enqueue1, sizes.enqueue1):
        out["enqueue1"] = _relabel(w._paired(pairs, sizes.enqueue1))
    if pairs := paired("bulk", _bulk, sizes.bulk):
        out["bulk"] = _relabel(w._paired(pairs, sizes.bulk))

    n = max(200, int(sizes.drain * peer.DRAIN_FRACTION))

    def ceiling_round(label: str) -> w.Result | None:
        result: w.Result | None = step(
            f"{name} {label}: ceiling",
            w.drain_baseline,
            server,
            ceiling_jobs,
            ceiling["batch"],
            ceiling["threads"],
        )
        return result if result and result["ok"] else None

    def drain_rounds(setting: dict[str, int], label: str) -> w.Result | None:
        pairs = []
        for r in range(sizes.rounds):
            got = step(
                f"{name} drain {label} {setting} round {r + 1}", drain, server, peer, n, setting
            )
            ceil = ceiling_round(f"drain {label} round {r + 1}")
            if got and got["ok"] and ceil:
                pairs.append((got["jobs_per_s"], ceil["jobs_per_s"]))
        return ({"setting": setting} | _relabel(w._paired(pairs, n))) if pairs else None

    out["drain_default"] = drain_rounds(peer.DEFAULT, "default")
    tried = [
        step(f"{name} drain sweep {s}", drain, server, peer, n, s) for s in sweep or peer.SWEEP
    ]
    out["drain_sweep"] = tried
    ok = [r for r in tried if r and r["ok"]]
    if ok:
        best = max(ok, key=lambda r: r["jobs_per_s"])
        out["drain_best"] = drain_rounds(best["setting"], "best")

    lat_pairs = []
    for r in range(sizes.latency_rounds):
        got = step(
            f"{name} latency round {r + 1}", latency, server, peer, sizes.latency, latency_rate
        )
        raw = step(
            f"{name} latency round {r + 1}: raw",
            w.latency_baseline,
            server,
            sizes.latency,
            latency_rate,
        )
        if got and raw:
            lat_pairs.append((got, raw))
    if lat_pairs:
        out["latency"] = _relabel(w.paired_latency(lat_pairs))
    return out


def run(
    server: Server,
    sizes: PeerSizes,
    ceiling: dict[str, int],
    ceiling_jobs: int,
    latency_rate: float,
    step: Any,
) -> dict[str, Any]:
    """Every peer in turn; a peer that cannot be imported is reported, not fatal."""
    results: dict[str, Any] = {}
    for name in PEERS:
        try:
            load(name)
        except ImportError as exc:
            results[name] = {"error": f"cannot import: {exc} (pip install -e '.[peers]')"}
            continue
        results[name] = run_peer(name, server, sizes, ceiling, ceiling_jobs, latency_rate, step)
        results[name]["version"] = importlib.metadata.version(name)
    return results


# -- the side-by-side table --------------------------------------------------------------------


def _ratio(ratio: float | None) -> str:
    if ratio is None:
        return ""
    # Two decimals hide a ratio under 0.01x: a third shows which side of 0.005x it is.
    return f" ({ratio:.2f}x)" if ratio >= 0.1 else f" ({ratio:.3f}x)"


def _rate_cell(value: float | None, ratio: float | None) -> str:
    if value is None:
        return "-"
    return f"{value:,.0f}" + _ratio(ratio)


def _latency_cell(side: dict[str, Any] | None, ratio: Any) -> str:
    if not side:
        return "-"
    return f"{side['p50']:.2f} / {side['p99']:.1f}" + _ratio(ratio)


def table(results: dict[str, Any], peers: dict[str, Any]) -> list[dict[str, str]]:
    """Rows of workload | raw ceiling | pgqueue (ratio) | each peer (ratio), as strings.

    The raw column and pgqueue's are the suite's own paired rounds; each peer's ratio is the
    median of its rounds paired with the raw side in this run."""
    e1, eb = results.get("enqueue1") or {}, results.get("enqueueB") or {}
    d = results.get("drain") or {}
    lat = results.get("latency") or {}
    rows: list[dict[str, str]] = []

    def row(workload: str, raw: str, pg: str, key: str, cell: Any) -> None:
        r = {"workload": workload, "raw ceiling": raw, "pgqueue": pg}
        for name in PEERS:
            got = peers.get(name) or {}
            r[name] = got["error"] if "error" in got else cell(got.get(key))
        rows.append(r)

    def rate(p: dict[str, Any] | None) -> str:
        if not p:
            return "-"
        return _rate_cell(p["peer"], p["ratio"]) + (
            f" [{_setting(p['setting'])}]" if "setting" in p else ""
        )

    row(
        "enqueue1 (jobs/s)",
        _rate_cell(e1.get("baseline"), None),
        _rate_cell(e1.get("pgqueue"), e1.get("ratio")),
        "enqueue1",
        rate,
    )
    row(
        "bulk enqueue (jobs/s; raw: COPY)",
        _rate_cell(eb.get("baseline"), None),
        _rate_cell(eb.get("pgqueue"), eb.get("ratio")),
        "bulk",
        rate,
    )
    ceiling = d.get("ceiling") or {}
    ceiling_note = f" ({ceiling['threads']} threads x batch {ceiling['batch']})" if ceiling else ""
    for key, peer_key, label in (
        ("default", "drain_default", "drain, default settings (jobs/s)"),
        ("best", "drain_best", "drain, best setting (jobs/s)"),
    ):
        p = d.get(key) or {}
        pg_note = ""
        if p:
            processes = p.get("processes", 1)
            pg_note = f" [c={p['concurrency']}" + (
                f" x {processes} processes" if processes > 1 else ""
            )
            pg_note += ", log_successes off]" if key == "best" else "]"
        row(
            label,
            _rate_cell(p.get("baseline"), None) + ceiling_note,
            _rate_cell(p.get("pgqueue"), p.get("ratio")) + pg_note,
            peer_key,
            rate,
        )

    def latency_cell(p: dict[str, Any] | None) -> str:
        return _latency_cell(p and p["peer"], p and p["p50_ratio"])

    row(
        "latency p50 / p99 (ms)",
        _latency_cell(lat.get("baseline"), None),
        _latency_cell(lat.get("pgqueue"), lat.get("p50_ratio")),
        "latency",
        latency_cell,
    )
    return rows


def _setting(setting: dict[str, int]) -> str:
    return ", ".join(f"{k}={v}" for k, v in setting.items())


def markdown(rows: list[dict[str, str]]) -> str:
    columns = list(rows[0]) if rows else []
    lines = [
        "| " + " | ".join(columns) + " |",
        "|---|" + "---:|" * (len(columns) - 1),
    ]
    lines += ["| " + " | ".join(r[c] for c in columns) + " |" for r in rows]
    return "\n".join(lines)
