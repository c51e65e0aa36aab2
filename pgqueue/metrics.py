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

The endpoint listens on 127.0.0.1 unless ``metrics_address`` says otherwise: it has no
authentication. Label values come from job rows, so they are bounded here: a task the worker's
registry does not hold is counted as ``task="unknown"``, and each process names at most
``QUEUE_LABEL_LIMIT`` queues, the rest counted together as ``queue="other"``. Each label
mapping is decided once per (queue, task, outcome) and cached with its children. Gauge series
of queues that are gone are removed. In multiprocess mode prometheus-client cannot delete a
value from its files, so a removed series is written as a tombstone (NaN for the queue figures,
0 for the running count, which is summed over processes) and the collector that merges the
files leaves tombstones out of the scrape.
"""

from __future__ import annotations

import contextlib
import importlib
import math
import os
import shutil
import tempfile
import threading
from collections.abc import Callable, Container, Iterable, Iterator, Mapping
from typing import Any, Final

from pgqueue.errors import ConfigurationError

MULTIPROCESS_DIR_VARIABLE: Final = "PROMETHEUS_MULTIPROC_DIR"
# This host only, as ``Settings.metrics_address`` (the endpoint has no authentication).
DEFAULT_ADDRESS: Final = "127.0.0.1"
INSTALL_HINT: Final = 'metrics need prometheus-client: pip install "sqlalchemy-pgqueue[metrics]"'

# Outcome label values of ``pgqueue_jobs_finished_total``.
SUCCEEDED: Final = "succeeded"
RETRIED: Final = "retried"
FAILED: Final = "failed"
CANCELLED: Final = "cancelled"
LEASE_LOST: Final = "lease_lost"

# At most this many distinct queue label values per process; further queues share
# ``OTHER_QUEUE``. A name, once given, stays for the life of the process (its counters do).
QUEUE_LABEL_LIMIT: Final = 50
OTHER_QUEUE: Final = "other"
# The task label of jobs whose task the worker's registry does not hold.
UNKNOWN_TASK: Final = "unknown"
# Most (queue, task, outcome) combinations whose label children are cached; past it a new
# combination resolves its labels on each call (a few set lookups), so a flood of distinct
# names in the rows cannot grow the cache.
CHILD_CACHE_LIMIT: Final = 4096

# Gauges whose removed series are written as tombstones in multiprocess mode, and the value
# of each tombstone (see the module docstring).
QUEUE_JOBS: Final = "pgqueue_queue_jobs"
OLDEST_READY: Final = "pgqueue_queue_oldest_ready_seconds"
UNREGISTERED: Final = "pgqueue_queue_jobs_unregistered"
WORKFLOWS: Final = "pgqueue_workflows"
NAN_TOMBSTONES: Final = (QUEUE_JOBS, OLDEST_READY, UNREGISTERED, WORKFLOWS)
JOBS_RUNNING: Final = "pgqueue_jobs_running"

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

    def track_tasks(self, tasks: Container[str]) -> None:
        pass

    def untrack_tasks(self, tasks: Container[str]) -> None:
        pass

    def finished(self, queue: str, task: str, outcome: str, duration: float) -> None:
        pass

    def claimed(self, count: int) -> None:
        pass

    def rescued(self, count: int) -> None:
        pass

    def given_back(self, queue: str) -> None:
        pass

    def claim_failed(self) -> None:
        pass

    def running(self, per_queue: Mapping[str, int]) -> None:
        pass

    def queue_figures(
        self,
        counts: Mapping[str, Mapping[str, int]],
        oldest_ready: Mapping[str, float],
        unregistered: Mapping[str, int] | None = None,
    ) -> None:
        pass

    def workflow_figures(self, counts: Mapping[str, int]) -> None:
        pass


NO_METRICS: Final = NoMetrics()


class Metrics(NoMetrics):
    """pgqueue's metrics, registered on ``self.registry`` (one per process)."""

    enabled = True

    def __init__(self) -> None:
        client = _prometheus()
        directory = multiprocess_dir()
        self._multiprocess = directory is not None
        # In multiprocess mode values live in the directory's files and are read by a
        # collector of those files; registering the metrics themselves would report them twice.
        own = client.CollectorRegistry(auto_describe=True)
        target = None if self._multiprocess else own
        self.registry = own
        if directory is not None:
            own.register(FilesCollector(directory))
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
            JOBS_RUNNING,
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
        self._given_back = client.Counter(
            "pgqueue_jobs_given_back",
            "Jobs this worker claimed and gave back unrun: their task is not registered in it.",
            ["queue"],
            registry=target,
        )
        self._unregistered = client.Gauge(
            UNREGISTERED,
            "Jobs ready to run whose task no live worker serving their queue registers (they "
            "wait for one; each count stops at its cap).",
            ["queue"],
            registry=target,
            multiprocess_mode="mostrecent",
        )
        self._queue_jobs = client.Gauge(
            QUEUE_JOBS,
            "Jobs in the database by queue and state (each count stops at its cap).",
            ["queue", "state"],
            registry=target,
            multiprocess_mode="mostrecent",
        )
        self._oldest_ready = client.Gauge(
            OLDEST_READY,
            "How long the oldest job ready to run in each queue has waited (0: none waits).",
            ["queue"],
            registry=target,
            multiprocess_mode="mostrecent",
        )
        self._workflows = client.Gauge(
            WORKFLOWS,
            "Workflows in the database by state: running, and how they ended (succeeded, "
            "failed, cancelled) among those not yet pruned; each count stops at its cap.",
            ["state"],
            registry=target,
            multiprocess_mode="mostrecent",
        )
        self._workflow_states: set[str] = set()
        self._children: dict[tuple[str, str, str], tuple[Any, Any]] = {}
        self._queue_labels: set[str] = set()
        self._task_registries: list[Container[str]] = []
        self._running_labels: set[str] = set()
        self._figure_keys: set[tuple[str, str]] = set()
        self._oldest_labels: set[str] = set()
        self._unregistered_labels: set[str] = set()
        self._lock = threading.Lock()

    def track_tasks(self, tasks: Container[str]) -> None:
        """Count jobs of the tasks in ``tasks`` (a running worker's task registry, read as it
        grows) under their own names; jobs of tasks in no tracked registry count as
        ``unknown``. Each call is undone by one ``untrack_tasks``."""
        with self._lock:
            self._task_registries.append(tasks)

    def untrack_tasks(self, tasks: Container[str]) -> None:
        """Undo one ``track_tasks(tasks)`` (a worker that stopped), so the metrics, which live
        as long as the process, do not keep its registry alive."""
        with self._lock:
            for index, tracked in enumerate(self._task_registries):
                if tracked is tasks:
                    del self._task_registries[index]
                    return

    def finished(self, queue: str, task: str, outcome: str, duration: float) -> None:
        children = self._children.get((queue, task, outcome))
        if children is None:
            children = self._finished_children(queue, task, outcome)
        children[0].inc()
        children[1].observe(duration)

    def _finished_children(self, queue: str, task: str, outcome: str) -> tuple[Any, Any]:
        with self._lock:
            queue_label = self._queue_label(queue)
            known = any(task in tasks for tasks in self._task_registries)
            task_label = task if known else UNKNOWN_TASK
            children = (
                self._finished.labels(queue_label, task_label, outcome),
                self._duration.labels(queue_label, task_label),
            )
            if len(self._children) < CHILD_CACHE_LIMIT:
                self._children[(queue, task, outcome)] = children
            return children

    def _queue_label(self, queue: str) -> str:
        """The label of ``queue``: its name while names are left, else ``other``. Call with
        ``self._lock`` held."""
        labels = self._queue_labels
        if queue in labels:
            return queue
        if len(labels) < QUEUE_LABEL_LIMIT:
            labels.add(queue)
            return queue
        return OTHER_QUEUE

    def claimed(self, count: int) -> None:
        self._claims.inc(count)

    def rescued(self, count: int) -> None:
        self._rescued.inc(count)

    def claim_failed(self) -> None:
        self._claim_failures.inc()

    def given_back(self, queue: str) -> None:
        with self._lock:
            label = self._queue_label(queue)
        self._given_back.labels(label).inc()

    def running(self, per_queue: Mapping[str, int]) -> None:
        """Set the running counts; a queue with nothing running has no series."""
        with self._lock:
            totals: dict[str, float] = {}
            for queue, count in per_queue.items():
                if count:
                    label = self._queue_label(queue)
                    totals[label] = totals.get(label, 0.0) + count
            for label in self._running_labels - totals.keys():
                self._remove(self._running, (label,), 0.0)
            for label, total in totals.items():
                self._running.labels(label).set(total)
            self._running_labels = set(totals)

    def queue_figures(
        self,
        counts: Mapping[str, Mapping[str, int]],
        oldest_ready: Mapping[str, float],
        unregistered: Mapping[str, int] | None = None,
    ) -> None:
        """Set the database-derived gauges from one reading (``unregistered``: per queue, the
        ready jobs no live worker registers the task of; a queue without any has no series);
        the series of queues not in it are removed. Queues past the label limit are summed (their oldest wait: the longest)
        under ``other``; the busiest queues are named first."""
        with self._lock:
            jobs: dict[tuple[str, str], float] = {}
            oldest: dict[str, float] = {}
            for queue in sorted(counts, key=lambda q: (-sum(counts[q].values()), q)):
                label = self._queue_label(queue)
                for state, count in counts[queue].items():
                    jobs[(label, state)] = jobs.get((label, state), 0.0) + count
                waited = max(0.0, oldest_ready.get(queue, 0.0))
                oldest[label] = max(oldest.get(label, 0.0), waited)
            for key in self._figure_keys - jobs.keys():
                self._remove(self._queue_jobs, key, math.nan)
            for label in self._oldest_labels - oldest.keys():
                self._remove(self._oldest_ready, (label,), math.nan)
            for (label, state), total in jobs.items():
                self._queue_jobs.labels(label, state).set(total)
            for label, waited in oldest.items():
                self._oldest_ready.labels(label).set(waited)
            self._figure_keys = set(jobs)
            self._oldest_labels = set(oldest)
            waiting: dict[str, float] = {}
            for queue, count in (unregistered or {}).items():
                if count:
                    label = self._queue_label(queue)
                    waiting[label] = waiting.get(label, 0.0) + count
            for label in self._unregistered_labels - waiting.keys():
                self._remove(self._unregistered, (label,), math.nan)
            for label, total in waiting.items():
                self._unregistered.labels(label).set(total)
            self._unregistered_labels = set(waiting)

    def workflow_figures(self, counts: Mapping[str, int]) -> None:
        """Set the workflow gauge from one reading (``{state: capped count}``); the series of
        states not in it are removed (a worker that stops reading passes none)."""
        with self._lock:
            for state in self._workflow_states - counts.keys():
                self._remove(self._workflows, (state,), math.nan)
            for state, count in counts.items():
                self._workflows.labels(state).set(count)
            self._workflow_states = set(counts)

    def _remove(self, gauge: Any, labels: tuple[str, ...], tombstone: float) -> None:
        if self._multiprocess:
            # The files keep every series ever written: mark it for FilesCollector to skip.
            gauge.labels(*labels).set(tombstone)
        else:
            gauge.remove(*labels)


def _is_tombstone(name: str, value: float) -> bool:
    if name == JOBS_RUNNING:
        return value == 0
    return name in NAN_TOMBSTONES and math.isnan(value)


class FilesCollector:
    """prometheus-client's ``MultiProcessCollector`` for the files in ``directory``, without
    the series ``Metrics`` removed (their tombstones)."""

    def __init__(self, directory: str) -> None:
        self._files = _multiprocess().MultiProcessCollector(None, path=directory)

    def collect(self) -> Iterable[Any]:
        for metric in self._files.collect():
            if metric.name in NAN_TOMBSTONES or metric.name == JOBS_RUNNING:
                metric.samples = [
                    sample
                    for sample in metric.samples
                    if not _is_tombstone(metric.name, sample.value)
                ]
            yield metric


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
        group.register(FilesCollector(directory))
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
