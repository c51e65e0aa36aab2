"""The values of an explanation: what can hold a job back (``BlockerKind``), one entry of an
explanation (``Blocker``), the whole answer (``JobExplanation``), the facts it is made from
(``JobFacts``) and the caps that bound every read behind them.
"""

from __future__ import annotations

import datetime as dt
import enum
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from pgqueue.states import JobState

# Counting tickets ahead stops here ("at least"), so a deep queue costs no more to explain.
AHEAD_CAP: Final = 10_000
# Job and worker ids listed in one sentence (the running jobs of a full queue, the live workers).
LIST_CAP: Final = 20
# Dependencies read for one job; a job with more names the first ones and counts the rest.
DEPENDENCY_CAP: Final = 200


class BlockerKind(enum.StrEnum):
    """What an entry of a ``JobExplanation`` says, in the order the claim checks it."""

    FINISHED = "finished"
    """The job ended (succeeded, failed or cancelled): nothing will run it again by itself."""
    LEASE_HELD = "lease_held"
    """It is RUNNING: a worker holds its lease (who, last seen when, until when)."""
    NO_TICKET = "no_ticket"
    """QUEUED or RETRYING without a ticket (a row written by hand): no claim can find it."""
    DEPENDENCIES = "dependencies"
    """WAITING for dependencies to succeed (which, and their states)."""
    SCHEDULED = "scheduled"
    """Its ``run_at`` is in the future (when)."""
    SUSPENDED = "suspended"
    """Its handler suspended it: ``ctx.sleep`` (until when) or ``ctx.wait_for_signal`` (which
    signal, until which deadline, and whether the signal has arrived)."""
    PAUSED = "paused"
    """Its queue is paused."""
    AT_LIMIT = "at_limit"
    """Its queue is at its concurrency limit (the RUNNING jobs filling it)."""
    RATE_LIMITED = "rate_limited"
    """Its queue's (or its key's) rate limit is used up for now (when the window frees)."""
    KEY_AT_LIMIT = "key_at_limit"
    """Its concurrency key is at its limit (the RUNNING jobs with the key)."""
    KEY_IN_CONTROLLED_QUEUE = "key_in_controlled_queue"
    """It has a concurrency key and its queue a concurrency or rate limit: such jobs wait."""
    NO_LIVE_WORKER = "no_live_worker"
    """No live worker claims from its queue."""
    TASK_NOT_REGISTERED = "task_not_registered"
    """Live workers claim from its queue, but none registers its task: it waits for one that
    does (a rolling deploy under way, or a task removed from the code)."""
    CLAIMS_FAILING = "claims_failing"
    """Every live worker serving its queue fails to claim (each one's error, for how long)."""
    READY = "ready"
    """Nothing blocks it: claimable now, with this many tickets of its queue ahead of it."""
    BOUNDED = "bounded"
    """Informational, never a blocker: its queue is bounded (its ``max_depth`` and how many
    jobs wait in it now). A bound refuses new enqueues; it never holds back a waiting job."""


@dataclass(frozen=True, slots=True)
class Blocker:
    """One reason, as a kind, a sentence and its data (JSON-ready values and datetimes)."""

    kind: BlockerKind
    message: str
    data: Mapping[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """``{"kind", "message", "data"}`` with datetimes in ISO 8601."""
        return {"kind": self.kind.value, "message": self.message, "data": _jsonable(self.data)}


@dataclass(frozen=True, slots=True)
class JobExplanation:
    """Why job ``job_id`` is (not) running, as checked at ``checked_at`` (database clock)."""

    job_id: int
    task_name: str
    queue: str
    state: JobState
    checked_at: dt.datetime
    blockers: tuple[Blocker, ...]

    @property
    def kinds(self) -> tuple[BlockerKind, ...]:
        """The kinds of the entries, in order."""
        return tuple(blocker.kind for blocker in self.blockers)

    @property
    def headline(self) -> str:
        """``job 42 (send_receipt, queue default): queued``."""
        return f"job {self.job_id} ({self.task_name}, queue {self.queue}): {self.state.value}"

    def to_dict(self) -> dict[str, Any]:
        """The explanation as JSON-ready values."""
        return {
            "job_id": self.job_id,
            "task_name": self.task_name,
            "queue": self.queue,
            "state": self.state.value,
            "checked_at": self.checked_at.isoformat(),
            "blockers": [blocker.to_dict() for blocker in self.blockers],
        }


@dataclass(frozen=True, slots=True)
class JobFacts:
    """What the database says about one job, its queue and the workers (see ``explain_job``)."""

    job: Any
    """The ``sql.explain.job_facts`` row."""
    running_ids: Sequence[int]
    """RUNNING jobs of the queue (up to ``LIST_CAP``), read when the queue has a limit."""
    dependencies: Mapping[int, JobState | None]
    """Each dependency read (up to ``DEPENDENCY_CAP``) -> its state, None when it is gone."""
    ahead: int | None
    """Ready tickets of the queue ahead of the job's (capped at ``AHEAD_CAP``); None without a
    ticket."""
    holder: Sequence[Any] | None
    """The ``sql.workers.job_holder`` row of a running job (lease owner, host, pid, last seen,
    seconds since seen, live), None when its worker is not registered."""
    serving_workers: Sequence[str]
    """Live workers claiming from the queue (up to ``LIST_CAP``)."""
    live_workers: int
    """Live workers in all (up to ``LIST_CAP``)."""
    failing_workers: Mapping[str, tuple[str, float]] = field(default_factory=dict)
    """Of ``serving_workers``, those whose claims fail: id -> (error, seconds failing)."""
    bound: tuple[int, int] | None = None
    """``(max_depth, depth)`` of a bounded queue (depth counted up to one more than the
    bound), None when the queue is unbounded or the job does not wait."""
    key: Any = None
    """The ``sql.flow.key_facts`` row of a waiting job's concurrency key (None: no key)."""
    key_running_ids: Sequence[int] = ()
    """RUNNING jobs with the job's key (up to ``LIST_CAP``), read when the key is at its limit."""
    queue_rate: Any = None
    """The ``sql.flow.queue_rate_facts`` row when the job's queue has a rate limit."""
    task_registered: bool = True
    suspension: Any = None
    """The ``sql.signals.suspension`` row (signal, wake time, arrived) of a QUEUED job its
    handler suspended, None otherwise."""
    """Whether a live worker serving the queue registers the job's task (read when the job
    waits and some live worker serves the queue)."""


def _jsonable(value: Any) -> Any:
    if isinstance(value, dt.datetime):
        return value.isoformat()
    if isinstance(value, Mapping):
        return {key: _jsonable(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_jsonable(item) for item in value]
    return value
