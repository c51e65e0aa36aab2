"""Job rows edited by hand into nonsense fail alone, with a clear error.

Someone with database access can put anything in ``pgqueue_jobs``: arguments that do not fit
the function, ``null`` or an object where the args array belongs. Each such job must end FAILED
after one attempt (retrying cannot help) with an error saying what is wrong, and the worker must
carry on with the other jobs. A task name the worker does not register is not such an error: the
job waits for a worker that registers it (``test_unregistered_tasks.py``).
"""

from __future__ import annotations

from typing import Any

import pytest
from sqlalchemy import Engine, text

from pgqueue import PgQueue
from pgqueue.states import JobState
from pgqueue.testing import run_until_final


def _edit(engine: Engine, job_id: int, assignment: str, value: str) -> None:
    """``UPDATE pgqueue_jobs SET <assignment>`` for one job, as an operator would by hand."""
    with engine.begin() as connection:
        updated = connection.execute(
            text(f"UPDATE pgqueue_jobs SET {assignment} WHERE id = :id"), {"id": job_id, "v": value}
        ).rowcount
    assert updated == 1


# (what is edited, SET clause, bound value, fragment the recorded error must contain)
EDITS: list[tuple[str, str, str, str]] = [
    ("too many args", "args = CAST(:v AS json)", "[1, 2, 3]", "too many positional arguments"),
    ("missing arg", "args = CAST(:v AS json)", "[]", "missing a required argument: 'x'"),
    ("args null", "args = CAST(:v AS json)", "null", "args must be a JSON array"),
    ("args object", "args = CAST(:v AS json)", '{"x": 1}', "got dict and dict"),
    ("args string", "args = CAST(:v AS json)", '"1"', "got str and dict"),
    ("args number", "args = CAST(:v AS json)", "7", "got int and dict"),
    ("unknown kwarg", "kwargs = CAST(:v AS json)", '{"nope": 1}', "unexpected keyword argument"),
    ("kwargs null", "kwargs = CAST(:v AS json)", "null", "got list and NoneType"),
    ("kwargs array", "kwargs = CAST(:v AS json)", "[1]", "got list and list"),
]


@pytest.mark.parametrize("atomic", [False, True], ids=["leased", "atomic"])
def test_hand_edited_jobs_fail_alone_and_the_worker_keeps_going(
    pgq: PgQueue, engine: Engine, atomic: bool
) -> None:
    ran: list[Any] = []

    @pgq.task(name="malformed.takes_one", atomic=atomic, max_attempts=5)
    def takes_one(x: int) -> int:
        ran.append(("takes_one", x))
        return x

    @pgq.task(name="malformed.ok", atomic=atomic)
    def ok(n: int) -> int:
        ran.append(("ok", n))
        return n

    good: list[int] = []
    bad: dict[int, tuple[str, str]] = {}
    for index, (label, assignment, value, expected) in enumerate(EDITS):
        # Good jobs before and after each bad one, at the same priority, in the same queue.
        good.append(ok.enqueue(2 * index))
        job_id = takes_one.enqueue(index)
        _edit(engine, job_id, assignment, value)
        bad[job_id] = (label, expected)
        good.append(ok.enqueue(2 * index + 1))
    untouched = takes_one.enqueue(100)

    states = run_until_final(pgq, [*good, *bad, untouched], timeout=60)

    assert {states[i] for i in good} == {JobState.SUCCEEDED}
    assert states[untouched] is JobState.SUCCEEDED
    assert sorted(n for name, n in ran if name == "ok") == list(range(2 * len(EDITS)))
    # No handler ran for a malformed job: only the untouched takes_one job called the function.
    assert [x for name, x in ran if name == "takes_one"] == [100]
    problems = []
    for job_id, (label, expected) in bad.items():
        job = pgq.get_job(job_id)
        recorded = [entry["error"] for entry in job.errors]
        if not (
            job.state is JobState.FAILED
            and job.attempts == 1  # failed for good at once: a retry cannot fix the row
            and job.last_error is not None
            and expected in job.last_error
            and recorded == [job.last_error]
            and job.lease_token is None
            and job.finished_at is not None
        ):
            problems.append((label, job.state, job.attempts, job.last_error, recorded))
    assert problems == []
