"""Whether the worker's claims work, for the log, the metrics and the worker registry.

A worker whose claims fail is alive (its heartbeat goes on, its process runs) but takes no
work, which nothing else shows. Every failed claim attempt is counted
(``pgqueue_claim_failures_total``); the error of the latest one is written to the worker's
registry row (``pgqueue workers``, the dashboard, ``pgqueue explain``) as soon as claims begin to
fail or fail differently, and cleared when a claim works again.

The log gets one line when claims begin to fail (with the traceback, once, for an error that is
not a lost connection), one line every ``REPEAT_LOG_SECONDS`` while the same error repeats, with
its count, and one line when claims work again: a failing claim is retried within seconds, and a
traceback per retry would bury every other line of the log.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from pgqueue.errors import error_line, pgqueue_logger
from pgqueue.metrics import NO_METRICS, NoMetrics
from pgqueue.sqlstates import is_connection_error

log = pgqueue_logger("pgqueue.worker")

# How often a claim error that keeps repeating is logged again, with its count.
REPEAT_LOG_SECONDS = 60.0


class ClaimHealth:
    """The claim attempts' failures since the last claim that worked.

    ``failed`` and ``succeeded`` are called by whoever claims (one claimer at a time);
    ``error`` is read by the registry's writers on other threads. ``on_change`` is called when
    the error to show changes (claims begin to fail, fail with another error, or work again)."""

    def __init__(
        self,
        *,
        metrics: NoMetrics = NO_METRICS,
        on_change: Callable[[], None] = lambda: None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._metrics = metrics
        self._on_change = on_change
        self._clock = clock
        self._lock = threading.Lock()
        self._error: str | None = None
        self._failures = 0  # since the last claim that worked
        self._since = 0.0  # when the first of them failed
        self._repeats = 0  # of the current error, since its last log line
        self._logged_at = 0.0

    @property
    def error(self) -> str | None:
        """The error of the latest claim attempt while claims fail; None while they work."""
        return self._error

    @property
    def failures(self) -> int:
        """Claim attempts failed in a row (0 while claims work)."""
        return self._failures

    def failed(self, exc: BaseException, retry_in: float | None = None) -> None:
        """A claim attempt failed with ``exc``; the next is tried in ``retry_in`` seconds."""
        self._metrics.claim_failed()
        now = self._clock()
        line = error_line(exc)
        with self._lock:
            changed = line != self._error
            if self._failures == 0:
                self._since = now
            self._failures += 1
            self._error = line
            self._repeats = 0 if changed else self._repeats + 1
            due = changed or now - self._logged_at >= REPEAT_LOG_SECONDS
            repeats, last_logged = self._repeats, self._logged_at
            if due:
                self._logged_at = now
                self._repeats = 0
        if due:
            self._log(
                exc,
                line,
                changed=changed,
                repeats=repeats,
                over=now - last_logged,
                retry_in=retry_in,
            )
        if changed:
            self._on_change()

    def succeeded(self) -> None:
        """A claim worked: claims are healthy again (a line says so if they were not)."""
        if self._failures == 0:
            return
        with self._lock:
            failures, since = self._failures, self._since
            self._failures = 0
            self._error = None
            self._repeats = 0
        log.warning(
            "claims work again after %d failed %s over %.1fs",
            failures,
            "attempt" if failures == 1 else "attempts",
            self._clock() - since,
        )
        self._on_change()

    def _log(
        self,
        exc: BaseException,
        line: str,
        *,
        changed: bool,
        repeats: int,
        over: float,
        retry_in: float | None,
    ) -> None:
        lost = is_connection_error(exc)
        retrying = "" if retry_in is None else f"; retrying in {retry_in:.2f}s"
        if changed:
            # A lost connection is an outage the other duties report too: no traceback.
            log.log(
                logging.WARNING if lost else logging.ERROR,
                "claim failed: %s%s",
                line,
                retrying,
                exc_info=None if lost else exc,
            )
            return
        log.log(
            logging.WARNING if lost else logging.ERROR,
            "claims still fail: %d more %s with the same error in the last %.0fs, "
            "%d in a row over %.0fs: %s%s",
            repeats,
            "attempt" if repeats == 1 else "attempts",
            over,
            self._failures,
            self._clock() - self._since,
            line,
            retrying,
        )
