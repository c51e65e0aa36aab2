"""``Execution``: the book-keeping of one leased attempt from its claim until its outcome is
written, shared by the services that touch it (claimer, pool thread, heartbeat, completer,
shutdown). The flags that decide its one outcome change under the lock of ``Slots``.
"""

from __future__ import annotations

import concurrent.futures
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pgqueue.jobs import ClaimedJob, Outcome, Progress


@dataclass(slots=True)
class Execution:
    """Book-keeping for an attempt from its claim until its outcome is written, shared with the
    heartbeat and shutdown paths."""

    job: ClaimedJob
    lease_seconds: float
    timeout: float | None
    started: float
    # A rate-limited attempt's latest start (monotonic): the handler is not started after it
    # (``ClaimedJob.start_within``); None for every other attempt.
    start_by: float | None = None
    async_future: concurrent.futures.Future[Any] | None = None
    # The outcome was decided (the handler returned, or a timeout or shutdown release decided it
    # first, in which case the handler's own result is dropped). Set under the lock of
    # ``Slots``, so exactly one outcome is written per attempt.
    decided: bool = False
    timed_out: bool = False  # decided by the timeout check while its thread still runs
    # A sync handler's: the failed attempt its timeout decided, written once its thread returns
    # (or the worker exits). Until then the job stays held, leased and heartbeated by this
    # worker, so its retry cannot start beside the thread and its key and queue limits count it.
    timeout_outcome: Outcome | None = None
    # Set when its handler runs in a child process (``worker.processes``): stops that child
    # (the heartbeat calls it at the timeout), and the pool thread then writes the failure.
    stop_process: Callable[[], None] | None = None
    # Decided by its handler's thread before it committed the context session's writes
    # (``Slots.settle_by_handler``): the timeout check then leaves it alone.
    settled: bool = False
    # Its slot went to a replacement thread while the handler ran on past its timeout; the
    # thread retires when the handler returns.
    replaced: bool = False
    lease_lost: bool = False  # a heartbeat found the lease gone (reported once)
    holds_slot: bool = True  # counted in the busy slots (until the handler is done)
    waiting: bool = False  # claimed ahead, its handler not started yet (``started``: the claim)
    writing: bool = False  # its outcome statement is being sent: heartbeats leave it alone
    cancelled: bool = False  # a cancel was requested (seen by a heartbeat or at claim)
    # The latest progress the handler reported, and the report last written by a heartbeat:
    # one is pending while they differ (compared by identity, each report a new tuple).
    progress: Progress | None = None
    progress_written: Progress | None = None
    # Created only when a handler asks (JobContext) or an async handler runs: most jobs never
    # need one, and an Event per job is measurable at thousands of jobs per second.
    _event: threading.Event | None = None

    def past_start_by(self) -> bool:
        """A rate-limited attempt whose handler may no longer start (``start_by`` passed)."""
        return self.start_by is not None and time.monotonic() > self.start_by

    def cancel_event(self) -> threading.Event:
        """The event a handler's ``JobContext`` watches (created on first use)."""
        event = self._event
        if event is None:
            event = self._event = threading.Event()
            # Ordered against request_cancel (flag first, then read the event) so that one of
            # the two always sets it.
            if self.cancelled:
                event.set()
        return event

    def request_cancel(self) -> None:
        self.cancelled = True
        event = self._event
        if event is not None:
            event.set()

    def report_progress(self, progress: Progress) -> None:
        """Keep the handler's latest report for the next heartbeat (or the outcome)."""
        self.progress = progress

    def unwritten_progress(self) -> Progress | None:
        """The latest report if no heartbeat wrote it yet."""
        progress = self.progress
        return None if progress is self.progress_written else progress
