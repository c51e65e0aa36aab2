"""``pgqueue explain ID`` names what keeps a job from running, each blocker set up for real: a
future ``run_at``, a paused queue, a queue at its limit (jobs held RUNNING by real claims),
unfinished dependencies, a row written by hand without a ticket, a finished job, an unknown id.
The blockers that involve live workers are in ``tests/e2e/test_explain_workers.py``."""

from __future__ import annotations

import datetime as dt
import json
import re
from typing import Any

import pytest
from sqlalchemy import text
from sqlalchemy.engine import URL
from support.processes import run_pgqueue

from pgqueue import JobState, PgQueue, backoff
from pgqueue.data import claim as claim_data
from pgqueue.data.claim import LimitsSeen
from pgqueue.db import executor_for
from pgqueue.explain import BlockerKind
from pgqueue.testing import run_until_final


def explain_lines(job_id: int, url: URL) -> list[str]:
    """The output of ``pgqueue explain JOB_ID``: the headline, then one line per blocker."""
    result = run_pgqueue("explain", str(job_id), url=url)
    assert result.returncode == 0, result.stderr[-2000:]
    return result.stdout.splitlines()


def explain_json(job_id: int, url: URL) -> dict[str, Any]:
    result = run_pgqueue("explain", str(job_id), "--json", url=url)
    assert result.returncode == 0, result.stderr[-2000:]
    data: dict[str, Any] = json.loads(result.stdout)
    return data


def kinds(data: dict[str, Any]) -> list[str]:
    return [blocker["kind"] for blocker in data["blockers"]]


def claim(pgq: PgQueue, queue: str, count: int) -> list[int]:
    """Take ``count`` jobs of ``queue`` RUNNING with a real claim, as a worker would."""
    with pgq.sessions() as session, session.begin():
        claimed = claim_data.claim(
            executor_for(session),
            worker_id="test-claimer",
            limit=count,
            queues=[queue],
            lease_seconds=600.0,
            task_leases={},
            limits=LimitsSeen(),
        )
    return sorted(job.id for job in claimed)


def test_future_run_at_is_named_with_its_time(pgq: PgQueue, database_url: URL) -> None:
    @pgq.task(name="later")
    def later() -> None: ...

    job_id = later.configure(delay=3600).enqueue()
    run_at = pgq.get_job(job_id).run_at
    lines = explain_lines(job_id, database_url)
    assert lines[0] == f"job {job_id} (later, queue default): queued"
    scheduled = [line for line in lines if line.strip().startswith("scheduled:")]
    assert len(scheduled) == 1, lines
    assert f"{run_at.astimezone(dt.UTC):%Y-%m-%d %H:%M:%S} UTC" in scheduled[0]
    assert re.search(r"in (59 min \d+ s|1 h 0 min)", scheduled[0]), scheduled[0]
    data = explain_json(job_id, database_url)
    assert kinds(data)[0] == BlockerKind.SCHEDULED
    assert 3500 < data["blockers"][0]["data"]["seconds"] <= 3600


@pytest.mark.slow
def test_paused_queue_is_named_and_listed_with_a_future_run_at(
    pgq: PgQueue, database_url: URL
) -> None:
    @pgq.task(name="mail", queue="mail")
    def mail() -> None: ...

    now_job = mail.enqueue()
    later_job = mail.configure(delay=600).enqueue()
    pgq.pause_queue("mail")
    lines = explain_lines(now_job, database_url)
    assert any(line.strip().startswith("paused: queue mail is paused") for line in lines), lines
    assert kinds(explain_json(now_job, database_url))[:1] == ["paused"]
    # Both hold: listed in the order the claim checks them.
    assert kinds(explain_json(later_job, database_url))[:2] == ["scheduled", "paused"]
    pgq.resume_queue("mail")
    assert "paused" not in kinds(explain_json(now_job, database_url))


