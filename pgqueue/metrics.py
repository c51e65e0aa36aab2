"""Prometheus metrics of workers: their definitions, the ``/metrics`` HTTP server, and the
registry a host application can mount.

prometheus-client is optional (the ``metrics`` extra): nothing here imports it until metrics are
asked for, and asking without it raises one ``ConfigurationError`` naming the install command.

A worker's services call one ``Metrics`` object. When metrics are off they call ``NO_METRICS``,
whose methods do nothing, so the per-job cost is one empty call. When on, an outcome costs one
counter increment and one histogram observation on label children cached per (queue, task).

Under ``--processes N`` the supervisor serves one endpoint for the group (``serve_group``): it
creates a directory, passes it to the children in ``PROMETHEUS_MULTIPROC_DIR`` (prometheus-client's
multiprocess mode, where each child writes its values to memory-mapped files there), aggregates
those files on each scrape, and removes the directory when it stops. The children serve nothing.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import shutil
import tempfile
import threading
from collections.abc import Callable, Iterator, Mapping
from typing import Any, Final

from pgqueue.errors import ConfigurationError

MULTIPROCESS_DIR_VARIABLE: Final = "PROMETHEUS_MULTIPROC_DIR"
DEFAULT_ADDRESS: Final = "0.0.0.0"  # noqa: S104 - scraped from other hosts
INSTALL_HINT: Final = 'metrics need prometheus-client: pip install "pgqueue[metrics]"'

# Outcome label values of ``pgqueue_jobs_finished_total``.
SUCCEEDED: Final = "succeeded"
RETRIED: Final = "retried"
FAILED: Final = "failed"
CANCELLED: Final = "cancelled"
LEASE_LOST: Final = "lease_lost"

# Jobs range from milliseconds to an hour; the default buckets stop at 10 s.
DURATION_BUCKETS: Final = (
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
    60.0,
    120.0,
    300.0,
    900.0,
    3600.0,
)


def _prometheus() -> Any:
    try:
        import prometheus_client
    except ImportError:
        raise ConfigurationError(INSTALL_HINT) from None
    return prometheus_client


def _multiprocess() -> Any:
    _prometheus()
    return importlib.import_module("prometheus_client.multiprocess")


def multiprocess_dir() -> str | None:
    """The multiprocess directory this process writes to, if any."""
    return os.environ.get(MULTIPROCESS_DIR_VARIABLE) or None


class NoMetrics:
    """Metrics switched off: every call does nothing."""

    enabled = False

    def finished(self, queue: str, task: str, outcome: str, duration: float) -> None:
        pass

    def claimed(self, count: int) -> None:
        pass

    def rescued(self, count: int) -> None:
        pass

    def claim_failed(self) -> None:
        pass

    def running(self, per_queue: Mapping[str, int]) -> None:
        pass

    def queue_figures(
        self, counts: Mapping[str, Mapping[str, int]], oldest_ready: Mapping[str, float]
    ) -> None:
        pass


NO_METRICS: Final = NoMetrics()


class Metrics(NoMetrics):
    """pgqueue's metrics, registered on ``self.registry`` (one per process)."""

    enabled = True

    def __init__(self) -> None:
        client = _prometheus()
        multiprocess = multiprocess_dir() is not None
        # In multiprocess mode values live in the directory's files and are read by a
        # MultiProcessCollector; registering the metrics themselves would report them twice.
        own = client.CollectorRegistry(auto_describe=True)
        target = None if multiprocess else own
        self.registry = own
        if multiprocess:
            _multiprocess().MultiProcessCollector(own)
        self._finished = client.Counter(
            "pgqueue_jobs_finished",
            "Attempts finished by this worker, by outcome.",
            ["queue", "task", "outcome"],
            registry=target,
        )
        self._duration = client.Histogram(
            "pgqueue_job_duration_seconds",
            "Time from claim to outcome of each finished attempt.",
            ["queue", "task"],
            buckets=DURATION_BUCKETS,
            registry=target,
        )
        self._running = client.Gauge(
            "pgqueue_jobs_running",
            "Attempts this worker runs now (leased and atomic, claimed and not yet written).",
            ["queue"],
            registry=target,
            multiprocess_mode="livesum",
        )
        self._claims = client.Counter(
            "pgqueue_claims", "Jobs claimed by this worker.", registry=target
        )
        self._claim_failures = client.Counter(
            "pgqueue_claim_failures",
            "Claim attempts of this worker that failed (a worker whose claims fail takes no work).",
            registry=target,
        )
        self._rescued = client.Counter(
            "pgqueue_rescued",
            "Jobs whose lease expired, re-queued or failed by this worker's maintenance.",
            registry=target,
        )
        self._queue_jobs = client.Gauge(
            "pgqueue_queue_jobs",
            "Jobs in the database by queue and state (each count stops at its cap).",
            ["queue", "state"],
            registry=target,
            multiprocess_mode="mostrecent",
        )
        self._oldest_ready = client.Gauge(
            "pgqueue_queue_oldest_ready_seconds",
            "How long the oldest job ready to run in each queue has waited (0: none waits).",
            ["queue"],
            registry=target,
            multiprocess_mode="mostrecent",
        )
        self._children: dict[tuple[str, str, str], tuple[Any, Any]] = {}
        self._running_queues: set[str] = set()
        self._figure_queues: set[tuple[str, str]] = set()
        self._lock = threading.Lock()

    def finished(self, queue: str, task: str, outcome: str, duration: float) -> None:
        key = (queue, task, outcome)
        children = self._children.get(key)
        if children is None:
            children = self._children[key] = (
                self._finished.labels(queue, task, outcome),
                self._duration.labels(queue, task),
            )
        children[0].inc()
        children[1].observe(duration)

    def claimed(self, count: int) -> None:
        self._claims.inc(count)

    def rescued(self, count: int) -> None:
        self._rescued.inc(count)

    def claim_failed(self) -> None:
        self._claim_failures.inc()

    def running(self, per_queue: Mapping[str, int]) -> None:
        with self._lock:
            for queue in self._running_queues - per_queue.keys():
                self._running.labels(queue).set(0)
            for queue, count in per_queue.items():
                self._running.labels(queue).set(count)
            self._running_queues |= per_queue.keys()

    def queue_figures(
        self, counts: Mapping[str, Mapping[str, int]], oldest_ready: Mapping[str, float]
    ) -> None:
        """Set the database-derived gauges from one reading; queues gone since read as 0."""
        with self._lock:
            seen = {(queue, state) for queue, by_state in counts.items() for state in by_state}
            for queue, state in self._figure_queues - seen:
                self._queue_jobs.labels(queue, state).set(0)
            for queue, by_state in counts.items():
                for state, count in by_state.items():
                    self._queue_jobs.labels(queue, state).set(count)
                self._oldest_ready.labels(queue).set(max(0.0, oldest_ready.get(queue, 0.0)))
            self._figure_queues |= seen


