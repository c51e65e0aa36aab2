"""A worker's counts (``WorkerStats``) and the one place an attempt's outcome is reported.

``OutcomeReport.written`` is called once per outcome that reached the database, leased or
atomic: it counts it, logs one line (failures always; successes at INFO when
``log_successes``, else at DEBUG), and calls the worker's ``on_outcome`` callback. Every
``log_summary_interval`` seconds in which outcomes were written it also logs one INFO line
(``summary_line``) counting them, so a worker that does not log its successes still says that
it is working, at a cost that does not grow with the job rate.
"""

from __future__ import annotations

import datetime as dt
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from pgqueue.errors import error_summary, pgqueue_logger
from pgqueue.jobs import ClaimedJob, Outcome
from pgqueue.metrics import CANCELLED, FAILED, NO_METRICS, RETRIED, SUCCEEDED, NoMetrics
from pgqueue.states import OutcomeKind

log = pgqueue_logger("pgqueue.worker")

# Read once: an enum member looked up on its class costs more than the comparison.
_COMPLETE = OutcomeKind.COMPLETE
_RETRY = OutcomeKind.RETRY
_FAIL = OutcomeKind.FAIL
_CANCELLED = OutcomeKind.CANCELLED
_RELEASE = OutcomeKind.RELEASE
_SNOOZE = OutcomeKind.SNOOZE
_SUSPEND = OutcomeKind.SUSPEND

# The ``outcome`` label of each kind that finishes an attempt (a release does not).
_FINISHED_LABEL = {
    _COMPLETE: SUCCEEDED,
    _RETRY: RETRIED,
    _FAIL: FAILED,
    _CANCELLED: CANCELLED,
}


@dataclass(slots=True, repr=False)
class WorkerStats:
    """Counts of what one worker did.

    ``started`` and ``finished`` are monotonic clock readings, for measuring ``elapsed``;
    ``started_at`` is the wall-clock (UTC) start, for people reading the stats.
    """

    claimed: int = 0
    succeeded: int = 0
    retried: int = 0
    failed: int = 0
    cancelled: int = 0
    released: int = 0
    snoozed: int = 0  # written snoozes (one past ``max_snoozes`` counts here, not as retried)
    suspended: int = 0  # runs that ended in ``ctx.sleep`` or ``ctx.wait_for_signal``
    lost_leases: int = 0
    rescued: int = 0
    started: float = field(default_factory=time.monotonic)
    finished: float | None = None
    started_at: dt.datetime = field(default_factory=lambda: dt.datetime.now(dt.UTC))

    @property
    def processed(self) -> int:
        return self.succeeded + self.retried + self.failed + self.cancelled

    @property
    def elapsed(self) -> float:
        return (self.finished or time.monotonic()) - self.started

    def __str__(self) -> str:
        """``claimed 12, succeeded 10, ...; started 2026-01-31 09:00:00 UTC, ran 12.3 s``."""
        counts = ", ".join(
            f"{label} {value}"
            for label, value in (
                ("claimed", self.claimed),
                ("succeeded", self.succeeded),
                ("retried", self.retried),
                ("failed", self.failed),
                ("cancelled", self.cancelled),
                ("released", self.released),
                ("lost leases", self.lost_leases),
                ("rescued", self.rescued),
            )
        )
        ran = "ran" if self.finished is not None else "running for"
        started = self.started_at.strftime("%Y-%m-%d %H:%M:%S UTC")
        return f"{counts}; started {started}, {ran} {readable_duration(self.elapsed)}"

    def __repr__(self) -> str:
        return f"<WorkerStats {self}>"

    def outcome_counts(self) -> tuple[int, int, int, int]:
        """``(succeeded, retried, failed, cancelled)`` so far."""
        return self.succeeded, self.retried, self.failed, self.cancelled


