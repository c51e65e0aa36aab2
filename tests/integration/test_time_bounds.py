"""Durations and moments given inside a handler are held to the bound enqueue's ``delay`` has
(``validation.MAX_DELAY_SECONDS``, 3650 days), on real PostgreSQL with a real worker: a
``ctx.sleep`` or ``ctx.wait_for_signal`` beyond it (sync or async) fails the attempt naming the
parameter and the bound, stores no step and no wake time, and every job stays readable
(``get_job``, ``admin.list_jobs``, ``explain``).
"""

from __future__ import annotations

import datetime as dt

from sqlalchemy import text

from pgqueue import JobContext, JobState, PgQueue
from pgqueue.validation import MAX_DELAY_SECONDS

# Years past 9999 from now, where the database stores a time Python cannot read back.
HUGE = 3.2e11


def test_sleeps_and_waits_beyond_the_bound_fail_the_attempt_and_store_no_time(
    pgq: PgQueue,
) -> None:
    @pgq.task(name="long_sleep", pass_context=True, max_attempts=1)
    def long_sleep(ctx: JobContext) -> None:
        ctx.sleep(HUGE)

    @pgq.task(name="long_wait", pass_context=True, max_attempts=1)
    def long_wait(ctx: JobContext) -> None:
        ctx.wait_for_signal("go", timeout=1e12)

    @pgq.task(name="long_asleep", pass_context=True, max_attempts=1)
    async def long_asleep(ctx: JobContext) -> None:
        await ctx.asleep(dt.timedelta(days=3651))

    @pgq.task(name="long_await", pass_context=True, max_attempts=1)
    async def long_await(ctx: JobContext) -> None:
        await ctx.await_signal("go", timeout=MAX_DELAY_SECONDS + 1)

    ids = [long_sleep.enqueue(), long_wait.enqueue(), long_asleep.enqueue(), long_await.enqueue()]
    pgq.run_worker(drain=True, concurrency=1)

    jobs = [pgq.get_job(job_id) for job_id in ids]
    assert [job.state for job in jobs] == [JobState.FAILED] * 4
    errors = [job.last_error or "" for job in jobs]
    bound = f"must be at most {MAX_DELAY_SECONDS} seconds (3650 days)"
    assert f"sleep {bound}, got {HUGE!r}" in errors[0], errors[0]
    assert f"wait_for_signal timeout {bound}, got 1000000000000.0" in errors[1], errors[1]
    assert f"sleep {bound}, got {float(MAX_DELAY_SECONDS + 86_400)!r}" in errors[2], errors[2]
    assert f"await_signal timeout {bound}" in errors[3], errors[3]
    with pgq.engine.connect() as connection:
        steps = connection.execute(text("SELECT count(*) FROM pgqueue_job_steps")).scalar_one()
        latest = connection.execute(
            text(
                "SELECT max(run_at) - now() FROM (SELECT run_at FROM pgqueue_jobs"
                " UNION ALL SELECT run_at FROM pgqueue_message_queue) AS times"
            )
        ).scalar_one()
    assert steps == 0
    assert latest <= dt.timedelta(0)
    listed = pgq.admin.list_jobs()
    assert sorted(job.id for job in listed.jobs) == sorted(ids)