_active: Metrics | None = None
_active_lock = threading.Lock()


def enable() -> Metrics:
    """This process's ``Metrics``, created on first call (raises without prometheus-client)."""
    global _active
    with _active_lock:
        if _active is None:
            _active = Metrics()
        return _active


def active() -> NoMetrics:
    """The process's ``Metrics`` if enabled, else ``NO_METRICS``."""
    return _active if _active is not None else NO_METRICS


def registry() -> Any:
    """The ``CollectorRegistry`` holding pgqueue's metrics, for a host app to expose (say with
    ``prometheus_client.make_wsgi_app(pgqueue.metrics.registry())``). Enables metrics, so a
    worker started later in this process records into it."""
    return enable().registry


class MetricsServer:
    """A running ``/metrics`` HTTP server; ``close()`` stops it."""

    def __init__(self, port: int, registry: Any, address: str = DEFAULT_ADDRESS) -> None:
        client = _prometheus()
        self.port = port
        try:
            self._server, self._thread = client.start_http_server(
                port, addr=address, registry=registry
            )
        except OSError as exc:
            raise ConfigurationError(
                f"cannot serve metrics on {address}:{port}: {exc.strerror or exc}"
            ) from None

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()


def serve(port: int, address: str = DEFAULT_ADDRESS) -> MetricsServer:
    """Serve this process's metrics on ``port``."""
    return MetricsServer(port, enable().registry, address)


@contextlib.contextmanager
def serve_group(port: int, address: str = DEFAULT_ADDRESS) -> Iterator[Callable[[int], None]]:
    """Serve the metrics of child processes started inside this block (they inherit
    ``PROMETHEUS_MULTIPROC_DIR``). Yields the callback to call with the PID of each child that
    exited, so its live gauges stop counting. The directory is removed at the end."""
    client = _prometheus()
    multiprocess_module = _multiprocess()
    directory = tempfile.mkdtemp(prefix="pgqueue-metrics-")
    previous = os.environ.get(MULTIPROCESS_DIR_VARIABLE)
    os.environ[MULTIPROCESS_DIR_VARIABLE] = directory
    server = None
    try:
        group = client.CollectorRegistry()
        multiprocess_module.MultiProcessCollector(group, path=directory)
        server = MetricsServer(port, group, address)

        def child_exited(pid: int) -> None:
            multiprocess_module.mark_process_dead(pid, path=directory)

        yield child_exited
    finally:
        if server is not None:
            server.close()
        if previous is None:
            os.environ.pop(MULTIPROCESS_DIR_VARIABLE, None)
        else:
            os.environ[MULTIPROCESS_DIR_VARIABLE] = previous
        shutil.rmtree(directory, ignore_errors=True)
