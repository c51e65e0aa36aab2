"""How an admin operation runs: one body, run synchronously or in an event loop.

Every operation of ``pgq.admin`` checks its arguments and builds its work once: a function of
an executor that makes the data-layer call (``Work``), or, where the operation reads ORM
objects or takes a savepoint, of the session and its executor (``SessionWork``, run by the
``_session`` runners). The base class here runs that work, on an executor that reads jobs where
the settings of that moment put them (``Engines.tables``). A read runs
in a session of its own, ended without a commit; an action runs in the caller's session when
one is given (never committed or retried here: only the caller knows whether its other work may
repeat), else in a transaction of its own, retried on transient conflicts (``uow``'s policy).
The asyncio runners (``_aread``, ``_awrite``) run the same work on the running loop's
``aio.AsyncDatabase`` through SQLAlchemy's greenlet bridge, so an async method is its sync
twin's body handed to another runner, not a second implementation.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, TypeVar

from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm import Session, sessionmaker

from pgqueue import uow
from pgqueue.aio import check_async_session
from pgqueue.config import Settings
from pgqueue.data.insert_choice import BoundedQueuesSeen
from pgqueue.db import Executor, executor_for
from pgqueue.engines import Engines

if TYPE_CHECKING:
    from pgqueue.scheduler import Schedule

T = TypeVar("T")

Work = Callable[[Executor], T]
"""An operation's body: the data-layer call to make through an executor."""

SessionWork = Callable[[Session, Executor], T]
"""An operation's body that needs the session (ORM objects, or a savepoint), given the
session's executor too."""


class AdminRunner:
    """The connections, settings and runners the admin operations share (see the module).

    ``engines`` are the queue object's (read per operation, so an engine recreated after
    ``dispose`` is used); ``settings`` is called per operation too. ``bounded_queues`` is the
    belief of the enqueues of the same queue object, told of each bound set through here.
    ``schedules`` gives the periodic schedules the code defines, by name (none by default).
    """

    def __init__(
        self,
        engines: Engines,
        settings: Callable[[], Settings],
        *,
        bounded_queues: BoundedQueuesSeen | None = None,
        schedules: Callable[[], Mapping[str, Schedule]] | None = None,
    ) -> None:
        self._engines = engines
        self._settings = settings
        self._schedules: Callable[[], Mapping[str, Schedule]] = schedules or dict
        self._sessions: Callable[[], sessionmaker[Session]] = lambda: engines.sessions
        self._stale_seconds: Callable[[], float] = lambda: settings().worker_stale_seconds
        self._bounded_queues = bounded_queues if bounded_queues is not None else BoundedQueuesSeen()

    def _read(self, work: Work[T]) -> T:
        return self._read_session(lambda _, ex: work(ex))

    def _write(self, session: Session | None, work: Work[T]) -> T:
        return self._write_session(session, lambda _, ex: work(ex))

    def _read_session(self, work: SessionWork[T]) -> T:
        run = self._on_session(work)

        def once() -> T:
            with self._sessions()() as session:
                return run(session)

        # A read may run again: one whose pooled connection the server had ended (a restart, a
        # failover, before the checkout's socket test could see it) is sent once more.
        return uow.retrying(once)

    def _write_session(self, session: Session | None, work: SessionWork[T]) -> T:
        return uow.in_caller_or_own_transaction(session, self._sessions(), self._on_session(work))

    async def _aread(self, work: Work[T]) -> T:
        """``_read`` on the running event loop."""
        return await self._aread_session(lambda _, ex: work(ex))

    async def _awrite(self, session: AsyncSession | None, work: Work[T]) -> T:
        """``_write`` on the running event loop: in ``session``'s transaction (an
        ``AsyncSession``) when given, else in one of its own."""
        return await self._awrite_session(session, lambda _, ex: work(ex))

    async def _aread_session(self, work: SessionWork[T]) -> T:
        database = await self._engines.running_async_database()
        return await database.read(self._on_session(work))

    async def _awrite_session(self, session: AsyncSession | None, work: SessionWork[T]) -> T:
        session = check_async_session(session)
        database = await self._engines.running_async_database()
        return await database.in_caller_or_own_session(session, self._on_session(work))

    def _on_session(self, work: SessionWork[T]) -> Callable[[Session], T]:
        """``work`` given the session it runs in and that session's executor, which reads jobs
        where the settings of this operation put them."""
        tables = self._engines.tables()
        return lambda session: work(session, executor_for(session, tables))
