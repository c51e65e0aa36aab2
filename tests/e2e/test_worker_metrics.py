"""Prometheus ``/metrics`` of real worker processes: the counts of what they did, the duration
histogram, and the queue gauges read from the database; one endpoint for ``--processes 2``;
the address it listens on; label values bounded however many queues and task names the rows
hold; the gauge series of a queue that is gone removed; and workflows counted by state."""

from __future__ import annotations

import contextlib
import ipaddress
import signal
import socket
import sys
import time
import urllib.request
from collections import defaultdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from prometheus_client.parser import text_string_to_metric_families
from support.network import free_port

from pgqueue import chain, group
from pgqueue.jobs import NewJob

if TYPE_CHECKING:
    from conftest import App

FAST_GAUGES = {"metrics_interval": 0.3}


def scrape_text(port: int, host: str = "127.0.0.1") -> str:
    with urllib.request.urlopen(f"http://{host}:{port}/metrics", timeout=5) as response:
        return str(response.read().decode())


def scrape(
    port: int, host: str = "127.0.0.1"
) -> dict[str, dict[tuple[tuple[str, str], ...], float]]:
    """``{sample name: {sorted label pairs: value}}`` from the endpoint."""
    body = scrape_text(port, host)
    samples: dict[str, dict[tuple[tuple[str, str], ...], float]] = defaultdict(dict)
    for family in text_string_to_metric_families(body):
        for sample in family.samples:
            samples[sample.name][tuple(sorted(sample.labels.items()))] = sample.value
    return samples


def scrape_when(port: int, ready: Any, app: App, timeout: float = 30) -> dict[str, Any]:
    def attempt() -> dict[str, Any] | None:
        try:
            samples = scrape(port)
        except OSError:
            return None
        return samples if ready(samples) else None

    return dict(app.wait_until(attempt, timeout, "the expected metrics", interval=0.2))


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
        lambda s: (
            sum(finished(s).values()) >= 55
            and gauges(s) == expected_gauges
            # the running gauge is sampled apart from the counts, so it may lag them a little
            and not any(s.get("pgqueue_jobs_running", {}).values())
        ),
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
    assert listening_addresses(port) == {"127.0.0.1"}

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


def listening_addresses(port: int) -> set[str]:
    """The local addresses of the TCP sockets listening on ``port`` on this machine."""
    found = set()
    for table, family in (("tcp", socket.AF_INET), ("tcp6", socket.AF_INET6)):
        with contextlib.suppress(OSError):
            for line in Path(f"/proc/net/{table}").read_text().splitlines()[1:]:
                fields = line.split()
                address, port_hex = fields[1].split(":")
                if fields[3] != "0A" or int(port_hex, 16) != port:  # 0A: LISTEN
                    continue
                raw = bytes.fromhex(address)
                if sys.byteorder == "little":  # /proc prints each 32-bit word in host order
                    raw = b"".join(raw[i : i + 4][::-1] for i in range(0, len(raw), 4))
                found.add(socket.inet_ntop(family, raw))
    return found


def outside_address() -> str | None:
    """An IPv4 address of this machine other than loopback, if it has one."""
    candidates = set()
    with contextlib.suppress(OSError):
        candidates |= {
            str(info[4][0])
            for info in socket.getaddrinfo(socket.gethostname(), None, socket.AF_INET)
        }
    with contextlib.suppress(OSError), socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.connect(("192.0.2.1", 9))  # sends nothing: only picks the outgoing interface
        candidates.add(str(probe.getsockname()[0]))
    usable = [a for a in sorted(candidates) if not ipaddress.ip_address(a).is_loopback]
    return next((a for a in usable if a != "0.0.0.0"), None)


def test_metrics_listen_on_loopback_by_default(app: App) -> None:
    port = free_port()
    worker = app.start_worker("--metrics-port", str(port))
    scrape_when(port, lambda s: "pgqueue_claims_total" in s, app)
    assert listening_addresses(port) == {"127.0.0.1"}
    outside = outside_address()
    if outside is not None:
        with pytest.raises(OSError):
            socket.create_connection((outside, port), timeout=5).close()
    assert f"serving metrics on port {port} of 127.0.0.1" in worker.log()


def test_metrics_address_serves_every_interface_when_asked(app: App) -> None:
    port = free_port()
    worker = app.start_worker("--metrics-port", str(port), "--metrics-address", "0.0.0.0")
    scrape_when(port, lambda s: "pgqueue_claims_total" in s, app)
    assert listening_addresses(port) == {"0.0.0.0"}
    outside = outside_address()
    if outside is not None:
        assert "pgqueue_claims_total" in scrape(port, outside)
    assert f"serving metrics on port {port} of 0.0.0.0" in worker.log()


def test_a_bad_metrics_address_is_one_line_and_exit_code_2(app: App) -> None:
    port = str(free_port())
    problem = "metrics_address must be an IP address or a host name, got 'not an address'"
    bad_name = f"error: {problem}"
    # The same setting given in the app's module fails its import, which the line names.
    bad_in_app = f"error: APP 'e2eapp:pgq': importing 'e2eapp' failed: {problem}"
    # 203.0.113.0/24 is reserved for documentation: no machine here has such an address.
    not_here = f"error: cannot serve metrics on 203.0.113.77:{port}:"
    runs = [
        (["--metrics-address", "not an address"], {}, bad_name),
        ([], {"metrics_address": "not an address"}, bad_in_app),
        (["--metrics-address", "203.0.113.77"], {}, not_here),
        (["--processes", "2", "--metrics-address", "203.0.113.77"], {}, not_here),
    ]
    for args, settings, expected in runs:
        worker = app.start_worker("--metrics-port", port, *args, **settings)
        assert worker.wait(60) == 2, worker.log()
        [line] = worker.log().strip().splitlines()
        assert line.startswith(expected), line
    assert app.scalars("SELECT count(*) FROM pgqueue_workers") == [0]


