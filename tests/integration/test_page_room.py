"""The page-room benchmark (``benchmarks/page_room.py``) reads what it says it reads.

A few hundred jobs per cycle on the test server: with full pages the drain's job-row updates
move their new versions off the page, each after a heap lock record; with half the page left
free most stay, so there are fewer lock records per job (not fewer bytes at this size: the
half-full pages make more full-page images after the checkpoint). PostgreSQL 14 has no
``pg_walinspect``: there the record kinds are not read, only the WAL's bytes and the pages.
"""

from __future__ import annotations

import psycopg
import pytest
from sqlalchemy.engine import URL

from benchmarks.page_room import AVAILABLE, markdown_table, measure
from benchmarks.server import Server, libpq

JOBS = 400


@pytest.mark.slow
def test_room_on_each_page_leaves_fewer_lock_records_per_job(server_url: URL) -> None:
    server = Server(server_url, embedded=False)
    full, half = (measure(server, fillfactor, JOBS, cycles=2) for fillfactor in (100, 50))
    for result in (full, half):
        assert len(result["pages_after_cycle"]) == 2
        assert 0 < result["pages_after_cycle"][0] <= result["pages_after_cycle"][1]
    with psycopg.connect(libpq(server_url)) as conn:
        walinspect = conn.execute(AVAILABLE).fetchone()
    assert full["wal_bytes_per_job"] > 0
    if walinspect is not None and walinspect[0]:
        # The ticket's lock before its delete, then one before each moved job-row update.
        assert full["wal"]["Heap/LOCK"]["per_job"] >= 1.5
        assert half["wal"]["Heap/LOCK"]["per_job"] < full["wal"]["Heap/LOCK"]["per_job"] - 0.3
    assert "| 100 |" in markdown_table([full, half])
