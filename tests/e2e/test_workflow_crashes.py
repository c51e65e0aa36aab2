"""Workflows run by real worker processes: a chord's callback runs once, with every result in
order, while workers are SIGKILLed and restarted, and through PgBouncer in transaction mode."""

from __future__ import annotations

import signal
import time
from typing import TYPE_CHECKING

import pytest
from sqlalchemy.engine import URL

from pgqueue import PgQueue, Settings, chord

if TYPE_CHECKING:
    from conftest import App


def _declared(pgq: PgQueue) -> tuple[object, object]:
    """The e2e app's ``member`` and ``gather``, declared here to enqueue them."""

    @pgq.task(name="member", max_attempts=25)
    def member(x: int, seconds: float = 0.0) -> int:
        return x

    @pgq.task(name="gather", pass_context=True, max_attempts=25)
    def gather(ctx: object, results: list[int]) -> int:
        return len(results)

    return member, gather


@pytest.mark.slow
def test_a_chord_of_10000_calls_back_once_while_workers_are_killed_every_2_seconds(
    app: App,
) -> None:
    members = 10_000
    pgq = PgQueue(app.url, settings=Settings())
    member, gather = _declared(pgq)
    wf = chord(
        [member.s(i, 0.002) for i in range(members)],  # type: ignore[attr-defined]
        gather.s(),  # type: ignore[attr-defined]
    ).enqueue()
    options = ("--concurrency", "8", "--lease-seconds", "2")
    workers = [app.start_worker(*options, rescue_interval=0.5) for _ in range(4)]
    deadline = time.monotonic() + 300
    victim = 0
    while pgq.get_workflow(wf.id).state == "running":
        assert time.monotonic() < deadline, "the chord did not end within 300 s"
        time.sleep(2)
        workers[victim].signal(signal.SIGKILL)
        workers[victim].wait(10)
        workers[victim] = app.start_worker(*options, rescue_interval=0.5)
        victim = (victim + 1) % len(workers)
    callback_id = wf.job_ids[-1]
    # The closing marker depends on the callback too: the workflow ended after the callback.
    status = pgq.get_workflow(wf.id)
    assert status.state == "succeeded"
    assert status.result == members
    runs = app.rows(
        "SELECT attempt, info FROM ledger WHERE tag = 'callback' AND job_id = :id",
        id=callback_id,
    )
    # Every run got the full, ordered list, never fewer results. A run killed before its outcome
    # was written shows as a second mark (at-least-once handlers); a worker killed between the
    # claim's commit and the mark's leaves an attempt with no mark. So: one mark per attempt at
    # most, and the attempt that succeeded is the last one marked.
    assert runs, "the callback never ran"
    assert {r.info for r in runs} == {f"{members} True"}
    job = pgq.get_job(callback_id)
    marked_attempts = [r.attempt for r in runs]
    assert len(set(marked_attempts)) == len(marked_attempts), marked_attempts
    assert max(marked_attempts) == job.attempts
    assert app.scalars("SELECT count(*) FROM pgqueue_jobs WHERE state <> 'succeeded'") == [0]
    pgq.dispose()


@pytest.mark.slow
def test_a_chord_through_pgbouncer_in_transaction_mode(app: App, bouncer: URL) -> None:
    members = 10_000
    pgq = PgQueue(bouncer, settings=Settings(pooler="transaction"))
    member, gather = _declared(pgq)
    wf = chord(
        [member.s(i) for i in range(members)],  # type: ignore[attr-defined]
        gather.s(),  # type: ignore[attr-defined]
    ).enqueue()
    returncode, output = app.drain_through_bouncer(bouncer)
    assert returncode == 0, output
    for marker in ("ERROR", "Traceback"):
        assert marker not in output, output
    status = pgq.get_workflow(wf.id)
    assert (status.state, status.result) == ("succeeded", members)
    runs = app.rows("SELECT info FROM ledger WHERE tag = 'callback'")
    assert [r.info for r in runs] == [f"{members} True"]
    pgq.dispose()
