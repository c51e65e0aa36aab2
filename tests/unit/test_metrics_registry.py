"""``pgqueue.metrics`` without a database: optional dependency, settings, the no-op object's
shape, the gauges' bookkeeping, bounded label values, removed series (in one process and in
multiprocess mode), and mounting the registry in a Flask app."""

from __future__ import annotations

import inspect
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
from flask import Flask
from prometheus_client import CollectorRegistry, generate_latest, make_wsgi_app, values
from prometheus_client.parser import text_string_to_metric_families
from werkzeug.middleware.dispatcher import DispatcherMiddleware

from pgqueue import metrics
from pgqueue.config import Settings
from pgqueue.errors import ConfigurationError

WITHOUT_CLIENT = """
import sys
sys.modules["prometheus_client"] = None  # as if the metrics extra were not installed
import pgqueue
from pgqueue import metrics
from pgqueue.errors import ConfigurationError
assert metrics.active() is metrics.NO_METRICS
try:
    metrics.enable()
except ConfigurationError as exc:
    print(exc)
"""


def test_pgqueue_imports_without_prometheus_client_and_asking_names_the_extra() -> None:
    done = subprocess.run(
        [sys.executable, "-c", WITHOUT_CLIENT], capture_output=True, text=True, check=True
    )
    assert (
        done.stdout.strip()
        == 'metrics need prometheus-client: pip install "sqlalchemy-pgqueue[metrics]"'
    )


def test_metrics_port_and_interval_come_from_the_environment() -> None:
    settings = Settings.from_env({"PGQUEUE_METRICS_PORT": "9187", "PGQUEUE_METRICS_INTERVAL": "5"})
    assert (settings.metrics_port, settings.metrics_interval) == (9187, 5.0)
    assert Settings.from_env({}).metrics_port is None
    for bad in (0, 70_000, True):
        with pytest.raises(ConfigurationError, match="metrics_port"):
            Settings(metrics_port=bad)
    with pytest.raises(ConfigurationError, match="metrics_interval"):
        Settings(metrics_interval=0)


def test_metrics_listen_on_loopback_unless_an_address_is_given() -> None:
    assert Settings().metrics_address == "127.0.0.1"
    assert Settings.from_env({}).metrics_address == "127.0.0.1"
    assert metrics.DEFAULT_ADDRESS == "127.0.0.1"
    for address in ("0.0.0.0", "::", "192.0.2.7", "metrics.internal"):
        env = {"PGQUEUE_METRICS_ADDRESS": address}
        assert Settings.from_env(env).metrics_address == address
    for bad in ("", "not an address", "300.1.1.1", "[::1]", "host:9187", 9187):
        with pytest.raises(ConfigurationError, match="metrics_address must be an IP address"):
            Settings(metrics_address=bad)


def test_the_no_op_object_has_every_method_of_the_real_one() -> None:
    real = {
        name: inspect.signature(member)
        for name, member in vars(metrics.Metrics).items()
        if callable(member) and not name.startswith("_")
    }
    for name, signature in real.items():
        assert inspect.signature(getattr(metrics.NoMetrics, name)) == signature, name
    assert not metrics.NO_METRICS.enabled


def sample(registry: object, name: str, **labels: str) -> float | None:
    value = registry.get_sample_value(name, labels)  # type: ignore[attr-defined]
    return None if value is None else float(value)


