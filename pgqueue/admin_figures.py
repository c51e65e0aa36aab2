"""The figures of ``pgq.admin``: job counts per queue and state, the oldest waiting ticket, jobs
finished over time, the queues' names, and the worker registry with who holds a running job.

Each is one data-layer read in a session of its own (``admin_runner``), bounded where the
dashboard reads it on every page; ``admin.Admin`` holds these methods with the rest of the admin
API.
"""

from __future__ import annotations

from pgqueue.admin_runner import AdminRunner
from pgqueue.admin_values import (
    DEFAULT_COUNT_CAP,
    DEFAULT_THROUGHPUT_CAP,
    JobHolder,
    OldestWaiting,
    RecentActivity,
    Throughput,
    WaitTime,
    WorkerInfo,
    check_job_id,
)
from pgqueue.data import admin as admin_data
from pgqueue.data import wait_times as wait_data
from pgqueue.data import workers as workers_data
from pgqueue.errors import ValidationError
from pgqueue.states import JobState


class Figures(AdminRunner):
    """The counts, throughput and worker registry of ``pgq.admin`` (see the module)."""

    # -- figures -----------------------------------------------------------------------------

    def counts(self) -> dict[str, dict[JobState, int]]:
        """``{queue: {state: count}}`` over all jobs (exact: reads every job)."""
        return self._read(admin_data.state_counts)

    def capped_counts(self, cap: int = DEFAULT_COUNT_CAP) -> dict[str, dict[JobState, int]]:
        """``{queue: {state: count}}`` for every queue with jobs, each count stopping at
        ``cap`` (``cap`` means "``cap`` or more"); states without jobs count 0. Under the
        partitioned history, moved jobs count too (each table's count capped, the sum too)."""
        if not isinstance(cap, int) or isinstance(cap, bool) or cap < 1:
            raise ValidationError(f"cap must be a positive int, got {cap!r}")
        return self._read(lambda ex: admin_data.capped_counts(ex, cap))

    def oldest_waiting(self) -> dict[str, OldestWaiting]:
        """The earliest ticket of each queue that has one."""
        rows = self._read(admin_data.oldest_waiting)
        return {queue: OldestWaiting(*row) for queue, row in rows.items()}

    def throughput(self) -> dict[str, dict[JobState, list[int]]]:
        """Jobs finished per minute over the last hour: ``{queue: {state: [count, ...]}}``,
        index 0 the current minute, index 59 an hour ago; only queues with finished jobs in
        that hour appear. Under the partitioned history the minutes are clock minutes, and moved
        jobs are counted from the per-minute counts their move wrote."""
        return self._read(admin_data.throughput)

    def recent_throughput(self, cap: int = DEFAULT_THROUGHPUT_CAP) -> Throughput:
        """Jobs finished per minute over the last hour, or, when more than ``cap`` finished in
        that hour, over the shorter window holding the ``cap`` most recent ones, in buckets of
        1 to 60 seconds (at most 60 of them). Reads at most about ``cap`` index entries twice,
        so the cost is bounded however busy the queues are. Under the partitioned history the
        moved jobs of a whole hour come from their per-minute counts (clock minutes), whose
        rows do not grow with the jobs; the window shrinks only when more than ``cap`` jobs
        still in ``pgqueue_jobs`` finished within the hour."""
        if not isinstance(cap, int) or isinstance(cap, bool) or cap < 1:
            raise ValidationError(f"cap must be a positive int, got {cap!r}")
        return Throughput(*self._read(lambda ex: admin_data.recent_throughput(ex, cap)))

    def recent_wait_times(
        self, window: int, width: int, cap: int = DEFAULT_THROUGHPUT_CAP
    ) -> dict[str, list[WaitTime | None]]:
        """How long jobs waited from ``run_at`` to their claim, per queue, in ``window //
        width`` buckets of ``width`` seconds by finish time: ``{queue: [WaitTime or None]}``,
        index 0 the newest bucket, None where none of the queue's jobs finished. Give it
        ``recent_throughput``'s window and width so the charts line up. Reads the ``cap`` most
        recently finished jobs at most (per table under the partitioned history, whose moved
        jobs count too): in a window holding more, its older buckets count only the newest."""
        for name, value in (("window", window), ("width", width), ("cap", cap)):
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValidationError(f"{name} must be a positive int, got {value!r}")
        if window % width or window // width > 3600:
            raise ValidationError(
                f"window ({window}) must be a whole number of buckets of width ({width}), "
                "at most 3600 of them"
            )
        return self._read(lambda ex: wait_data.recent_wait_times(ex, window, width, cap))

    def recent_activity(
        self, cap: int = DEFAULT_THROUGHPUT_CAP, *, quiet_jobs: int = -1, quiet_width: int = 60
    ) -> RecentActivity:
        """``recent_throughput(cap)`` and ``recent_wait_times`` over its window and buckets, read
        together: in place, one statement over at most ``cap`` recently finished jobs (each
        read once). A full hour in which at most ``quiet_jobs`` jobs finished is bucketed by
        ``quiet_width`` seconds (a divisor of 3600 and a multiple of 60) instead of 60."""
        for name, value in (("cap", cap), ("quiet_width", quiet_width)):
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValidationError(f"{name} must be a positive int, got {value!r}")
        if not isinstance(quiet_jobs, int) or isinstance(quiet_jobs, bool):
            raise ValidationError(f"quiet_jobs must be an int, got {quiet_jobs!r}")
        if quiet_width % 60 or 3600 % quiet_width:
            raise ValidationError(
                f"quiet_width must be a multiple of 60 dividing 3600, got {quiet_width!r}"
            )
        window, width, series, shortened, waits = self._read(
            lambda ex: wait_data.recent_activity(ex, cap, quiet_jobs, quiet_width)
        )
        return RecentActivity(Throughput(window, width, series, shortened), waits)

    def queue_names(self) -> list[str]:
        """The queues that have jobs, sorted (moved jobs' too under the partitioned history)."""
        return self._read(admin_data.queue_names)

    # -- workers -----------------------------------------------------------------------------

    def list_workers(self, *, include_stale: bool = False) -> list[WorkerInfo]:
        """The live workers of the registry by id, each with the RUNNING jobs it holds; with
        ``include_stale``, also the rows of workers gone stale (``live`` false), after them."""
        if not isinstance(include_stale, bool):
            raise ValidationError(f"include_stale must be a bool, got {include_stale!r}")
        stale_seconds = self._stale_seconds()
        rows = self._read(
            lambda s: workers_data.list_workers(s, stale_seconds, include_stale=include_stale)
        )
        return [
            WorkerInfo(
                id=row[0],
                host=row[1],
                pid=row[2],
                queues=tuple(row[3]),
                concurrency=row[4],
                version=row[5],
                started_at=row[6],
                last_seen_at=row[7],
                seconds_since_seen=float(row[8]),
                live=bool(row[9]),
                running=int(row[10]),
                claim_error=row[11],
                seconds_failing=None if row[12] is None else float(row[12]),
                tasks=None if row[13] is None else tuple(row[13]),
                pool=row[14],
            )
            for row in rows
        ]

    def job_holder(self, job_id: int) -> JobHolder | None:
        """The worker holding job ``job_id`` while it is RUNNING, else None."""
        job_id = check_job_id(job_id)
        stale_seconds = self._stale_seconds()
        row = self._read(lambda s: workers_data.job_holder(s, job_id, stale_seconds))
        if row is None:
            return None
        seen = None if row[4] is None else float(row[4])
        return JobHolder(row[0], row[1], row[2], row[3], seen, bool(row[5]))
