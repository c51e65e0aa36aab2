"""Dispatch: hands claimed attempts (and atomic runners) to the pool threads that run them.

``WorkQueue`` holds the work and decides how many pool threads to wake (see its docstring);
``Dispatcher`` owns the pool: ``concurrency + 2`` threads, the dispatcher thread that spreads
waiting work over them, and replacement threads for handlers hung past their timeout;
``AsyncLoop`` the thread on which ``async def`` handlers run. A pool thread hands an ``Execution`` to
the ``run_leased`` callable it was given and calls any other item (an atomic runner); either
returns True when the thread must retire (its slot went to a replacement thread).
"""

from __future__ import annotations

import asyncio
import collections
import threading
from collections.abc import Callable, Iterable
from typing import Any

from pgqueue.errors import pgqueue_logger
from pgqueue.worker.execution import Execution

log = pgqueue_logger("pgqueue.worker")


class WorkQueue:
    """Work for the pool threads: a deque, and a dispatcher that decides how many threads to wake.

    Waking a sleeping thread costs a futex round trip and a GIL hand-off, more CPU than a
    no-op job's whole run; waking one per job made thread switches the largest cost of a
    drain. So ``put_many`` wakes one sleeping thread, and the threads already awake take item
    after item. While items wait, the dispatcher thread looks every ``SPREAD_INTERVAL``: when
    the awake threads took nothing since its last look (they are all inside slow handlers) it
    wakes a thread per waiting item; when they made progress but too slowly to finish the
    waiting items before its next look, it wakes enough more threads at the rate they showed.
    A batch of quick jobs is run by one or two threads; a batch of slow jobs still spreads over
    all threads, each waiting at most a few intervals for its thread.
    """

    SPREAD_INTERVAL = 0.002

    def __init__(self) -> None:
        lock = threading.Lock()
        self._items: collections.deque[Any] = collections.deque()
        self._ready = threading.Condition(lock)  # pool threads wait here
        self._tick = threading.Condition(lock)  # the dispatcher waits here
        self._idle = 0  # pool threads waiting for items
        self._active = 0  # pool threads that took an item and have not asked for the next
        self._taken = 0  # items taken, ever
        self._dispatcher_waiting = False
        self._closed = False

    def put_many(self, items: Iterable[Any]) -> None:
        with self._ready:
            self._items.extend(items)
            if self._idle:
                self._ready.notify()
            # One item goes to the thread just woken (or one already awake): the dispatcher
            # is needed only for more, so a lone job (an idle worker's pick-up) wakes nothing else.
            if self._dispatcher_waiting and len(self._items) > 1:
                self._tick.notify()

    def put(self, item: Any) -> None:
        self.put_many((item,))

    def get(self, finished: bool = False) -> Any:
        """The next item; ``finished``: the calling thread is done with its previous item."""
        with self._ready:
            if finished:
                self._active -= 1
            items = self._items
            while not items:
                self._idle += 1
                try:
                    self._ready.wait()
                finally:
                    self._idle -= 1
            self._active += 1
            self._taken += 1
            return items.popleft()

    def retire(self) -> None:
        """The calling pool thread ends after its current item (it will not call ``get``)."""
        with self._ready:
            self._active -= 1

    def close(self) -> None:
        with self._ready:
            self._closed = True
            self._tick.notify()

    def dispatch(self) -> None:
        """The dispatcher thread's loop (until ``close``)."""
        with self._ready:
            while not self._closed:
                if not self._items or not self._idle:
                    self._dispatcher_waiting = True
                    try:
                        # Without idle threads there is nobody to wake: look again in a while.
                        self._tick.wait(None if not self._items else self.SPREAD_INTERVAL)
                    finally:
                        self._dispatcher_waiting = False
                    continue
                taken = self._taken
                self._tick.wait(self.SPREAD_INTERVAL)
                waiting = len(self._items)
                if not waiting or not self._idle:
                    continue
                rate = self._taken - taken  # by ~``_active`` threads in one interval
                if rate == 0:
                    wake = waiting
                elif rate < waiting:
                    active = max(self._active, 1)
                    wake = -(-active * (waiting - rate) // rate)  # ceil
                else:
                    continue
                self._ready.notify(min(wake, waiting, self._idle))


class AsyncLoop:
    """The asyncio loop ``async def`` handlers run on, on its own thread (started on first use)."""

    def __init__(self) -> None:
        self._loop: asyncio.AbstractEventLoop | None = None
        self._lock = threading.Lock()

    def get(self) -> asyncio.AbstractEventLoop:
        with self._lock:
            if self._loop is None:
                loop = asyncio.new_event_loop()
                start_daemon(lambda: _run_until_stopped(loop), "pgqueue-asyncio")
                self._loop = loop
            return self._loop

    def stop(self) -> None:
        with self._lock:
            if self._loop is not None:
                self._loop.call_soon_threadsafe(self._loop.stop)


def _run_until_stopped(loop: asyncio.AbstractEventLoop) -> None:
    """Run ``loop`` until ``AsyncLoop.stop``. A handler (or a task it started) that raises
    ``KeyboardInterrupt`` or ``SystemExit`` makes asyncio re-raise it out of the loop, after
    setting it as that task's exception: the loop runs on, so the pool thread waiting on the
    task gets it and fails the attempt, as it does raised by a synchronous handler, and the
    other handlers on the loop carry on."""
    while True:
        try:
            loop.run_forever()
            return
        except (KeyboardInterrupt, SystemExit) as exc:
            log.debug("an async handler raised %s out of the event loop", type(exc).__name__)


class Dispatcher:
    """The pool threads and the dispatcher thread of one worker."""

    def __init__(
        self, concurrency: int, work: WorkQueue, run_leased: Callable[[Execution], bool]
    ) -> None:
        self.work = work
        self._size = concurrency + 2
        self._run_leased = run_leased

    def start(self) -> list[threading.Thread]:
        """Start the pool and the dispatcher thread; returns them."""
        threads = [start_daemon(self._pool_thread, f"pgqueue-slot-{i}") for i in range(self._size)]
        threads.append(start_daemon(self.work.dispatch, "pgqueue-dispatcher"))
        return threads

    def start_replacement(self) -> None:
        """One more pool thread, for a slot whose handler runs on past its timeout. Not kept:
        replacement threads come and go."""
        start_daemon(self._pool_thread, "pgqueue-slot-replacement")

    def stop(self) -> None:
        """End the pool threads once they finished their items, and the dispatcher thread."""
        for _ in range(self._size):
            self.work.put(None)
        self.work.close()

    def _pool_thread(self) -> None:
        work = self.work
        run_leased = self._run_leased
        finished = False
        while True:
            item = work.get(finished)
            finished = True
            if item is None:
                work.retire()
                return
            retire = False
            try:
                retire = run_leased(item) if type(item) is Execution else item()
            except Exception:
                log.exception("worker thread error")
            if retire:
                work.retire()
                return


def start_daemon(target: Callable[[], object], name: str) -> threading.Thread:
    """Start a daemon thread running ``target``."""
    # Daemon threads: a handler that never returns must not keep the process alive after a
    # shutdown has released its job.
    thread = threading.Thread(target=target, name=name, daemon=True)
    thread.start()
    return thread