def test_counts_durations_and_gauges_land_in_the_registry() -> None:
    recorded = metrics.Metrics()
    recorded.track_tasks({"send"})
    registry = recorded.registry
    for _ in range(3):
        recorded.finished("mail", "send", metrics.SUCCEEDED, 0.02)
    recorded.finished("mail", "send", metrics.FAILED, 2.0)
    recorded.claimed(4)
    recorded.rescued(2)
    finished = "pgqueue_jobs_finished_total"
    assert sample(registry, finished, queue="mail", task="send", outcome="succeeded") == 3
    assert sample(registry, finished, queue="mail", task="send", outcome="failed") == 1
    assert sample(registry, "pgqueue_job_duration_seconds_count", queue="mail", task="send") == 4
    assert sample(registry, "pgqueue_claims_total") == 4
    assert sample(registry, "pgqueue_rescued_total") == 2

    recorded.running({"mail": 2})
    recorded.queue_figures({"mail": {"queued": 7, "running": 2}}, {"mail": 12.5})
    assert sample(registry, "pgqueue_jobs_running", queue="mail") == 2
    assert sample(registry, "pgqueue_queue_jobs", queue="mail", state="queued") == 7
    assert sample(registry, "pgqueue_queue_oldest_ready_seconds", queue="mail") == 12.5

    # A state without jobs reads 0; a future ticket is not "ready".
    recorded.queue_figures({"mail": {"queued": 0, "running": 2}}, {"mail": -30.0})
    assert sample(registry, "pgqueue_queue_jobs", queue="mail", state="queued") == 0
    assert sample(registry, "pgqueue_queue_oldest_ready_seconds", queue="mail") == 0


def scrape_lines(registry: object) -> list[str]:
    """The sample lines of one scrape (no ``# HELP``/``# TYPE``)."""
    text = generate_latest(registry).decode()  # type: ignore[arg-type]
    return [line for line in text.splitlines() if line and not line.startswith("#")]


def label_values(registry: object, label: str) -> set[str]:
    text = generate_latest(registry).decode()  # type: ignore[arg-type]
    return {
        sample.labels[label]
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if label in sample.labels
    }


def test_unknown_tasks_and_queues_past_the_limit_share_one_label_each() -> None:
    recorded = metrics.Metrics()
    recorded.track_tasks({"send"})
    names = [f"q{i:03d}" for i in range(300)]
    recorded.queue_figures(
        {queue: {"queued": 1, "failed": 1} for queue in names}, dict.fromkeys(names, 5.0)
    )
    for i, queue in enumerate(names):
        recorded.finished(queue, f"ghost_{i}", metrics.FAILED, 0.01)
    recorded.running({queue: 1 for queue in names})
    recorded.finished("q000", "send", metrics.SUCCEEDED, 0.01)

    lines = scrape_lines(recorded.registry)
    assert label_values(recorded.registry, "task") == {"unknown", "send"}
    queues = label_values(recorded.registry, "queue")
    assert len(queues) == metrics.QUEUE_LABEL_LIMIT + 1
    assert "other" in queues
    # One named queue: 1 counter and 21 histogram lines (+ 2 "created") per outcome of its
    # one task label, 2 job states, its oldest wait and its running count.
    per_queue = 2 * (2 + 22) + 2 + 1 + 1
    assert len(lines) <= (metrics.QUEUE_LABEL_LIMIT + 1) * per_queue + 10

    registry = recorded.registry
    finished = "pgqueue_jobs_finished_total"
    assert sample(registry, finished, queue="other", task="unknown", outcome="failed") == 250
    assert sample(registry, "pgqueue_queue_jobs", queue="other", state="queued") == 250
    assert sample(registry, "pgqueue_jobs_running", queue="other") == 250
    assert sample(registry, "pgqueue_queue_oldest_ready_seconds", queue="other") == 5.0


