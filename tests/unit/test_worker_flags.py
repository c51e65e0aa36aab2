"""``pgqueue worker``'s setting flags: a flag not given leaves the app's setting alone, a flag
given overrides it, and a supervisor hands its children the flags it was given (but the
metrics endpoint's, which it serves itself)."""

from __future__ import annotations

from typing import Any

from pgqueue.cli.workers import setting_argv, setting_overrides, worker
from pgqueue.config import Settings


def _flags(*argv: str) -> dict[str, Any]:
    return dict(worker.make_context("worker", ["app:pgq", *argv]).params)


def test_flags_not_given_override_nothing() -> None:
    assert setting_overrides(_flags()) == {}


def test_flags_given_override_their_settings_and_reach_the_children() -> None:
    flags = _flags(
        "-c", "3", "--no-listen", "--poll-interval", "0.5", "--lease-seconds", "6",
        "--shutdown-timeout", "0", "--metrics-port", "9100", "--metrics-address", "0.0.0.0",
    )  # fmt: skip
    overrides = setting_overrides(flags)
    assert overrides == {
        "concurrency": 3,
        "listen": False,
        "poll_interval": 0.5,
        "lease_seconds": 6.0,
        "shutdown_timeout": 0.0,
        "metrics_port": 9100,
        "metrics_address": "0.0.0.0",
    }
    settings = Settings().overridden(**overrides)
    assert (settings.concurrency, settings.effective_heartbeat_interval) == (3, 2.0)
    child = setting_overrides(_flags(*setting_argv(overrides)))
    assert child == {k: v for k, v in overrides.items() if not k.startswith("metrics_")}


def test_the_help_names_each_settings_variable_and_default() -> None:
    shown = " ".join(worker.get_help(worker.make_context("worker", ["app:pgq"])).split())
    assert "$PGQUEUE_CONCURRENCY, else 10" in shown
    assert "$PGQUEUE_POLL_INTERVAL, else 1)" in shown
    assert "$PGQUEUE_METRICS_ADDRESS, else 127.0.0.1" in shown
