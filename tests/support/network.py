"""Ports on this machine for the servers a test starts (PgBouncer, PostgreSQL, a worker's
metrics endpoint): one free TCP port of 127.0.0.1."""

from __future__ import annotations

import socket


def free_port() -> int:
    """A TCP port of 127.0.0.1 that nothing listens on (now: the caller binds it soon)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])
