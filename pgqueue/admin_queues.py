"""The queue controls of ``pgq.admin``: pause and resume a queue, bound it, limit how many of
its jobs (or of a concurrency key's) run at once and how many start per window, and read these
switches back.

Each is one data-layer write in a transaction of its own (``admin_runner``), taken by every
worker at its next claim; arguments are checked before any SQL runs. ``admin.Admin`` holds
these methods with the rest of the admin API.
"""

from __future__ import annotations

from pgqueue import validation
from pgqueue.admin_runner import AdminRunner
from pgqueue.admin_values import MAX_QUEUE_DEPTH, KeyOverride, QueueSettings
from pgqueue.data import control as control_data
from pgqueue.data import enqueue as enqueue_data
from pgqueue.data import flow as flow_data
from pgqueue.errors import ValidationError


class QueueControls(AdminRunner):
    """The queue and concurrency-key switches of ``pgq.admin`` (see the module)."""

    def pause_queue(self, queue: str) -> None:
        """Stop all workers from claiming ``queue``'s jobs (within one poll interval); running
        jobs finish. Tickets stay, so ``resume_queue`` picks up where it left off."""
        name = validation.queue_name(queue)
        self._write(None, lambda s: control_data.set_queue_control(s, name, paused=True))

    def resume_queue(self, queue: str) -> None:
        """Let workers claim ``queue``'s jobs again."""
        name = validation.queue_name(queue)
        self._write(None, lambda s: control_data.set_queue_control(s, name, paused=False))

    def set_queue_limit(self, queue: str, limit: int | None) -> None:
        """At most ``limit`` jobs of ``queue`` RUNNING at once across all workers and hosts
        (enforced in the claim); ``None`` removes the limit."""
        if limit is not None and (
            not isinstance(limit, int) or isinstance(limit, bool) or limit < 1
        ):
            raise ValidationError(f"queue limit must be a positive int or None, got {limit!r}")
        if limit is not None and limit > MAX_QUEUE_DEPTH:  # the same integer column's range
            raise ValidationError(f"queue limit must be at most {MAX_QUEUE_DEPTH}, got {limit}")
        name = validation.queue_name(queue)
        self._write(
            None, lambda s: control_data.set_queue_control(s, name, concurrency_limit=limit)
        )

    def set_queue_max_depth(
        self, queue: str, max_depth: int | None, *, on_full: str = "reject"
    ) -> None:
        """Bound ``queue``: an enqueue that would take it above ``max_depth`` waiting jobs
        (queued, retrying, or waiting on dependencies; scheduled ones included) raises
        ``QueueFull`` in the enqueuing caller, and writes none of its jobs. ``None`` removes the
        bound. ``on_full`` says what a full queue does to an enqueue; ``"reject"`` is the only
        mode. A bound never holds back a job already waiting."""
        if max_depth is not None and (
            not isinstance(max_depth, int) or isinstance(max_depth, bool) or max_depth < 1
        ):
            raise ValidationError(f"max_depth must be a positive int or None, got {max_depth!r}")
        if max_depth is not None and max_depth > MAX_QUEUE_DEPTH:
            raise ValidationError(f"max_depth must be at most {MAX_QUEUE_DEPTH}, got {max_depth}")
        if on_full != "reject":
            raise ValidationError(f"on_full must be 'reject' (the only mode), got {on_full!r}")
        name = validation.queue_name(queue)
        self._write(None, lambda s: enqueue_data.set_queue_max_depth(s, name, max_depth))
        # This queue object's enqueues go straight to the checked insert of a bounded queue.
        self._bounded_queues.record([name], [] if max_depth is None else [name])

    def set_key_limit(self, key_or_prefix: str, limit: int | None) -> None:
        """At most ``limit`` jobs RUNNING at once for each concurrency key starting with
        ``key_or_prefix`` (an exact key is its own longest prefix), across all workers;
        the longest matching prefix wins over the task's ``key_limit``. ``None`` removes it."""
        prefix = validation.concurrency_key(key_or_prefix, what="key_or_prefix")
        if limit is not None:
            limit = validation.limit_count(limit, what="key limit")
        self._write(None, lambda s: flow_data.set_key_limit(s, prefix, limit))

    def set_rate_limit(
        self,
        queue: str | None = None,
        limit: int | None = None,
        *,
        per: float | None = None,
        key: str | None = None,
    ) -> None:
        """At most ``limit`` jobs of ``queue`` (or, with ``key=``, of each concurrency key
        starting with ``key``) start in any window of ``per`` seconds, across all workers;
        jobs over the rate wait. ``limit=None`` removes the rate limit."""
        if (queue is None) == (key is None):
            raise ValidationError("set_rate_limit needs either a queue or key=, not both")
        if limit is None:
            if per is not None:
                raise ValidationError("per without a limit: pass limit=None alone to remove")
            rate, window = None, None
        else:
            rate = validation.limit_count(limit, what="rate limit")
            if per is None:
                raise ValidationError("a rate limit needs per= (its window in seconds)")
            window = validation.rate_period(per)
        if key is not None:
            prefix = validation.concurrency_key(key, what="key")
            self._write(None, lambda s: flow_data.set_key_rate(s, prefix, rate, window))
            return
        name = validation.queue_name(queue)
        self._write(None, lambda s: flow_data.set_queue_rate(s, name, rate, window))

    def queue_settings(self) -> dict[str, QueueSettings]:
        """The switches of every queue that has any, by queue name."""
        rows = self._read_session(lambda s, _: control_data.queue_controls(s))
        return {
            row.name: QueueSettings(
                row.name,
                row.paused,
                row.concurrency_limit,
                row.running,
                row.max_depth,
                row.rate_limit,
                row.rate_per,
            )
            for row in rows
        }

    def key_overrides(self) -> list[KeyOverride]:
        """Every run-time override of the concurrency keys' limits, by prefix."""
        rows = self._read(flow_data.key_overrides)
        return [KeyOverride(*row) for row in rows]
