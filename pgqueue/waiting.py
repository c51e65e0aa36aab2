"""Waiting for a job to finish: what ``PgQueue.wait_for`` and ``PgQueue.await_job`` run.

The statements that end jobs (outcomes, atomic jobs' outcomes, rescues that end a job, cancels
of waiting jobs, single or bulk, and dependents cancelled with them) announce the ids they ended
on ``FINISHED_CHANNEL`` (``sql.common.announced``), delivered when their transaction commits.
One ``FinishedListener`` per ``PgQueue`` listens on that channel in a daemon thread, on its own
connection from ``PgQueue.listen_connection`` (so behind a transaction pooler, the direct
``listen_database_url``), and wakes the waiters of the ids it hears about: a
``threading.Event`` for ``wait_for``; for ``await_job`` an ``asyncio.Event`` set through the
waiter's own event loop. One thread serves every event loop, which a listener built on one
loop's asyncio connection could not (a ``PgQueue`` outlives the loops of, say, a test suite).

Only jobs someone waits for are announced: a waiter subscribes, then marks its job awaited
(``pgqueue_jobs.awaited``, an UPDATE of the job's row, ordered with the statement that ends it),
then reads it; and the listener wakes every subscriber each time its ``LISTEN`` is
(re)established. So a job that ends between the read and the wait is either
seen by the read, or announced to the listener, or covered by that wake-up after a reconnect:
no wake-up is lost. A waiter also reads the job again every ``RECHECK_SECONDS`` whatever it
hears: a safety net for what is not announced (a job deleted while waited for), and, every
``POLL_SECONDS`` instead, the only way to learn anything while no listener is connected (it
cannot connect, or a transaction pooler without ``listen_database_url`` forbids LISTEN).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import threading
import time
from collections.abc import Callable
from typing import Any, Final

import psycopg
from sqlalchemy.exc import DBAPIError

from pgqueue import validation
from pgqueue.admin_values import check_job_id
from pgqueue.errors import JobWaitTimeout, pgqueue_logger
from pgqueue.models import Job
from pgqueue.sql.server import announced_job_ids, listen_finished
from pgqueue.states import FINAL_STATES, JobState

log = pgqueue_logger("pgqueue.waiting")

# The safety net's period while the listener is connected: a read every this many seconds.
RECHECK_SECONDS: Final = 5.0
# The period of the reads while no listener is connected: they are all a waiter then has.
POLL_SECONDS: Final = 0.5
# How long ``close`` waits for the listener thread (it looks up every ``_LISTEN_SLICE``).
_LISTEN_SLICE: Final = 0.5
_CLOSE_WAIT: Final = 2.0

Connect = Callable[[], contextlib.AbstractContextManager[psycopg.Connection[Any]]]
Wake = Callable[[], None]


def wait_timeout(value: object) -> float | None:
    """``value`` as the seconds a wait may last (None: no limit); ValidationError otherwise."""
    return None if value is None else validation.seconds(value, "timeout", none_allowed=True)


class FinishedListener:
    """A daemon thread LISTENing on ``FINISHED_CHANNEL`` that calls the wake-ups subscribed to
    the ids announced (all of them for ``sql.common.ALL_FINISHED`` and after each (re)connect)."""

    def __init__(self, connect: Connect) -> None:
        self._connect = connect
        self._lock = threading.Lock()
        self._waiters: dict[int, set[Wake]] = {}
        self._stopping = threading.Event()
        self.connected = threading.Event()
        self.pid = os.getpid()
        self._thread = threading.Thread(target=self._run, name="pgqueue-wait-listener", daemon=True)
        self._thread.start()

    def subscribe(self, job_id: int, wake: Wake) -> None:
        with self._lock:
            self._waiters.setdefault(job_id, set()).add(wake)

    def unsubscribe(self, job_id: int, wake: Wake) -> None:
        with self._lock:
            wakes = self._waiters.get(job_id)
            if wakes is not None:
                wakes.discard(wake)
                if not wakes:
                    del self._waiters[job_id]

    def close(self) -> None:
        """Stop listening and close the connection; subscribers then poll."""
        self._stopping.set()
        self._thread.join(_CLOSE_WAIT)
        self.connected.clear()

    def _run(self) -> None:
        delay = 0.05
        while not self._stopping.is_set():
            try:
                with self._connect() as connection:
                    connection.execute(listen_finished())
                    self.connected.set()
                    delay = 0.05
                    self._wake_all()  # announcements sent while nobody listened: read again
                    while not self._stopping.is_set():
                        for notify in connection.notifies(timeout=_LISTEN_SLICE):
                            self._dispatch(notify.payload)
            except (psycopg.Error, DBAPIError) as exc:
                self.connected.clear()
                if self._stopping.is_set():
                    return
                self._wake_all()  # so that each waiter reads again, then polls until reconnected
                log.warning("wait listener connection failed (%s); retrying in %.2fs", exc, delay)
                self._stopping.wait(delay)
                delay = min(delay * 2, 2.0)

    def _dispatch(self, payload: str) -> None:
        ids = announced_job_ids(payload)
        if ids is None:  # every awaited job, or not an announcement of pgqueue's
            self._wake_all()
            return
        with self._lock:
            wakes = [wake for job_id in ids for wake in self._waiters.get(job_id, ())]
        for wake in wakes:
            wake()

    def _wake_all(self) -> None:
        with self._lock:
            wakes = [wake for group in self._waiters.values() for wake in group]
        for wake in wakes:
            wake()


class JobWaiter:
    """``wait``/``await_job`` for one ``PgQueue``: its listener, started on first use."""

    def __init__(
        self,
        get_job: Callable[[int], Job],
        mark_awaited: Callable[[int], object],
        connect: Connect,
        can_listen: Callable[[], bool],
    ) -> None:
        self._get_job = get_job
        self._mark_awaited = mark_awaited
        self._connect = connect
        self._can_listen = can_listen
        self._lock = threading.Lock()
        self._listener: FinishedListener | None = None

    def listener(self) -> FinishedListener | None:
        """The shared listener (started now if need be), None where LISTEN is not possible."""
        with self._lock:
            if self._listener is not None and self._listener.pid != os.getpid():
                # Inherited through fork: its thread stayed in the parent, and its connection
                # is the parent's to close.
                self._listener = None
            if self._listener is None and self._can_listen():
                self._listener = FinishedListener(self._connect)
            return self._listener

    def close(self) -> None:
        """Stop the listener; the next wait starts a new one."""
        with self._lock:
            listener, self._listener = self._listener, None
        if listener is not None:
            listener.close()

    def wait(self, job_id: object, timeout: object) -> Job:
        """Job ``job_id`` once it is finished; JobWaitTimeout after ``timeout`` seconds."""
        job_id = check_job_id(job_id)
        limit = wait_timeout(timeout)
        deadline = None if limit is None else time.monotonic() + limit
        woken = threading.Event()
        wake = woken.set
        listener = self.listener()
        if listener is not None:
            listener.subscribe(job_id, wake)
        try:
            self._mark_awaited(job_id)
            while True:
                job = self._get_job(job_id)
                if JobState(job.state) in FINAL_STATES:
                    return job
                woken.wait(_pause(job, limit, deadline, listener))
                woken.clear()
        finally:
            if listener is not None:
                listener.unsubscribe(job_id, wake)

    async def await_job(self, job_id: object, timeout: object) -> Job:
        """``wait`` for an event loop: the loop runs on while the job is not finished."""
        job_id = check_job_id(job_id)
        limit = wait_timeout(timeout)
        deadline = None if limit is None else time.monotonic() + limit
        loop = asyncio.get_running_loop()
        woken = asyncio.Event()

        def wake() -> None:
            with contextlib.suppress(RuntimeError):  # the loop closed: nobody waits any more
                loop.call_soon_threadsafe(woken.set)

        listener = self.listener()
        if listener is not None:
            listener.subscribe(job_id, wake)
        try:
            # The mark and the reads are blocking database calls: in a thread, off the loop.
            await asyncio.to_thread(self._mark_awaited, job_id)
            while True:
                job = await asyncio.to_thread(self._get_job, job_id)
                if JobState(job.state) in FINAL_STATES:
                    return job
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(woken.wait(), _pause(job, limit, deadline, listener))
                woken.clear()
        finally:
            if listener is not None:
                listener.unsubscribe(job_id, wake)


def _pause(
    job: Job, limit: float | None, deadline: float | None, listener: FinishedListener | None
) -> float:
    """How long to wait before reading the unfinished ``job`` again; JobWaitTimeout when the
    time is up."""
    connected = listener is not None and listener.connected.is_set()
    pause = RECHECK_SECONDS if connected else POLL_SECONDS
    if deadline is None or limit is None:
        return pause
    remaining = deadline - time.monotonic()
    if remaining <= 0:
        raise JobWaitTimeout(job.id, JobState(job.state).value, limit)
    return min(pause, remaining)