def test_the_label_mapping_is_cached_and_the_cache_is_bounded(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    recorded = metrics.Metrics()
    recorded.track_tasks({"send"})
    recorded.finished("mail", "ghost", metrics.FAILED, 0.1)
    recorded.finished("mail", "ghost", metrics.FAILED, 0.1)
    # The second call used the cached children: resolving again would fail here.
    monkeypatch.setattr(recorded, "_finished_children", None)
    recorded.finished("mail", "ghost", metrics.FAILED, 0.1)
    finished = "pgqueue_jobs_finished_total"
    sampled = sample(recorded.registry, finished, queue="mail", task="unknown", outcome="failed")
    assert sampled == 3
    monkeypatch.undo()

    for i in range(metrics.CHILD_CACHE_LIMIT + 100):
        recorded.finished("mail", f"ghost_{i}", metrics.FAILED, 0.1)
    assert len(recorded._children) == metrics.CHILD_CACHE_LIMIT


def test_series_of_vanished_queues_are_removed() -> None:
    recorded = metrics.Metrics()
    registry = recorded.registry
    recorded.running({"mail": 2, "books": 1})
    recorded.queue_figures(
        {"mail": {"queued": 7}, "books": {"queued": 1}}, {"mail": 12.5, "books": 1.0}
    )
    recorded.running({"books": 1})
    recorded.queue_figures({"books": {"queued": 1}}, {"books": 1.0})
    assert sample(registry, "pgqueue_queue_jobs", queue="mail", state="queued") is None
    assert sample(registry, "pgqueue_queue_oldest_ready_seconds", queue="mail") is None
    assert sample(registry, "pgqueue_jobs_running", queue="mail") is None
    assert sample(registry, "pgqueue_jobs_running", queue="books") == 1
    assert sample(registry, "pgqueue_queue_jobs", queue="books", state="queued") == 1
    assert 'queue="mail"' not in generate_latest(registry).decode()

    # A queue that comes back gets its series back.
    recorded.queue_figures({"mail": {"queued": 3}}, {"mail": 2.0})
    assert sample(registry, "pgqueue_queue_jobs", queue="mail", state="queued") == 3

    recorded.workflow_figures({"running": 2, "succeeded": 5})
    recorded.workflow_figures({"succeeded": 6})
    assert sample(registry, "pgqueue_workflows", state="succeeded") == 6
    assert sample(registry, "pgqueue_workflows", state="running") is None
    recorded.workflow_figures({})  # another worker reads them now
    assert "pgqueue_workflows{" not in generate_latest(registry).decode()


def test_series_of_vanished_queues_are_removed_in_multiprocess_mode(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(metrics.MULTIPROCESS_DIR_VARIABLE, str(tmp_path))
    # prometheus-client picks its value class at import; a worker process has the variable
    # set before that.
    monkeypatch.setattr(values, "ValueClass", values.MultiProcessValue())
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no "removal not implemented" warning either
        recorded = metrics.Metrics()
        recorded.running({"mail": 2, "books": 1})
        recorded.queue_figures(
            {"mail": {"queued": 7}, "books": {"queued": 1}}, {"mail": 12.5, "books": 1.0}
        )
        recorded.workflow_figures({"running": 2, "failed": 1})
        recorded.queue_figures({"mail": {"queued": 7}}, {"mail": 12.5}, {"mail": 4})
        recorded.running({"books": 1})
        recorded.queue_figures({"books": {"queued": 1}}, {"books": 1.0})
        recorded.workflow_figures({"running": 3})
    # What this process's registry serves, then what a supervisor serves for its group: the
    # files of every process, merged.
    for registry in (recorded.registry, None):
        if registry is None:
            registry = group = CollectorRegistry()
            group.register(metrics.FilesCollector(str(tmp_path)))
        assert sample(registry, "pgqueue_queue_jobs", queue="mail", state="queued") is None
        assert sample(registry, "pgqueue_queue_oldest_ready_seconds", queue="mail") is None
        assert sample(registry, "pgqueue_jobs_running", queue="mail") is None
        assert sample(registry, "pgqueue_jobs_running", queue="books") == 1
        assert sample(registry, "pgqueue_queue_jobs", queue="books", state="queued") == 1
        assert sample(registry, "pgqueue_queue_jobs_unregistered", queue="mail") is None
        assert sample(registry, "pgqueue_workflows", state="running") == 3
        assert sample(registry, "pgqueue_workflows", state="failed") is None
        assert not [line for line in scrape_lines(registry) if line.endswith(" NaN")]

    recorded.queue_figures({"mail": {"queued": 3}}, {"mail": 2.0})
    assert sample(group, "pgqueue_queue_jobs", queue="mail", state="queued") == 3


def test_a_flask_app_mounts_the_registry(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(metrics, "_active", None)  # this test's own process-wide metrics
    app = Flask(__name__)
    app.wsgi_app = DispatcherMiddleware(  # type: ignore[method-assign]
        app.wsgi_app, {"/metrics": make_wsgi_app(metrics.registry())}
    )
    metrics.active().track_tasks({"task"})
    metrics.active().finished("default", "task", metrics.RETRIED, 0.1)
    body = app.test_client().get("/metrics").get_data(as_text=True)
    assert 'pgqueue_jobs_finished_total{outcome="retried",queue="default",task="task"} 1.0' in body
