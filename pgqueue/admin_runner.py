"""How an admin operation runs: one body, a function of a ``Session``, run synchronously or
in an event loop.

Every operation of ``pgq.admin`` checks its arguments and builds its work (a function of a
session that makes the data-layer call) once; the base class here runs that work. A read runs
in a session of its own, ended without a commit; an action runs in the caller's session when
one is given (never committed or retried here: only the caller knows whether its other work may
repeat), else in a transaction of its own, retried on transient conflicts (``uow``'s policy).
The asyncio runners (``_aread``, ``_awrite``) run the same work on the running loop's
``aio.AsyncDatabase`` through SQLAlchemy's greenlet bridge, so an async method is its sync
twin's body handed to another runner, not a second implementation.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm import Session, sessionmaker

from pgqueue import uow
from pgqueue.aio import check_async_session
from pgqueue.config import Settings
from pgqueue.data.history import JobTables
from pgqueue.data.insert_choice import BoundedQueuesSeen
from pgqueue.engines import Engines

T = TypeVar("T")

Work = Callable[[Session], T]
"""An operation's body: the data-layer call to make in ``session``."""


class AdminRunner:
    """The connections, settings and runners the admin operations share (see the module).

    ``engines`` are the queue object's (read per operation, so an engine recreated after
    ``dispose`` is used); ``settings`` is called per operation too. ``bounded_queues`` is the
    belief of the enqueues of the same queue object, told of each bound set through here.
    """

    def __init__(
        self,
        engines: Engines,
        settings: Callable[[], Settings],
        *,
        bounded_queues: BoundedQueuesSeen | None = None,
    ) -> None:
        self._engines = engines
        self._settings = settings
        self._sessions: Callable[[], sessionmaker[Session]] = lambda: engines.sessions
        self._stale_seconds: Callable[[], float] = lambda: settings().worker_stale_seconds
        self._partitioned_history: Callable[[], bool] = lambda: settings().partitioned_history
        self._bounded_queues = bounded_queues if bounded_queues is not None else BoundedQueuesSeen()

    def _tables(self) -> JobTables:
        return JobTables(partitioned=self._partitioned_history())

    def _read(self, work: Callable[[Session], T]) -> T:
        with self._sessions()() as session:
            return work(session)

    def _write(self, session: Session | None, work: Callable[[Session], T]) -> T:
        return uow.in_caller_or_own_transaction(session, self._sessions(), work)

    async def _aread(self, work: Work[T]) -> T:
        """``_read`` on the running event loop."""
        database = await self._engines.running_async_database()
        return await database.read(work)

    async def _awrite(self, session: AsyncSession | None, work: Work[T]) -> T:
        """``_write`` on the running event loop: in ``session``'s transaction (an
        ``AsyncSession``) when given, else in one of its own."""
        session = check_async_session(session)
        database = await self._engines.running_async_database()
        return await database.in_caller_or_own_session(session, work)
