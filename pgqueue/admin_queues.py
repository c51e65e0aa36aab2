"""The queue controls of ``pgq.admin``: pause and resume a queue, bound it, limit how many of
its jobs (or of a concurrency key's) run at once and how many start per window, and read these
switches back.

Each switch is one data-layer write and its audit record (``actor``, default
``default_actor()``; ``source``: ``api``, ``cli`` or ``dashboard``) in a transaction of its own
(``admin_runner``), taken by every worker at its next claim. A switch is recorded each time it
is thrown, even to the value it had: the record says who asked for the setting, and when.
Arguments, the actor's included, are checked before any SQL runs, so a refused switch writes
nothing. ``admin.Admin`` holds these methods with the rest of the admin API.
"""

from __future__ import annotations

from typing import Any

from pgqueue import validation
from pgqueue.admin_edits import audited
from pgqueue.admin_records import checked_actor
from pgqueue.admin_runner import AdminRunner, Work
from pgqueue.admin_values import MAX_QUEUE_DEPTH, KeyOverride, QueueSettings
from pgqueue.data import control as control_data
from pgqueue.data import enqueue as enqueue_data
from pgqueue.data import flow as flow_data
from pgqueue.errors import ValidationError


class QueueControls(AdminRunner):
    """The queue and concurrency-key switches of ``pgq.admin`` (see the module)."""

    def pause_queue(self, queue: str, *, actor: str | None = None, source: str = "api") -> None:
        """Stop all workers from claiming ``queue``'s jobs (within one poll interval); running
        jobs finish. Tickets stay, so ``resume_queue`` picks up where it left off. Audited
        (see the module), as every switch here is."""
        name = validation.queue_name(queue)
        self._throw_switch(
            lambda ex: control_data.set_queue_control(ex, name, paused=True),
            actor,
            source,
            "pause_queue",
            {"queue": name},
        )

    def resume_queue(self, queue: str, *, actor: str | None = None, source: str = "api") -> None:
        """Let workers claim ``queue``'s jobs again."""
        name = validation.queue_name(queue)
        self._throw_switch(
            lambda ex: control_data.set_queue_control(ex, name, paused=False),
            actor,
            source,
            "resume_queue",
            {"queue": name},
        )

    def set_queue_limit(
        self, queue: str, limit: int | None, *, actor: str | None = None, source: str = "api"
    ) -> None:
        """At most ``limit`` jobs of ``queue`` RUNNING at once across all workers and hosts
        (enforced in the claim); ``None`` removes the limit."""
        if limit is not None and (
            not isinstance(limit, int) or isinstance(limit, bool) or limit < 1
        ):
            raise ValidationError(f"queue limit must be a positive int or None, got {limit!r}")
        if limit is not None and limit > MAX_QUEUE_DEPTH:  # the same integer column's range
            raise ValidationError(f"queue limit must be at most {MAX_QUEUE_DEPTH}, got {limit}")
        name = validation.queue_name(queue)
        self._throw_switch(
            lambda ex: control_data.set_queue_control(ex, name, concurrency_limit=limit),
            actor,
            source,
            "set_queue_limit",
            {"queue": name, "limit": limit},
        )

    def set_queue_max_depth(
        self,
        queue: str,
        max_depth: int | None,
        *,
        on_full: str = "reject",
        actor: str | None = None,
        source: str = "api",
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
        self._throw_switch(
            lambda ex: enqueue_data.set_queue_max_depth(ex, name, max_depth),
            actor,
            source,
            "set_queue_max_depth",
            {"queue": name, "max_depth": max_depth},
        )
        # This queue object's enqueues go straight to the checked insert of a bounded queue.
        self._bounded_queues.record([name], [] if max_depth is None else [name])

    def set_key_limit(
        self,
        key_or_prefix: str,
        limit: int | None,
        *,
        actor: str | None = None,
        source: str = "api",
    ) -> None:
        """At most ``limit`` jobs RUNNING at once for each concurrency key starting with
        ``key_or_prefix`` (an exact key is its own longest prefix), across all workers;
        the longest matching prefix wins over the task's ``key_limit``. ``None`` removes it."""
        prefix = validation.concurrency_key(key_or_prefix, what="key_or_prefix")
        if limit is not None:
            limit = validation.limit_count(limit, what="key limit")
        self._throw_switch(
            lambda ex: flow_data.set_key_limit(ex, prefix, limit),
            actor,
            source,
            "set_key_limit",
            {"key_prefix": prefix, "limit": limit},
        )

    def set_rate_limit(
        self,
        queue: str | None = None,
        limit: int | None = None,
        *,
        per: float | None = None,
        key: str | None = None,
        actor: str | None = None,
        source: str = "api",
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
        rate_target = {"rate_limit": rate, "per": window}
        if key is not None:
            prefix = validation.concurrency_key(key, what="key")
            self._throw_switch(
                lambda ex: flow_data.set_key_rate(ex, prefix, rate, window),
                actor,
                source,
                "set_rate_limit",
                {"key_prefix": prefix, **rate_target},
            )
            return
        name = validation.queue_name(queue)
        self._throw_switch(
            lambda ex: flow_data.set_queue_rate(ex, name, rate, window),
            actor,
            source,
            "set_rate_limit",
            {"queue": name, **rate_target},
        )

    def _throw_switch(
        self,
        work: Work[None],
        actor: str | None,
        source: str,
        action: str,
        target: dict[str, Any],
    ) -> None:
        """Run ``work`` with the audit record of ``action`` on ``target``, in one transaction;
        the actor checked first."""
        who, where = checked_actor(actor, source)
        self._write_session(
            None,
            audited(
                lambda _, ex: work(ex),
                actor=who,
                source=where,
                action=action,
                target=lambda _: target,
            ),
        )

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
