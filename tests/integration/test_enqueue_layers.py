"""The enqueue-layers benchmark (``benchmarks/enqueue_layers.py``) times what it says it times.

A few rounds of a few calls on the test server: every layer that writes a job wrote each one
(the job table holds exactly as many as were asked for), the synchronous and the asyncio layers
alike, every layer has a sample per round and its ratio against its own baseline, and the table
names each. No speed is asserted.
"""

from __future__ import annotations

import pytest
from sqlalchemy.engine import URL

from benchmarks.enqueue_layers import BASELINE_OF, LAYERS, markdown_table, measure
from benchmarks.server import Server


@pytest.mark.slow
def test_each_layer_writes_every_job_it_is_asked_for(server_url: URL) -> None:
    result = measure(Server(server_url, embedded=False), calls=50, rounds=3)

    # Six layers write jobs (all but the two raw inserts): 100 warm-up calls and 3 x 50 each.
    assert result["jobs_written"] == result["jobs_expected"] == 6 * (100 + 3 * 50)
    for name in LAYERS:
        assert len(result["samples"][name]) == 3
        assert result["medians"][name]["wall_us"] > 0
        assert result["medians"][name]["baseline"] == BASELINE_OF[name]
    assert result["medians"]["raw_insert"]["raw_wall_over_wall"] == 1.0
    assert result["medians"]["raw_async_insert"]["raw_wall_over_wall"] == 1.0
    table = markdown_table(result)
    for name in LAYERS:
        assert f"| {name} |" in table
