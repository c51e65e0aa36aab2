"""Per-key concurrency limits and rate limits hold across real worker processes.

Four ``python -m pgqueue worker`` processes with eight threads each run the jobs; every handler
appends its start and end time (wall clock, one host) to a ledger file of its process, and the
assertions read those ledgers: the peak of jobs running at once per key, and the starts in
every sliding window.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import text
from sqlalchemy.engine import URL
from support.flow_checks import most_in_window
from support.polling import wait_until
from support.processes import pgqueue_command, pgqueue_env

from pgqueue import JobState, PgQueue
from pgqueue.testing import states_of, wait_for_states

APP = """
import os
import threading
import time

from pgqueue import PgQueue, Settings

pgq = PgQueue(os.environ["DB_URL"], settings=Settings(poll_interval=1.0))
_ledger = open(os.path.join(os.environ["LEDGER_DIR"], f"{os.getpid()}.log"), "a", buffering=1)
_lock = threading.Lock()


def _note(kind, job, key, started, ended):
    with _lock:
        _ledger.write(f"{kind} {job} {key} {started:.6f} {ended:.6f}\\n")


@pgq.task(
    name="per_account",
    queue="accounts",
    concurrency_key=lambda account, n: f"account:{account}",
    key_limit=2,
)
def per_account(account, n):
    started = time.time()
    time.sleep(0.05)
    _note("key", n, f"account:{account}", started, time.time())


@pgq.task(name="rated", queue="rated")
def rated(n):
    started = time.time()
    time.sleep(0.1)
    _note("rate", n, "-", started, time.time())
