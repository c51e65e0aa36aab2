"""What a worker needs from its queue object, taken once when the worker is built.

``Worker(pgq, ...)`` accepts anything shaped like ``QueueHost`` (``PgQueue`` is) and keeps only
a ``WorkerContext``: the task registry, the settings, pgqueue's own engine, the handlers'
session factory, the LISTEN connection and the scheduler pass. The worker's services receive
the parts they use, so none of them depends on the queue object.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from sqlalchemy import Engine
from sqlalchemy.orm import Session

from pgqueue.config import Settings
from pgqueue.tasks import TaskRegistry


class QueueHost(Protocol):
    """The public attributes of a queue object that a worker reads (``PgQueue`` has them)."""

    @property
    def settings(self) -> Settings: ...

    @property
    def registry(self) -> TaskRegistry: ...

    @property
    def engine(self) -> Engine: ...

    @property
    def can_listen(self) -> bool: ...

    def listen_connection(self) -> contextlib.AbstractContextManager[Any]: ...

    def handler_session(self) -> Session: ...

    def run_schedules(self) -> list[int]: ...


@dataclass(frozen=True, slots=True)
class WorkerContext:
    """Everything a worker uses from its queue object."""

    settings: Settings
    registry: TaskRegistry
    engine: Engine  # pgqueue's own engine: claims, outcomes, heartbeats, maintenance
    can_listen: bool
    listen_connection: Callable[[], contextlib.AbstractContextManager[Any]]
    session_factory: Callable[[], Session]  # handlers' sessions, and atomic claims
    run_schedules: Callable[[], object]  # one scheduler pass (enqueues due periodic ticks)

    @classmethod
    def of(cls, host: QueueHost) -> WorkerContext:
        return cls(
            settings=host.settings,
            registry=host.registry,
            engine=host.engine,
            can_listen=host.can_listen,
            listen_connection=host.listen_connection,
            session_factory=host.handler_session,
            run_schedules=host.run_schedules,
        )
