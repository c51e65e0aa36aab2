"""Prometheus ``/metrics`` of real worker processes: the counts of what they did, the duration
histogram, and the queue gauges read from the database; one endpoint for ``--processes 2``."""

from __future__ import annotations

import signal
import socket
import time
import urllib.request
from collections import defaultdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

from prometheus_client.parser import text_string_to_metric_families

if TYPE_CHECKING:
    from conftest import App

FAST_GAUGES = {"metrics_interval": 0.3}


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def scrape(port: int) -> dict[str, dict[tuple[tuple[str, str], ...], float]]:
    """``{sample name: {sorted label pairs: value}}`` from the endpoint."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        body = response.read().decode()
    samples: dict[str, dict[tuple[tuple[str, str], ...], float]] = defaultdict(dict)
    for family in text_string_to_metric_families(body):
        for sample in family.samples:
            samples[sample.name][tuple(sorted(sample.labels.items()))] = sample.value
    return samples


def scrape_when(port: int, ready: Any, app: App) -> dict[str, Any]:
    def attempt() -> dict[str, Any] | None:
        try:
            samples = scrape(port)
        except OSError:
            return None
        return samples if ready(samples) else None

    return dict(app.wait_until(attempt, 30, "the expected metrics", interval=0.2))


def finished(samples: dict[str, Any]) -> dict[tuple[str, str, str], float]:
    return {
        (dict(labels)["queue"], dict(labels)["task"], dict(labels)["outcome"]): value
        for labels, value in samples.get("pgqueue_jobs_finished_total", {}).items()
    }


def table_counts(app: App) -> dict[tuple[str, str], int]:
    rows = app.rows("SELECT queue, state, count(*) FROM pgqueue_jobs GROUP BY 1, 2")
    return {(queue, state): int(count) for queue, state, count in rows}


def test_metrics_count_outcomes_durations_and_queue_gauges(app: App) -> None:
    port = free_port()
    worker = app.start_worker("--concurrency", "4", "--metrics-port", str(port), **FAST_GAUGES)
    succeeded = app.module.record.enqueue_many([{}] * 50)
    failed = app.module.flaky.configure(max_attempts=1, queue="risky").enqueue_many(
        [{"fail_ratio": 1.0}] * 5
    )
    app.module.record.configure(queue="later", delay=3600).enqueue_many([{}] * 3)
    app.wait_final(succeeded + failed, timeout=60)

    expected_gauges = table_counts(app)
    assert expected_gauges[("default", "succeeded")] == 50
    assert expected_gauges[("risky", "failed")] == 5
    assert expected_gauges[("later", "queued")] == 3

    def gauges(samples: dict[str, Any]) -> dict[tuple[str, str], float]:
        return {
            (dict(labels)["queue"], dict(labels)["state"]): value
            for labels, value in samples.get("pgqueue_queue_jobs", {}).items()
            if value
        }

    samples = scrape_when(
        port,
        lambda s: sum(finished(s).values()) >= 55 and gauges(s) == expected_gauges,
        app,
    )
    assert finished(samples) == {
        ("default", "record", "succeeded"): 50,
        ("risky", "flaky", "failed"): 5,
    }
    counts = {
        (dict(labels)["queue"], dict(labels)["task"]): value
        for labels, value in samples["pgqueue_job_duration_seconds_count"].items()
    }
    assert counts == {("default", "record"): 50, ("risky", "flaky"): 5}
    assert sum(counts.values()) == 55
    assert samples["pgqueue_claims_total"][()] == 55
    assert samples["pgqueue_rescued_total"][()] == 0
    assert gauges(samples) == expected_gauges
    oldest = {
        dict(labels)["queue"]: v
        for labels, v in samples["pgqueue_queue_oldest_ready_seconds"].items()
    }
    assert oldest["later"] == 0  # its jobs are scheduled an hour ahead: none is ready
    running = samples.get("pgqueue_jobs_running", {})
    assert all(value == 0 for value in running.values())
    assert "serving metrics on port" in worker.log()


def test_processes_share_one_endpoint_whose_totals_add_up(app: App) -> None:
    port = free_port()
    supervisor = app.start_worker(
        "--processes", "2", "--concurrency", "2", "--metrics-port", str(port), **FAST_GAUGES
    )
    ids = app.module.sleep.enqueue_many([{"seconds": 0.2}] * 24)
    app.wait_final(ids, timeout=60)
    pids = {row.pid for row in app.ledger("end")}
    assert len(pids) == 2  # both children ran jobs

    def succeeded_gauge(samples: dict[str, Any]) -> float:
        return float(
            samples.get("pgqueue_queue_jobs", {}).get(
                (("queue", "default"), ("state", "succeeded")), 0
            )
        )

    # The queue gauges come from one reading, not one per child: they equal the table.
    samples = scrape_when(
        port, lambda s: sum(finished(s).values()) >= 24 and succeeded_gauge(s) == 24, app
    )
    assert finished(samples) == {("default", "sleep", "succeeded"): 24}
    [duration_count] = samples["pgqueue_job_duration_seconds_count"].values()
    assert duration_count == 24
    assert samples["pgqueue_claims_total"][()] == 24
    assert table_counts(app) == {("default", "succeeded"): 24}

    # The children write to the supervisor's directory, which is gone once it stopped.
    [child, *_] = app.children_of(supervisor.pid)
    environ = Path(f"/proc/{child}/environ").read_bytes().split(b"\0")
    [directory] = [
        v.split(b"=", 1)[1] for v in environ if v.startswith(b"PROMETHEUS_MULTIPROC_DIR=")
    ]
    assert Path(directory.decode()).is_dir()
    supervisor.signal(signal.SIGTERM)
    assert supervisor.wait(30) == 0
    assert not Path(directory.decode()).exists()


def test_a_rescue_and_a_lost_lease_are_counted_where_they_happen(app: App) -> None:
    zombie_port, rescuer_port = free_port(), free_port()
    zombie = app.start_worker(
        "--lease-seconds", "2", "--metrics-port", str(zombie_port), rescue_interval=0.5
    )
    [job_id] = app.module.sleep.enqueue_many([{"seconds": 3, "first_run_only": True}])
    app.wait_until(lambda: app.ledger("start"), 30, "the job to start")
    zombie.signal(signal.SIGSTOP)
    try:
        app.start_worker(
            "--lease-seconds", "2", "--metrics-port", str(rescuer_port), rescue_interval=0.5
        )
        app.wait_final([job_id], timeout=60)
        time.sleep(1.5)  # the frozen handler's 3 s sleep ends meanwhile
    finally:
        zombie.signal(signal.SIGCONT)

    rescuer = scrape_when(rescuer_port, lambda s: sum(finished(s).values()) >= 1, app)
    assert rescuer["pgqueue_rescued_total"][()] == 1
    assert finished(rescuer) == {("default", "sleep", "succeeded"): 1}
    lost = scrape_when(zombie_port, lambda s: sum(finished(s).values()) >= 1, app)
    assert finished(lost) == {("default", "sleep", "lease_lost"): 1}
    assert lost["pgqueue_rescued_total"][()] == 0
