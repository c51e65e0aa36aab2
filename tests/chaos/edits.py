"""The operator's edits in a chaos run, made with the dashboard's admin actions (``pgq.admin``).

Plain jobs are enqueued to run seconds to a minute later (``EditedJob``: a leased kind and an
atomic one); the operator reschedules them (later or earlier), runs them now or gives them
another priority, and pauses, resumes and runs now the periodic schedule every worker ticks
(``app.TICK_SCHEDULE``). It goes on the clock and draws from a ``random.Random`` of its own, as
the workload's other side streams do, so the main stream's choices stay a seed's.

Every call is recorded (``Call``) before it is made, with an actor of its own, so the checks
(``edit_checks``) find its audit record, or see that it has none, whatever it came to:
accepted, refused (a job that started or ended, a schedule already so: nothing may be written),
or failed (a fault took the answer: its commit is unknown). At the stop the operator pauses the
schedule for good (no tick lands while the workers drain) and runs now every edited job still
due later, so each must have run by the final check.
"""

from __future__ import annotations

import datetime as dt
import functools
import random
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

from sqlalchemy import text

from pgqueue import InvalidStateTransition, JobNotFound

from .app import TICK_SCHEDULE

# Every call's actor begins so (the snapshot reads the audit records of these only).
ACTOR_PREFIX = "chaos-operator-"
LEASED_KIND = "edited"
ATOMIC_KIND = "atomic_edited"
ATOMIC_SHARE = 0.3
# Seconds between two enqueues of jobs to edit, and between two edits.
ENQUEUE_EVERY = (0.8, 2.0)
EDIT_EVERY = (0.3, 1.0)
# How far ahead a job to edit is enqueued: mostly soon enough to run under the faults, some up
# to a minute ahead (those the run's end finds waiting are run now at the stop).
SOON = (2.0, 15.0)
LATER = (15.0, 60.0)
LATER_SHARE = 0.3
# Seconds a reschedule to later adds to the job's run_at (or to now, once it is due); where a
# reschedule to earlier puts it, around now (a past time means now).
LATER_BY = (2.0, 15.0)
EARLIER_AT = (-3.0, 2.0)
ENQUEUE_PRIORITIES = (-5, 5)
PRIORITIES = (-20, 20)
# An edit picks one of the latest jobs enqueued to edit: most still wait, some ran already.
RECENT = 15
# The edits, by weight; "schedule" is one of the schedule's moves (``_schedule_move``).
EDITS = {
    "reschedule_later": 30,
    "reschedule_earlier": 15,
    "run_now": 20,
    "set_priority": 25,
    "schedule": 10,
}
# Seconds a pause of the schedule lasts before the operator resumes it.
PAUSE_FOR = (2.0, 8.0)

ACCEPTED = "accepted"
REFUSED = "refused"
FAILED = "failed"
PENDING = "pending"


@dataclass
class EditedJob:
    """A job enqueued for the operator to edit."""

    id: int
    kind: str  # LEASED_KIND (chaos.leased) or ATOMIC_KIND (chaos.atomic)
    priority: int  # as enqueued
    run_at: float  # when it is to run as far as the operator knows (wall clock)
    enqueued: float  # when its enqueue returned (wall clock)


@dataclass
class Call:
    """One admin call of the operator's. ``outcome`` is written last, once the values it goes
    with are: a check that reads it first sees those values set."""

    number: int
    action: str  # as its audit record names it: reschedule, run_now, set_priority,
    # pause_schedule, resume_schedule, run_schedule
    actor: str
    before: float  # wall clock as it was made
    job_id: int | None = None  # the job edited, or the one run_schedule enqueued
    requested: dt.datetime | None = None  # the run_at a reschedule asked for
    run_at: dt.datetime | None = None  # the run_at a reschedule or run_now wrote
    priority: int | None = None  # set_priority's
    after: float | None = None  # wall clock as it returned
    outcome: str = PENDING
    detail: str = ""  # why it was refused or failed


