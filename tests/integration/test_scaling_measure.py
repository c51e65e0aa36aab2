"""The scale-out benchmark's measurement (``benchmarks/scaling.py``) sees what it reports.

A drain by ``pgqueue worker --processes P --drain`` on the test server, of 2,000 no-op
jobs: the server's CPU (its backends are children of the postmaster, whose time the
measurement must add up) is non-zero, the workers' CPU too, and the connection sampler sees
each worker process's two connections that live as long as the process (its LISTEN
connection, and the claimer's held connection).
"""

from __future__ import annotations

import pytest
from sqlalchemy.engine import URL

from benchmarks.scaling import measure
from benchmarks.server import Server

JOBS = 2000


@pytest.mark.slow
@pytest.mark.parametrize("processes", [1, 2])
def test_the_measure_sees_server_cpu_and_every_process_connections(
    server_url: URL, processes: int
) -> None:
    server = Server(server_url, embedded=False)
    result = measure(server, processes, JOBS, concurrency=10)

    assert result["ok"], result
    assert result["server_on_this_host"]
    # Claiming and finishing 2,000 jobs costs the server tens of milliseconds of CPU, in the
    # backends; the postmaster alone spends next to none.
    assert result["server_cpu_s"] >= 0.02, result
    assert result["worker_cpu_s"] > 0, result
    connections = result["connections"]
    # Each worker process opens one LISTEN connection and one held claim connection, both for
    # its whole life; the sampler (every 20 ms) must see every one of them.
    assert connections["opened_by_application"].get("pgqueue-listener", 0) >= processes
    assert connections["opened_by_application"].get("pgqueue", 0) >= processes
    assert connections["peak_by_application"].get("pgqueue-listener", 0) >= 1
    assert connections["peak_total"] >= 2
    assert connections["samples"] > 10
