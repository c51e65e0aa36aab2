"""The benchmark suite's peers (``python -m benchmarks --peers``) run end to end on tiny sizes.

Each peer (pgqueuer, procrastinate) installs its schema, enqueues one by one and in bulk, drains
with its own worker process and serves the latency probes, each paired with the raw-SQL side, on
the test server; and the suite without ``--peers`` imports none of the peers' packages.
"""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy.engine import URL

from benchmarks import peers
from benchmarks.server import Server

REPO_ROOT = Path(__file__).resolve().parents[2]
TINY = peers.PeerSizes(enqueue1=5, bulk=50, drain=200, rounds=1, latency=5, latency_rounds=1)


def _step(errors: dict[str, str]) -> Any:
    def step(name: str, fn: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except Exception as exc:
            errors[name] = repr(exc)
            return None

    return step


@pytest.mark.parametrize("name", peers.PEERS)
def test_peer_workloads_run_end_to_end_and_fill_the_side_by_side_table(
    name: str, server_tcp_url: URL
) -> None:
    errors: dict[str, str] = {}
    server = Server(server_tcp_url, embedded=False)
    peer = peers.load(name)
    got = peers.run_peer(
        name,
        server,
        TINY,
        {"threads": 2, "batch": 10},
        200,
        200.0,
        _step(errors),
        sweep=(peer.DEFAULT,),
    )
    assert errors == {}
    assert got["enqueue1"]["peer"] > 0 and got["enqueue1"]["raw"] > 0
    assert got["bulk"]["peer"] > 0 and got["bulk"]["raw"] > 0
    for key in ("drain_default", "drain_best"):
        assert got[key]["setting"] == peer.DEFAULT
        assert got[key]["peer"] > 0 and got[key]["ratio"] > 0
    assert [r["ok"] for r in got["drain_sweep"]] == [True]
    # A start measured for every probe. The delay's sign is not asserted: it runs from the
    # enqueuing client's clock reading after its commit returned, and a loaded machine can
    # deschedule that client long enough for the worker to start the job first.
    assert got["latency"]["peer"]["jobs"] == TINY.latency
    assert math.isfinite(got["latency"]["peer"]["p50"])

    rows = peers.table({}, {name: got})
    assert [r["workload"] for r in rows][:2] == [
        "enqueue1 (jobs/s)",
        "bulk enqueue (jobs/s; raw: COPY)",
    ]
    assert all(r[name] != "-" and "x)" in r[name] for r in rows), rows


def test_the_suite_without_peers_imports_no_peer_package() -> None:
    check = (
        "import sys, benchmarks.run\n"
        "loaded = [m for m in sys.modules if m.split('.')[0] in ('pgqueuer', 'procrastinate')"
        " or m.startswith('benchmarks.peers')]\n"
        "assert not loaded, loaded\n"
    )
    subprocess.run([sys.executable, "-c", check], cwd=REPO_ROOT, check=True)
