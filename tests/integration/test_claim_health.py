"""A worker whose claims fail is alive but takes no work: it must show as unhealthy.

The database refuses the worker's claims (a statement trigger on the ticket table raises
"permission denied", as for a role missing a grant); its heartbeat and registry writes still
work. Within one heartbeat the registry row carries the error and since when (``pgqueue
workers``, its ``--json``, the admin API), ``pgqueue explain`` on a waiting job names it,
``pgqueue_claim_failures_total`` counts the attempts, and the log has one line with the
traceback, not one per retry. When the database accepts claims again, the job runs, the row is
healthy again and one line says so.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterator

import pytest
from click.testing import CliRunner
from sqlalchemy import Engine, text
from support.polling import wait_until
from support.workers import in_thread

from pgqueue import PgQueue, metrics
from pgqueue.cli import main as cli_main
from pgqueue.worker import Worker

REFUSE = """
CREATE FUNCTION refuse_claims() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'claims refused by the test' USING ERRCODE = '42501';
END $$;
CREATE TRIGGER refuse_claims BEFORE DELETE ON pgqueue_message_queue
    FOR EACH STATEMENT EXECUTE FUNCTION refuse_claims();
"""
ACCEPT = "DROP TRIGGER refuse_claims ON pgqueue_message_queue"
HEARTBEAT_SECONDS = 3.0


def _claim_failures() -> float:
    value = metrics.registry().get_sample_value("pgqueue_claim_failures_total")
    return float(value or 0.0)


@pytest.fixture
def worker(pgq: PgQueue) -> Iterator[Worker]:
    metrics.enable()  # the worker records into this process's registry
    # lease_seconds / 3 is the heartbeat's interval.
    with in_thread(Worker(pgq, concurrency=2, lease_seconds=HEARTBEAT_SECONDS * 3)) as worker:
        yield worker


def _cli(pgq: PgQueue, *args: str) -> str:
    url = pgq.engine.url.render_as_string(hide_password=False)
    result = CliRunner().invoke(cli_main, [*args, "--database-url", url])
    assert result.exit_code == 0, result.output
    return result.output


@pytest.mark.slow
def test_a_worker_whose_claims_are_refused_shows_unhealthy_within_one_heartbeat(
    pgq: PgQueue, engine: Engine, worker: Worker, caplog: pytest.LogCaptureFixture
) -> None:
    @pgq.task(name="health.job")
    def job() -> str:
        return "ran"

    wait_until(pgq.admin.list_workers, 10, "the worker to register")
    failures_before = _claim_failures()
    with caplog.at_level(logging.INFO, logger="pgqueue.worker"):
        with engine.begin() as connection:
            connection.execute(text(REFUSE))
        refused_at = time.monotonic()
        job_id = job.enqueue()
        [info] = wait_until(
            lambda: [w for w in pgq.admin.list_workers() if w.claim_error is not None],
            HEARTBEAT_SECONDS,
            "the registry to show the failing claims",
        )
        shown_after = time.monotonic() - refused_at
        assert "claims refused by the test" in info.claim_error
        assert not info.healthy and info.live
        assert info.seconds_failing is not None and 0 <= info.seconds_failing <= shown_after + 1

        # Claims keep failing (polls, backoff); they are counted, not logged one by one.
        time.sleep(3)
        assert pgq.get_job(job_id).state == "queued"
        assert _claim_failures() - failures_before >= 3
        [listed] = json.loads(_cli(pgq, "workers", "--json"))
        assert listed["healthy"] is False
        assert "claims refused by the test" in listed["claim_error"]
        assert listed["seconds_failing"] >= 3
        table = _cli(pgq, "workers")
        assert "claims failing for" in table and "claims refused by the test" in table
        explained = json.loads(_cli(pgq, "explain", str(job_id), "--json"))
        [blocker] = [b for b in explained["blockers"] if b["kind"] == "claims_failing"]
        assert worker.worker_id in blocker["data"]["failing_workers"]
        assert "fails to claim" in blocker["message"]

        with engine.begin() as connection:
            connection.execute(text(ACCEPT))
        wait_until(lambda: pgq.get_job(job_id).state == "succeeded", 10, "the job to run")
        wait_until(
            lambda: [w for w in pgq.admin.list_workers() if w.healthy],
            HEARTBEAT_SECONDS,
            "the registry to show the worker healthy again",
        )
    [info] = pgq.admin.list_workers()
    assert info.claim_error is None and info.seconds_failing is None

    lines = [r for r in caplog.records if "claim" in r.getMessage()]
    errors = [r for r in lines if r.levelno >= logging.ERROR]
    # One line with the traceback when the claims began to fail; none per retry.
    assert len(errors) == 1, [r.getMessage() for r in lines]
    assert errors[0].exc_info is not None
    assert "claims refused by the test" in errors[0].getMessage()
    [recovered] = [r for r in lines if "claims work again" in r.getMessage()]
    assert recovered.levelno == logging.WARNING