def summary_line(
    now: tuple[int, int, int, int], then: tuple[int, int, int, int], seconds: float
) -> str:
    """The periodic INFO line: outcomes written between two readings of
    ``WorkerStats.outcome_counts`` taken ``seconds`` apart, and their rate."""
    succeeded, retried, failed, cancelled = (a - b for a, b in zip(now, then, strict=True))
    total = succeeded + retried + failed + cancelled
    rate = total / seconds if seconds > 0 else 0.0
    return (
        f"{total} job{'' if total == 1 else 's'} in the last {readable_duration(seconds)}"
        f" ({rate:.1f} jobs/s): succeeded {succeeded}, retried {retried}, failed {failed},"
        f" cancelled {cancelled}"
    )


def readable_duration(seconds: float) -> str:
    """``12.3 s``, ``4 min 05 s`` or ``2 h 03 min``: as precise as a reader of a log needs."""
    if round(seconds, 1) < 60:
        return f"{seconds:.1f} s"
    whole = round(seconds)
    if whole < 3600:
        return f"{whole // 60} min {whole % 60:02d} s"
    return f"{whole // 3600} h {whole % 3600 // 60:02d} min"


class OutcomeReport:
    """Counts, logs and hands on the outcomes a worker wrote."""

    def __init__(
        self,
        stats: WorkerStats,
        *,
        log_successes: bool,
        log_args: bool,
        on_outcome: Callable[[Outcome], None] | None,
        metrics: NoMetrics = NO_METRICS,
        summary_interval: float = 0.0,
    ) -> None:
        self.stats = stats
        self.metrics = metrics
        self._metrics_on = metrics.enabled
        self._log_successes = log_successes
        self._log_args = log_args
        self._on_outcome = on_outcome
        # 0: no summary lines (the next one is due never).
        self._summary_interval = summary_interval
        self._summary_at = time.monotonic()
        self._summary_due = self._summary_at + summary_interval if summary_interval else None
        self._summary_counts = stats.outcome_counts()

    def written(
        self, outcome: Outcome, duration: float, job: ClaimedJob, *, quiet: bool = False
    ) -> None:
        """Count, log (unless ``quiet``: its caller logged it) and hand on one written outcome."""
        kind = outcome.kind
        stats = self.stats
        if kind == _COMPLETE:
            stats.succeeded += 1
        elif kind == _RETRY:
            stats.retried += 1
        elif kind == _FAIL:
            stats.failed += 1
        elif kind == _CANCELLED:
            stats.cancelled += 1
        elif kind == _RELEASE:
            stats.released += 1
        elif kind == _SNOOZE:
            stats.snoozed += 1
        elif kind == _SUSPEND:
            stats.suspended += 1
        if self._metrics_on:
            label = _FINISHED_LABEL.get(kind)
            if label is not None:
                self.metrics.finished(job.queue, job.task_name, label, duration)
        if quiet:
            pass
        elif kind != _COMPLETE or self._log_successes:
            if log.isEnabledFor(logging.INFO):
                self._log(outcome, duration, job, logging.INFO)
        elif log.isEnabledFor(logging.DEBUG):
            self._log(outcome, duration, job, logging.DEBUG)
        due = self._summary_due
        if due is not None and (now := time.monotonic()) >= due:
            self._summarize(now)
        if self._on_outcome is not None:
            try:
                self._on_outcome(outcome)
            except Exception:
                log.exception("on_outcome callback failed")

    def _summarize(self, now: float) -> None:
        counts = self.stats.outcome_counts()
        if log.isEnabledFor(logging.INFO):
            log.info("%s", summary_line(counts, self._summary_counts, now - self._summary_at))
        self._summary_counts = counts
        self._summary_at = now
        self._summary_due = now + self._summary_interval

    def _log(self, outcome: Outcome, duration: float, job: ClaimedJob, level: int) -> None:
        kind = str(outcome.kind)
        extra = {
            "task": job.task_name,
            "job_id": job.id,
            "attempt": job.attempt,
            "duration_ms": round(duration * 1000, 2),
            "outcome": kind,
        }
        if self._log_args:
            extra["args"] = job.args
            extra["kwargs"] = job.kwargs
        log.log(
            level,
            "job %s task=%s attempt=%d outcome=%s duration_ms=%.2f%s",
            job.id,
            job.task_name,
            job.attempt,
            kind,
            extra["duration_ms"],
            "" if not outcome.error else " error=" + error_summary(outcome.error),
            extra={"pgqueue": extra},
        )