@pytest.mark.slow
def test_queue_at_its_limit_lists_the_running_job_ids(pgq: PgQueue, database_url: URL) -> None:
    @pgq.task(name="report", queue="reports")
    def report(n: int) -> None: ...

    pgq.set_queue_limit("reports", 2)
    ids = report.enqueue_many([[n] for n in range(3)])
    running = claim(pgq, "reports", 3)  # the limit lets the claim take two
    assert running == ids[:2]
    waiting = ids[2]
    lines = explain_lines(waiting, database_url)
    at_limit = [line for line in lines if line.strip().startswith("at_limit:")]
    assert at_limit == [
        f"  at_limit: queue reports is at its limit of 2 running jobs: {running[0]}, {running[1]}"
    ], lines
    blocker = explain_json(waiting, database_url)["blockers"][0]
    assert blocker["kind"] == "at_limit"
    assert blocker["data"]["running_job_ids"] == running
    assert blocker["data"]["limit"] == 2
    pgq.set_queue_limit("reports", 3)
    assert "at_limit" not in kinds(explain_json(waiting, database_url))


def test_dependencies_are_named_with_their_states(pgq: PgQueue, database_url: URL) -> None:
    @pgq.task(name="step", queue="steps")
    def step(name: str) -> None: ...

    first = step.enqueue("first")
    second = step.configure(delay=3600).enqueue("second")
    (running,) = claim(pgq, "steps", 1)
    assert running == first
    last = step.configure(depends_on=[first, second]).enqueue("last")
    assert pgq.get_job(last).state is JobState.WAITING
    lines = explain_lines(last, database_url)
    assert lines[0].endswith(": waiting")
    assert (
        f"  dependencies: waiting for 2 of 2 dependencies: {first} (running), {second} (queued)"
        in lines
    ), lines
    data = explain_json(last, database_url)
    assert kinds(data)[0] == "dependencies"
    assert data["blockers"][0]["data"]["dependencies"] == [
        {"id": first, "state": "running"},
        {"id": second, "state": "queued"},
    ]


def test_hand_written_row_without_a_ticket_says_so(pgq: PgQueue, database_url: URL) -> None:
    with pgq.engine.begin() as connection:
        job_id = connection.execute(
            text(
                "INSERT INTO pgqueue_jobs (task_name, state) VALUES ('by_hand', 'queued') RETURNING id"
            )
        ).scalar_one()
    lines = explain_lines(job_id, database_url)
    assert lines[1].startswith("  no_ticket: the job is queued but has no ticket"), lines
    assert "no worker can claim it" in lines[1]
    assert kinds(explain_json(job_id, database_url))[0] == "no_ticket"


def test_finished_jobs_say_how_they_ended(pgq: PgQueue, database_url: URL) -> None:
    @pgq.task(name="boom", max_attempts=2, retry=backoff.constant(0))
    def boom() -> None:
        raise ValueError("the disk is full")

    @pgq.task(name="fine")
    def fine() -> int:
        return 1

    failed, succeeded = boom.enqueue(), fine.enqueue()
    run_until_final(pgq, [failed, succeeded])
    lines = explain_lines(failed, database_url)
    assert lines[0] == f"job {failed} (boom, queue default): failed"
    assert re.fullmatch(
        r"  finished: failed at .* UTC after 2 attempts, last error: "
        r"ValueError: the disk is full \(`pgqueue retry \d+` runs it again\)",
        lines[1],
    ), lines
    assert explain_lines(succeeded, database_url)[1].startswith("  finished: succeeded at ")


@pytest.mark.slow
def test_unknown_id_is_one_line_and_exit_code_2(database_url: URL) -> None:
    result = run_pgqueue("explain", "987654", url=database_url)
    assert result.returncode == 2
    assert result.stderr.strip() == "error: no job with id 987654"
    assert result.stdout == ""
    beyond_bigint = str(2**63)
    for command in ("explain", "show", "retry", "cancel", "workflow"):
        result = run_pgqueue(command, beyond_bigint, url=database_url)
        what = "workflow id" if command == "workflow" else "job id"
        assert (result.returncode, result.stderr) == (
            2,
            f"error: {what} must be at most {2**63 - 1} (a bigint), got {beyond_bigint}\n",
        ), command
    result = run_pgqueue("explain", "--", "0", url=database_url)
    assert (result.returncode, result.stderr) == (
        2,
        "error: job id must be a positive int, got 0\n",
    )


def test_ready_job_without_a_live_worker_names_the_missing_worker(
    pgq: PgQueue, database_url: URL
) -> None:
    @pgq.task(name="nobody", queue="lonely")
    def nobody() -> None: ...

    job_id = nobody.enqueue()
    lines = explain_lines(job_id, database_url)
    assert lines[1:] == [
        "  no_live_worker: no live worker serves queue lonely (no worker is alive at all): "
        "start one with `pgqueue worker APP --queues lonely`"
    ], lines