def test_label_values_stay_bounded_with_300_queues_and_300_unknown_tasks(app: App) -> None:
    jobs = [
        NewJob(
            task_name=f"ghost_{i}",
            queue=f"q{i:03d}",
            args_json="[]",
            kwargs_json="{}",
            priority=0,
            max_attempts=1,
            delay=None,
            run_at=None,
            unique_key=None,
            atomic=False,
        )
        for i in range(300)
    ]
    ids = app.module.pgq.enqueuer.insert(None, jobs)
    port = free_port()
    app.start_worker("--concurrency", "8", "--metrics-port", str(port), **FAST_GAUGES)

    def total(samples: dict[str, Any], name: str) -> float:
        return float(sum(samples.get(name, {}).values()))

    # No worker registers the ghosts: each is given back once, then waits. The worker claims
    # and gives back 300 jobs of 300 queues first, which a loaded machine slows many times
    # over: the wait is for that, not a bound on it (the labels are the point).
    samples = scrape_when(
        port,
        lambda s: (
            total(s, "pgqueue_queue_jobs_unregistered") == 300
            and total(s, "pgqueue_jobs_given_back_total") == 300
        ),
        app,
        timeout=120,
    )
    lines = [line for line in scrape_text(port).splitlines() if not line.startswith("#")]
    # Per queue label: 7 states, the oldest wait, the unregistered gauge, the given-back
    # counter (2 lines); plus the unlabelled metrics.
    assert len(lines) <= 51 * 11 + 20, f"{len(lines)} series, {len(scrape_text(port))} bytes"
    assert finished(samples) == {}
    for name in ("pgqueue_queue_jobs_unregistered", "pgqueue_jobs_given_back_total"):
        queues = {dict(labels)["queue"] for labels in samples[name]}
        assert len(queues) == 51 and "other" in queues, name
    figure_queues = {dict(labels)["queue"] for labels in samples["pgqueue_queue_jobs"]}
    assert len(figure_queues) == 51 and "other" in figure_queues
    states = app.rows(
        "SELECT state, attempts, count(*) FROM pgqueue_jobs WHERE id = ANY(:ids) GROUP BY 1, 2",
        ids=ids,
    )
    assert [tuple(row) for row in states] == [("queued", 0, 300)]


@pytest.mark.parametrize("processes", ["1", "2"])
def test_the_gauge_series_of_a_vanished_queue_disappear(app: App, processes: str) -> None:
    port = free_port()
    app.start_worker(
        "--processes", processes, "--concurrency", "2", "--metrics-port", str(port), **FAST_GAUGES
    )
    gauges = ("pgqueue_jobs_running", "pgqueue_queue_jobs", "pgqueue_queue_oldest_ready_seconds")

    def series(samples: dict[str, Any], name: str) -> dict[tuple[tuple[str, str], ...], float]:
        return {
            labels: value
            for labels, value in samples.get(name, {}).items()
            if dict(labels)["queue"] == "brief"
        }

    [job_id] = app.module.sleep.configure(queue="brief").enqueue_many([{"seconds": 2}])
    scrape_when(
        port, lambda s: series(s, "pgqueue_jobs_running") == {(("queue", "brief"),): 1}, app
    )
    app.wait_final([job_id], timeout=30)
    # Nothing of the queue runs: its running series is gone; the job is still in the table.
    scrape_when(
        port,
        lambda s: (
            not series(s, "pgqueue_jobs_running")
            and series(s, "pgqueue_queue_jobs").get((("queue", "brief"), ("state", "succeeded")))
            == 1
        ),
        app,
    )
    app.execute("DELETE FROM pgqueue_jobs WHERE queue = 'brief'")
    samples = scrape_when(port, lambda s: not any(series(s, name) for name in gauges), app)
    assert finished(samples) == {("brief", "sleep", "succeeded"): 1}  # counters stay


def test_workflows_are_counted_by_how_they_ended(app: App) -> None:
    port = free_port()
    app.start_worker("--concurrency", "4", "--metrics-port", str(port), **FAST_GAUGES)
    record, flaky = app.module.record, app.module.flaky
    done = [group(record.si(), record.si()).enqueue() for _ in range(2)]
    failed = chain(record.si(), flaky.si(fail_ratio=1.0).set(max_attempts=1), record.si()).enqueue()
    waiting = group(record.si().set(delay=3600)).enqueue()
    for workflow in [*done, failed]:
        app.module.pgq.wait_for_workflow(workflow.id, timeout=60)

    def workflows(samples: dict[str, Any]) -> dict[str, float]:
        return {
            dict(labels)["state"]: value
            for labels, value in samples.get("pgqueue_workflows", {}).items()
            if value
        }

    expected = {"succeeded": 2, "failed": 1, "running": 1}
    samples = scrape_when(port, lambda s: workflows(s) == expected, app)
    assert workflows(samples) == expected
    assert app.module.pgq.get_workflow(waiting.id).state == "running"