@dataclass
class Edits:
    """Enqueues the jobs to edit and makes the operator's edits, on the clock (see the
    module); ``step`` from the workload's loop, ``finish`` at the stop."""

    app: ModuleType
    seed: int
    event: Callable[[str, str], None]  # records an admin move (``Workload._event``)
    errors: Counter[str] = field(default_factory=Counter)  # the workload's failed calls
    calls: list[Call] = field(default_factory=list)
    jobs: dict[int, EditedJob] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.rng = random.Random(f"{self.seed}-edits")
        self.next_enqueue = float("inf")
        self.next_edit = float("inf")
        # When to resume the schedule the operator paused (None: it is not paused).
        self.resume_due: float | None = None

    def start(self, now: float) -> None:
        self.next_enqueue = now + self.rng.uniform(*ENQUEUE_EVERY)
        self.next_edit = now + self.rng.uniform(*EDIT_EVERY)

    def step(self, now: float) -> None:
        """Whatever is due at ``now``: a resume, an enqueue, an edit."""
        if self.resume_due is not None and self.resume_due <= now:
            self.resume_due = None
            self._switch_schedule(paused=False)
        if now >= self.next_enqueue:
            self.next_enqueue = now + self.rng.uniform(*ENQUEUE_EVERY)
            self._enqueue()
        if now >= self.next_edit:
            self.next_edit = now + self.rng.uniform(*EDIT_EVERY)
            self._edit()

    def finish(self) -> None:
        """Pause the schedule for good, and run now every edited job still due later (each
        tried until it is not a fault that answers: a job left waiting, or a tick enqueued
        during the drain, would be left undone at the final check)."""
        self.resume_due = None
        self._until_answered(lambda: self._switch_schedule(paused=True))
        due_later = None
        for attempt in range(10):
            try:
                due_later = self._due_later()
                break
            except Exception as exc:
                self.errors[f"edited jobs due later: {type(exc).__name__}"] += 1
                time.sleep(0.5 * (attempt + 1))
        for job_id in due_later or []:
            self._until_answered(functools.partial(self._reschedule, job_id, None))

    def counts(self) -> str:
        """How many calls of each action came to what, for the report."""
        by_action: dict[str, Counter[str]] = {}
        for call in self.calls:
            by_action.setdefault(call.action, Counter())[call.outcome] += 1
        return ", ".join(
            f"{action} {sum(n.values())} ("
            + ", ".join(f"{n[o]} {o}" for o in (ACCEPTED, REFUSED, FAILED, PENDING) if n[o])
            + ")"
            for action, n in sorted(by_action.items())
        )

    # -- the jobs to edit ----------------------------------------------------------------

    def _enqueue(self) -> None:
        atomic = self.rng.random() < ATOMIC_SHARE
        late = self.rng.random() < LATER_SHARE
        delay = self.rng.uniform(*(LATER if late else SOON))
        priority = self.rng.randint(*ENQUEUE_PRIORITIES)
        seconds = self.rng.uniform(0, 0.2)
        kind = ATOMIC_KIND if atomic else LEASED_KIND
        task = (self.app.atomic if atomic else self.app.leased).configure(
            delay=delay, priority=priority
        )
        try:
            job_id = int(task.enqueue(kind=kind, seconds=seconds))
        except Exception as exc:
            self.errors[f"enqueue: {type(exc).__name__}"] += 1
            return
        now = time.time()
        self.jobs[job_id] = EditedJob(job_id, kind, priority, now + delay, now)

    def _due_later(self) -> list[int]:
        """The jobs to edit (of the operator's and of any enqueue whose answer was lost) still
        waiting for a run_at after now."""
        with self.app.pgq.engine.connect() as connection:
            return list(
                connection.execute(
                    text(
                        "SELECT id FROM pgqueue_jobs WHERE kwargs::jsonb ->> 'kind' IN (:leased,"
                        " :atomic) AND state IN ('queued', 'retrying') AND run_at > now()"
                        " ORDER BY id"
                    ),
                    {"leased": LEASED_KIND, "atomic": ATOMIC_KIND},
                ).scalars()
            )

    # -- the edits -----------------------------------------------------------------------

    def _edit(self) -> None:
        edit = self.rng.choices(list(EDITS), list(EDITS.values()))[0]
        if edit == "schedule":
            self._schedule_move()
            return
        recent = list(self.jobs.values())[-RECENT:]
        if not recent:
            return
        job = self.rng.choice(recent)
        now = time.time()
        if edit == "reschedule_later":
            self._reschedule(job.id, max(job.run_at, now) + self.rng.uniform(*LATER_BY))
        elif edit == "reschedule_earlier":
            self._reschedule(job.id, now + self.rng.uniform(*EARLIER_AT))
        elif edit == "run_now":
            self._reschedule(job.id, None)
        else:
            self._set_priority(job.id, self.rng.randint(*PRIORITIES))

    def _reschedule(self, job_id: int, at: float | None) -> Call:
        """A reschedule to ``at`` (wall clock), or a run_now (None)."""
        admin = self.app.pgq.admin
        requested = None if at is None else dt.datetime.fromtimestamp(at, dt.UTC)

        def act(call: Call) -> bool:
            if requested is None:
                call.run_at = admin.run_now(job_id, actor=call.actor)
            else:
                call.run_at = admin.reschedule(job_id, requested, actor=call.actor)
            job = self.jobs.get(job_id)
            if job is not None:
                job.run_at = call.run_at.timestamp()
            return True

        action = "run_now" if requested is None else "reschedule"
        return self._call(action, act, job_id=job_id, requested=requested)

    def _set_priority(self, job_id: int, priority: int) -> Call:
        def act(call: Call) -> bool:
            self.app.pgq.admin.set_priority(job_id, priority, actor=call.actor)
            return True

        return self._call("set_priority", act, job_id=job_id, priority=priority)

    def _schedule_move(self) -> None:
        """Pause the schedule (resumed a few seconds later) or run it now; now and then a
        pause of the paused schedule or a resume of the running one, which change nothing and
        are refused."""
        draw = self.rng.random()
        if self.resume_due is None:
            if draw < 0.5:
                self.resume_due = time.time() + self.rng.uniform(*PAUSE_FOR)
                self._switch_schedule(paused=True)
            elif draw < 0.85:
                self._run_schedule()
            else:
                self._switch_schedule(paused=False)
        elif draw < 0.6:
            self._run_schedule()
        else:
            self._switch_schedule(paused=True)

    def _switch_schedule(self, *, paused: bool) -> Call:
        admin = self.app.pgq.admin
        switch = admin.pause_schedule if paused else admin.resume_schedule
        action = "pause_schedule" if paused else "resume_schedule"
        # False: it was so already, and nothing was written.
        return self._call(action, lambda call: bool(switch(TICK_SCHEDULE, actor=call.actor)))

    def _run_schedule(self) -> Call:
        def act(call: Call) -> bool:
            call.job_id = int(self.app.pgq.admin.run_schedule_now(TICK_SCHEDULE, actor=call.actor))
            return True

        return self._call("run_schedule", act)

    def _call(self, action: str, act: Callable[[Call], bool], **values: Any) -> Call:
        """Record a call of ``action``, then make it (``act`` fills in what it wrote and says
        whether it changed anything); its outcome recorded as it returns."""
        number = len(self.calls) + 1
        call = Call(number, action, f"{ACTOR_PREFIX}{self.seed}-{number}", time.time(), **values)
        self.calls.append(call)
        try:
            outcome = ACCEPTED if act(call) else REFUSED
            detail = "" if outcome == ACCEPTED else "changed nothing"
        except (InvalidStateTransition, JobNotFound) as exc:
            outcome, detail = REFUSED, type(exc).__name__
        except Exception as exc:
            outcome, detail = FAILED, type(exc).__name__
            self.errors[f"{action}: {detail}"] += 1
        call.after = time.time()
        call.detail = detail
        call.outcome = outcome
        target = f"job {call.job_id}" if call.job_id is not None else TICK_SCHEDULE
        self.event(action, f"{target}: {outcome}" + (f" ({detail})" if detail else ""))
        return call

    def _until_answered(self, make: Callable[[], Call]) -> None:
        """``make()`` a call again until it is accepted or refused (a few tries)."""
        for attempt in range(10):
            if make().outcome != FAILED:
                return
            time.sleep(0.5 * (attempt + 1))