"""


def _peak(intervals: list[tuple[float, float]]) -> int:
    running = peak = 0
    # At equal times count ends first: touching intervals do not overlap.
    events = [(start, 1) for start, _ in intervals] + [(end, -1) for _, end in intervals]
    for _, step in sorted(events):
        running += step
        peak = max(peak, running)
    return peak


def _ledger(directory: Path, kind: str) -> list[tuple[int, str, float, float]]:
    rows = []
    for path in directory.glob("*.log"):
        for line in path.read_text().splitlines():
            tag, job, key, started, ended = line.split()
            if tag == kind:
                rows.append((int(job), key, float(started), float(ended)))
    return rows


@pytest.fixture
def workers(tmp_path: Path) -> Iterator[list[subprocess.Popen[bytes]]]:
    """The app above in ``tmp_path`` and its ledger directory; the worker processes the test
    starts (``_start_workers``) are stopped by PID at the end."""
    (tmp_path / "flowapp.py").write_text(textwrap.dedent(APP))
    (tmp_path / "ledger").mkdir()
    started: list[subprocess.Popen[bytes]] = []
    yield started
    for proc in started:
        proc.terminate()
    for proc in started:
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _start_workers(tmp_path: Path, database_url: URL, into: list[subprocess.Popen[bytes]]) -> None:
    env = {
        **pgqueue_env(),
        "DB_URL": database_url.render_as_string(hide_password=False),
        "LEDGER_DIR": str(tmp_path / "ledger"),
    }
    for n in range(4):
        with (tmp_path / f"worker{n}.err").open("wb") as log:
            into.append(
                subprocess.Popen(
                    pgqueue_command("worker", "flowapp:pgq", "--concurrency", "8"),
                    cwd=tmp_path,
                    env=env,
                    stdout=subprocess.DEVNULL,
                    stderr=log,
                )
            )


def _given_back(tmp_path: Path) -> int:
    """How many jobs the workers gave back unstarted (their handler could not start within the
    rate limit's margin), from the workers' logs."""
    logs = (path.read_text() for path in tmp_path.glob("worker*.err"))
    return sum(text.count("could not start within") for text in logs)


@pytest.fixture
def busy_host() -> Iterator[None]:
    """Two CPU-bound processes per core for the test's duration, so handlers start late."""
    burn = [sys.executable, "-c", "while True: pass"]
    burners = [subprocess.Popen(burn) for _ in range(2 * (os.cpu_count() or 1))]
    yield
    for proc in burners:
        proc.kill()
        proc.wait()


def _wait_until_registered(pgq: PgQueue, count: int) -> None:
    wait_until(
        lambda: len(pgq.admin.list_workers()) >= count,
        60,
        f"{count} worker processes to register",
        interval=0.1,
    )


def _running(pgq: PgQueue, queue: str) -> int:
    with pgq.engine.connect() as c:
        return int(
            c.execute(
                text("SELECT count(*) FROM pgqueue_jobs WHERE queue = :q AND state = 'running'"),
                {"q": queue},
            ).scalar_one()
        )


def test_key_limit_two_over_twenty_keys_across_four_processes(
    pgq: PgQueue,
    database_url: URL,
    tmp_path: Path,
    workers: list[subprocess.Popen[bytes]],
) -> None:
    @pgq.task(
        name="per_account",
        queue="accounts",
        concurrency_key=lambda account, n: f"account:{account}",
        key_limit=2,
    )
    def per_account(account: int, n: int) -> None:
        raise AssertionError("runs in the worker processes")

    _start_workers(tmp_path, database_url, workers)
    _wait_until_registered(pgq, 4)
    busy = per_account.enqueue_many([[n % 20, n] for n in range(2000)])
    # The keys are busy, hundreds of tickets wait behind them.
    wait_until(lambda: _running(pgq, "accounts"), 30, "the busy keys' jobs to run")
    lone_enqueued = time.time()
    lone = per_account.enqueue_many([[99, 2000]])
    wait_for_states(pgq, [*busy, *lone], {JobState.SUCCEEDED}, timeout=180)
    rows = _ledger(tmp_path / "ledger", "key")
    assert sorted(job for job, *_ in rows) == list(range(2001))  # each ran exactly once
    per_key: dict[str, list[tuple[float, float]]] = defaultdict(list)
    for _, key, started, ended in rows:
        per_key[key].append((started, ended))
    peaks = {key: _peak(intervals) for key, intervals in per_key.items() if key != "account:99"}
    assert set(peaks.values()) == {2}, peaks
    [(_, _, lone_started, _)] = [row for row in rows if row[0] == 2000]
    assert lone_started - lone_enqueued < 1.0
    assert set(states_of(pgq, busy).values()) == {JobState.SUCCEEDED}
    print(f"lone key started {lone_started - lone_enqueued:.3f} s after its enqueue")


def _run_rated(
    pgq: PgQueue,
    database_url: URL,
    tmp_path: Path,
    workers: list[subprocess.Popen[bytes]],
    count: int,
) -> tuple[list[tuple[int, str, float, float]], float]:
    """Four worker processes run ``count`` jobs of the queue ``rated`` at 50 per 1 s; the
    ledger's rows (each job checked to have run exactly once) and the time of the enqueue."""

    @pgq.task(name="rated", queue="rated")
    def rated(n: int) -> None:
        raise AssertionError("runs in the worker processes")

    pgq.set_rate_limit("rated", 50, per=1)
    _start_workers(tmp_path, database_url, workers)
    _wait_until_registered(pgq, 4)
    enqueued = time.time()
    ids = rated.enqueue_many([[n] for n in range(count)])
    wait_for_states(pgq, ids, {JobState.SUCCEEDED}, timeout=120)
    rows = _ledger(tmp_path / "ledger", "rate")
    assert sorted(job for job, *_ in rows) == list(range(count))
    return rows, enqueued


def test_rate_fifty_per_second_over_five_hundred_jobs(
    pgq: PgQueue,
    database_url: URL,
    tmp_path: Path,
    workers: list[subprocess.Popen[bytes]],
) -> None:
    rows, began = _run_rated(pgq, database_url, tmp_path, workers, 500)
    starts = [started for _, _, started, _ in rows]
    assert most_in_window(starts, 1.0) <= 50
    finished = max(ended for *_, ended in rows) - began
    with pgq.engine.connect() as c:
        claimed_at = dict(
            c.execute(
                text("SELECT (args->>0)::int, extract(epoch FROM started_at) FROM pgqueue_jobs")
            ).all()
        )
    gaps = sorted(started - float(claimed_at[job]) for job, _, started, _ in rows)
    print(
        f"500 rate-limited jobs finished in {finished:.2f} s; claim to handler start: "
        f"median {gaps[250] * 1000:.1f} ms, max {gaps[-1] * 1000:.1f} ms; "
        f"given back unstarted: {_given_back(tmp_path)}"
    )
    # Ten windows of 50: no sooner than 10 s. A limiter that wastes its windows loses about a
    # second per window's worth of unused starts; 3 s of room leaves a loaded host's claim and
    # start delays (under 100 ms each, on each of the ten windows) out of the verdict and still
    # catches a limiter that wastes three windows of ten.
    assert 10.0 <= finished <= 13.0


def test_rate_holds_on_an_overloaded_host(
    pgq: PgQueue,
    database_url: URL,
    tmp_path: Path,
    workers: list[subprocess.Popen[bytes]],
    busy_host: None,
) -> None:
    rows, _ = _run_rated(pgq, database_url, tmp_path, workers, 300)
    starts = [started for _, _, started, _ in rows]
    print(
        f"most starts in a 1 s window: {most_in_window(starts, 1.0)}; "
        f"given back unstarted: {_given_back(tmp_path)}"
    )
    assert most_in_window(starts, 1.0) <= 50
