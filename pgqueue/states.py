"""Job states and the table of allowed transitions.

Every change of a job's state in pgqueue is one of the named transitions below, applied by
``pgqueue.sql`` as a guarded ``UPDATE ... WHERE state IN (<from states>)`` (plus the lease token
for transitions made by the worker holding the job). Nothing else writes ``pgqueue_jobs.state``.
The outcome of an attempt (``OutcomeKind``) names one of the lease-guarded transitions.

::

    enqueue      (new)              -> QUEUED      ticket inserted
    claim        QUEUED, RETRYING   -> RUNNING     ticket deleted, attempts + 1, lease taken
    complete     RUNNING            -> SUCCEEDED   lease checked, result stored, last error cleared
    retry        RUNNING            -> RETRYING    lease checked, error kept, ticket at now()+backoff
    fail         RUNNING            -> FAILED      lease checked, attempts exhausted or not retryable
    cancelled    RUNNING            -> CANCELLED   lease checked, handler saw the cancel request
    release      RUNNING            -> QUEUED      lease checked, graceful shutdown; attempt not counted
    snooze       RUNNING            -> QUEUED      lease checked, ticket at now()+delay, attempt not
                                                   counted, snoozes + 1 (past the ``max_snoozes``
                                                   setting the same statement writes retry or fail)
    suspend      RUNNING            -> QUEUED      lease checked, ``ctx.sleep`` or
                                                   ``ctx.wait_for_signal``: ticket at the wake
                                                   time (a signal moves it to now), attempt not
                                                   counted
    rescue       RUNNING            -> RETRYING    lease expired (database clock); ticket now
    rescue_fail  RUNNING            -> FAILED      lease expired and attempts exhausted
    cancel       QUEUED, RETRYING,  -> CANCELLED   ticket deleted (running jobs get a flag instead)
                 WAITING
    rerun        FAILED, CANCELLED  -> QUEUED      manual retry: ticket now, attempt count kept,
                                                   max_attempts raised to leave one more
    hold         (new)              -> WAITING     enqueued with unfinished dependencies, no ticket
    unblock      WAITING            -> QUEUED      the last dependency succeeded; ticket inserted
    abandon      WAITING            -> CANCELLED   a dependency failed for good or was cancelled
    close        WAITING            -> SUCCEEDED   a workflow's closing marker, when its last member
                                                   ended and every member succeeded (never runs)
    close_failed WAITING            -> FAILED      the same when a member failed or was cancelled

Atomic jobs take the same transitions: their claim commits like a leased one, and their
outcome is written in the handler's transaction, under the lease's token.

An operator may also change when and in what order a job that has not started runs. These edits
keep the job's state, and are guarded the same way (``WHERE state IN (<source states>)``)::

    reschedule   QUEUED, RETRYING,  -> (kept)      run_at of the job and of its ticket (a WAITING
                 WAITING                           job has none yet: its ticket takes the run_at
                                                   when it is unblocked); not of a suspended job
                                                   (``ctx.sleep``, ``ctx.wait_for_signal``), whose
                                                   ticket's run_at is its wake time
    reprioritize QUEUED, RETRYING,  -> (kept)      priority of the job and of its ticket
                 WAITING

Neither applies to a workflow's closing marker (it never runs), and neither moves the job's
``updated_at`` (its last state change, which a suspension is matched against).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Final


class JobState(enum.StrEnum):
    """Where a job is in its life. Stored as lowercase text."""

    QUEUED = "queued"  # waiting for its run_at, a ticket exists
    WAITING = "waiting"  # waiting for its dependencies to succeed; no ticket yet
    RUNNING = "running"  # claimed; held by a lease (and by its transaction, for atomic tasks)
    RETRYING = "retrying"  # an attempt failed; a ticket exists for the next one
    SUCCEEDED = "succeeded"
    FAILED = "failed"  # failed for good: attempts exhausted, unknown task, or rescued too often
    CANCELLED = "cancelled"

    @property
    def is_final(self) -> bool:
        return self in FINAL_STATES

    @property
    def phrase(self) -> str:
        """The state as the end of a sentence about the job: ``it has succeeded``, ``it is
        running``, ``it was cancelled``."""
        return _PHRASES[self]


_PHRASES: Final = {
    JobState.QUEUED: "is queued",
    JobState.WAITING: "is waiting for the jobs it depends on",
    JobState.RUNNING: "is running",
    JobState.RETRYING: "is waiting to be retried",
    JobState.SUCCEEDED: "has succeeded",
    JobState.FAILED: "has failed",
    JobState.CANCELLED: "was cancelled",
}
FINAL_STATES: Final = frozenset({JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED})
WAITING_STATES: Final = frozenset({JobState.QUEUED, JobState.RETRYING})
ACTIVE_STATES: Final = WAITING_STATES | {JobState.RUNNING}
# Not in ACTIVE_STATES on purpose: a job blocked on dependencies holds no ticket. It does hold
# its unique key (``UNIQUE_KEY_STATES``), so its release never meets another holder.
BLOCKED_STATES: Final = frozenset({JobState.WAITING})
# The states whose jobs hold their unique key (``models.UNIQUE_KEY_HELD``, the unique index's
# predicate): every state but the final ones.
UNIQUE_KEY_STATES: Final = ACTIVE_STATES | BLOCKED_STATES


@dataclass(frozen=True, slots=True)
class Transition:
    """A named, allowed change of state."""

    name: str
    sources: frozenset[JobState]
    target: JobState
    # Guarded by the fencing token of the worker holding the job: exactly the transitions an
    # attempt's outcome names (``OutcomeKind``), so a worker that lost its lease writes nothing.
    needs_lease: bool


def _t(name: str, sources: set[JobState], target: JobState, *, lease: bool) -> Transition:
    return Transition(name, frozenset(sources), target, lease)


CLAIM: Final = _t("claim", {JobState.QUEUED, JobState.RETRYING}, JobState.RUNNING, lease=False)
COMPLETE: Final = _t("complete", {JobState.RUNNING}, JobState.SUCCEEDED, lease=True)
RETRY: Final = _t("retry", {JobState.RUNNING}, JobState.RETRYING, lease=True)
FAIL: Final = _t("fail", {JobState.RUNNING}, JobState.FAILED, lease=True)
CANCELLED: Final = _t("cancelled", {JobState.RUNNING}, JobState.CANCELLED, lease=True)
RELEASE: Final = _t("release", {JobState.RUNNING}, JobState.QUEUED, lease=True)
SNOOZE: Final = _t("snooze", {JobState.RUNNING}, JobState.QUEUED, lease=True)
SUSPEND: Final = _t("suspend", {JobState.RUNNING}, JobState.QUEUED, lease=True)
RESCUE: Final = _t("rescue", {JobState.RUNNING}, JobState.RETRYING, lease=False)
RESCUE_FAIL: Final = _t("rescue_fail", {JobState.RUNNING}, JobState.FAILED, lease=False)
CANCEL: Final = _t(
    "cancel",
    {JobState.QUEUED, JobState.RETRYING, JobState.WAITING},
    JobState.CANCELLED,
    lease=False,
)
RERUN: Final = _t("rerun", {JobState.FAILED, JobState.CANCELLED}, JobState.QUEUED, lease=False)
UNBLOCK: Final = _t("unblock", {JobState.WAITING}, JobState.QUEUED, lease=False)
ABANDON: Final = _t("abandon", {JobState.WAITING}, JobState.CANCELLED, lease=False)
CLOSE: Final = _t("close", {JobState.WAITING}, JobState.SUCCEEDED, lease=False)
CLOSE_FAILED: Final = _t("close_failed", {JobState.WAITING}, JobState.FAILED, lease=False)

TRANSITIONS: Final[dict[str, Transition]] = {
    t.name: t
    for t in (
        CLAIM,
        COMPLETE,
        RETRY,
        FAIL,
        CANCELLED,
        RELEASE,
        SNOOZE,
        SUSPEND,
        RESCUE,
        RESCUE_FAIL,
        CANCEL,
        RERUN,
        UNBLOCK,
        ABANDON,
        CLOSE,
        CLOSE_FAILED,
    )
}


@dataclass(frozen=True, slots=True)
class Edit:
    """A named change of a job's fields, allowed from ``sources``, that keeps its state (and
    its ``updated_at``, the time of its last state change); ``suspended``: also of a suspended
    job."""

    name: str
    sources: frozenset[JobState]
    suspended: bool


RESCHEDULE: Final = Edit("reschedule", WAITING_STATES | BLOCKED_STATES, suspended=False)
REPRIORITIZE: Final = Edit("reprioritize", WAITING_STATES | BLOCKED_STATES, suspended=True)


def allowed(source: JobState, target: JobState) -> bool:
    """Whether any named transition leads from ``source`` to ``target``."""
    return any(source in t.sources and t.target is target for t in TRANSITIONS.values())


class WorkflowRole(enum.IntEnum):
    """What a workflow job receives when it is released and how it is settled
    (``Job.workflow_role``, stored as its number)."""

    MEMBER = 0  # a step that takes no parent's result (``task.si``, or a workflow's first step)
    TAKES_RESULT = 1  # its parent's result becomes its first positional argument (``task.s``)
    TAKES_RESULTS = 2  # the list of its parents' results, in order (after a group; a chord)
    CLOSING = 3  # the workflow's closing marker: never runs, ends the workflow
    ON_FAILURE = 4  # runs once, with the failed members, when the workflow failed


class OutcomeKind(enum.StrEnum):
    """How one attempt ended, as the worker writes it; each kind names its transition.

    A ``str`` enum whose values are the transition names, so a kind compares equal to its name.
    """

    COMPLETE = "complete"
    RETRY = "retry"
    FAIL = "fail"
    CANCELLED = "cancelled"
    RELEASE = "release"
    SNOOZE = "snooze"
    SUSPEND = "suspend"

    @property
    def transition(self) -> Transition:
        """The lease-guarded transition that writes an outcome of this kind."""
        return TRANSITIONS[self.value]
