"""``pgqueue.metrics`` without a database: optional dependency, settings, the no-op object's
shape, the gauges' bookkeeping, and mounting the registry in a Flask app."""

from __future__ import annotations

import inspect
import subprocess
import sys

import pytest
from flask import Flask
from prometheus_client import make_wsgi_app
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
    assert done.stdout.strip() == 'metrics need prometheus-client: pip install "pgqueue[metrics]"'


def test_metrics_port_and_interval_come_from_the_environment() -> None:
    settings = Settings.from_env({"PGQUEUE_METRICS_PORT": "9187", "PGQUEUE_METRICS_INTERVAL": "5"})
    assert (settings.metrics_port, settings.metrics_interval) == (9187, 5.0)
    assert Settings.from_env({}).metrics_port is None
    for bad in (0, 70_000, True):
        with pytest.raises(ConfigurationError, match="metrics_port"):
            Settings(metrics_port=bad)
    with pytest.raises(ConfigurationError, match="metrics_interval"):
        Settings(metrics_interval=0)


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

    # A queue that emptied reads 0 rather than its last value; a future ticket is not "ready".
    recorded.running({})
    recorded.queue_figures({"other": {"queued": 1}}, {"other": -30.0})
    assert sample(registry, "pgqueue_jobs_running", queue="mail") == 0
    assert sample(registry, "pgqueue_queue_jobs", queue="mail", state="queued") == 0
    assert sample(registry, "pgqueue_queue_oldest_ready_seconds", queue="other") == 0


def test_a_flask_app_mounts_the_registry(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(metrics, "_active", None)  # this test's own process-wide metrics
    app = Flask(__name__)
    app.wsgi_app = DispatcherMiddleware(  # type: ignore[method-assign]
        app.wsgi_app, {"/metrics": make_wsgi_app(metrics.registry())}
    )
    metrics.active().finished("default", "task", metrics.RETRIED, 0.1)
    body = app.test_client().get("/metrics").get_data(as_text=True)
    assert 'pgqueue_jobs_finished_total{outcome="retried",queue="default",task="task"} 1.0' in body
