"""What a worker writes down about jobs: args stay out of logs, errors are capped.

- Job arguments often carry personal data. With default settings no log record (message,
  arguments or ``extra``) of an in-process worker, at DEBUG level, nor the output of
  ``pgqueue worker -vv``, contains an argument value; ``Settings(log_args=True)`` puts them in.
- Errors keep their traceback but are cut to ``Settings.max_error_bytes`` (UTF-8 bytes), for
  ``last_error`` and every ``errors[*].error`` entry, whatever the failure: a huge exception
  message (leased or atomic, ASCII or multi-byte), an unstorable result, a hand-edited row.
- A failed query's error is named by the same line in the worker's log, ``pgqueue explain``
  and the dashboard: its exception and message, not PostgreSQL's caret under the statement.
"""

from __future__ import annotations

import logging
import textwrap
from pathlib import Path
from typing import Any

import pytest
from markupsafe import escape
from sqlalchemy import Engine, text
from sqlalchemy.engine import URL
from support.dashboard import dashboard_app
from support.processes import pgqueue_env, run_pgqueue

import pgqueue
from pgqueue import PgQueue, Settings
from pgqueue.contrib.flask import PgQueue as FlaskPgQueue
from pgqueue.errors import ConfigurationError
from pgqueue.states import JobState
from pgqueue.testing import run_until_final

SECRETS = ("4111-1111-1111-1111", "alice@example.org", "078-05-1120")


def _all_text(record: logging.LogRecord) -> str:
    """Everything a handler or formatter could print from a record."""
    return "\n".join(
        [record.getMessage(), repr(record.args), repr(vars(record)), record.exc_text or ""]
    )


def _run_secret_jobs(pgq: PgQueue) -> list[int]:
    @pgq.task(name="hygiene.charge", max_attempts=2)
    def charge(card: str, *, email: str, ssn: str) -> str:
        if card.endswith("1111") and email.startswith("alice") and ssn.startswith("078"):
            return "charged"
        return "?"

    @pgq.task(name="hygiene.decline", max_attempts=2)
    def decline(card: str, *, email: str, ssn: str) -> None:
        raise ValueError("card declined")  # the message itself carries no argument

    card, email, ssn = SECRETS
    ids = [
        charge.enqueue(card, email=email, ssn=ssn),
        decline.enqueue(card, email=email, ssn=ssn),
    ]
    states = run_until_final(pgq, ids, concurrency=2)
    assert states == {ids[0]: JobState.SUCCEEDED, ids[1]: JobState.FAILED}
    return ids


def test_args_are_not_logged_by_default(pgq: PgQueue, caplog: pytest.LogCaptureFixture) -> None:
    assert pgq.settings.log_args is False
    caplog.set_level(logging.DEBUG)
    caplog.set_level(logging.DEBUG, logger="pgqueue")
    ids = _run_secret_jobs(pgq)
    records = caplog.records
    # The worker did log about these jobs (so absence of secrets is not absence of logs).
    about_jobs = [r for r in records if any(str(i) in r.getMessage() for i in ids)]
    assert len(about_jobs) >= 3  # success, retry and final failure
    leaked = [(r.name, r.getMessage()) for r in records if any(s in _all_text(r) for s in SECRETS)]
    assert leaked == []


def test_args_are_logged_when_asked(database_url: URL, caplog: pytest.LogCaptureFixture) -> None:
    pgq = PgQueue(
        database_url.render_as_string(hide_password=False),
        settings=Settings(poll_interval=0.2, log_args=True),
    )
    try:
        caplog.set_level(logging.INFO, logger="pgqueue")
        _run_secret_jobs(pgq)
    finally:
        pgq.dispose()
    logged = "\n".join(_all_text(r) for r in caplog.records)
    assert all(secret in logged for secret in SECRETS)


@pytest.mark.slow
def test_cli_worker_at_debug_does_not_print_args(database_url: URL, tmp_path: Path) -> None:
    url = database_url.render_as_string(hide_password=False)
    (tmp_path / "hygiene_app.py").write_text(
        textwrap.dedent(
            """
            import os
            from pgqueue import PgQueue, Settings

            pgq = PgQueue(os.environ["DB_URL"], settings=Settings(poll_interval=0.2))

            @pgq.task(name="hygiene.store")
            def store(card, email):
                if card == "4111-1111-1111-1111":
                    raise RuntimeError("rejected")
                return "ok"
            """
        )
    )
    pgq = PgQueue(url, settings=Settings(poll_interval=0.2))
    try:
        store = pgq.task(name="hygiene.store", max_attempts=1)(lambda card, email: None)
        ids = [store.enqueue(SECRETS[0], SECRETS[1]), store.enqueue("other", SECRETS[1])]
        result = run_pgqueue(
            "-vv",
            "worker",
            "hygiene_app:pgq",
            "--drain",
            env={**pgqueue_env(), "DB_URL": url},
            cwd=tmp_path,
            process=True,
        )
        assert result.returncode == 0, result.stderr[-2000:]
        states = {i: pgq.get_job(i).state for i in ids}
    finally:
        pgq.dispose()
    assert states == {ids[0]: JobState.FAILED, ids[1]: JobState.SUCCEEDED}
    output = result.stdout + result.stderr
    # It did log about each job (outcome lines name the task), just not the arguments.
    assert output.count("task=hygiene.store") >= 2, output[-3000:]
    assert not any(secret in output for secret in SECRETS)


# --- capped errors ----------------------------------------------------------------------------


def _byte_len(value: str) -> int:
    return len(value.encode("utf-8"))


@pytest.mark.parametrize("cap", [256, 4096, 16_384])
def test_recorded_errors_are_capped_and_keep_the_traceback(
    database_url: URL, engine: Engine, cap: int
) -> None:
    pgq = PgQueue(
        database_url.render_as_string(hide_password=False),
        settings=Settings(poll_interval=0.2, max_error_bytes=cap),
    )
    try:
        _check_caps(pgq, engine, cap)
    finally:
        pgq.dispose()


def _check_caps(pgq: PgQueue, engine: Engine, cap: int) -> None:
    @pgq.task(name="hygiene.huge", max_attempts=2)
    def huge(char: str) -> None:
        raise ValueError("start of message " + char * 1_000_000 + " END-OF-MESSAGE")

    @pgq.task(name="hygiene.huge_atomic", atomic=True, max_attempts=2)
    def huge_atomic(char: str) -> None:
        raise ValueError("start of message " + char * 1_000_000 + " END-OF-MESSAGE")

    @pgq.task(name="hygiene.bad_result", max_attempts=1)
    def bad_result() -> Any:
        return {("k" * 100_000,): 1}  # a tuple key: cannot be stored as JSON

    failing = [
        huge.enqueue("x"),
        huge.enqueue("€"),  # 3 bytes per character: the cap is in bytes
        huge.enqueue("\U0001f600"),
        huge_atomic.enqueue("x"),
        huge_atomic.enqueue("é"),
        bad_result.enqueue(),
    ]
    states = run_until_final(pgq, failing, concurrency=4, timeout=90)
    assert set(states.values()) == {JobState.FAILED}
    over = {}
    for job_id in failing:
        job = pgq.get_job(job_id)
        sizes = [_byte_len(job.last_error or "")] + [_byte_len(e["error"]) for e in job.errors]
        if max(sizes) > cap or not job.errors:
            over[job.task_name[:40]] = sizes
    assert over == {}, over
    # Capped, not dropped: the traceback's head and the message's tail are both kept.
    for job_id in failing[:5]:
        job = pgq.get_job(job_id)
        assert len(job.errors) == 2  # one entry per attempt
        assert job.last_error is not None and job.last_error.startswith("Traceback")
        if cap >= 4096:
            assert "END-OF-MESSAGE" in job.last_error
            assert "ValueError: start of message" in job.errors[0]["error"] or (
                "ValueError" in job.last_error
            )


def test_errors_about_hand_edited_rows_are_capped(
    pgq: PgQueue, engine: Engine, caplog: pytest.LogCaptureFixture
) -> None:
    cap = pgq.settings.max_error_bytes

    @pgq.task(name="hygiene.plain", max_attempts=1)
    def plain(**kwargs: Any) -> None:
        return None

    @pgq.task(name="hygiene.one_arg", max_attempts=1)
    def one_arg(x: int) -> None:
        return None

    renamed = plain.enqueue()
    bad_kwargs = one_arg.enqueue(1)
    with engine.begin() as connection:
        connection.execute(
            text("UPDATE pgqueue_jobs SET task_name = :v WHERE id = :id"),
            {"v": "no.such.task." + "t" * 100_000, "id": renamed},
        )
        connection.execute(
            text("UPDATE pgqueue_jobs SET kwargs = CAST(:v AS json) WHERE id = :id"),
            {"v": '{"' + "k" * 100_000 + '": 1}', "id": bad_kwargs},
        )
    with caplog.at_level(logging.WARNING, logger="pgqueue"):
        assert run_until_final(pgq, [bad_kwargs]) == {bad_kwargs: JobState.FAILED}
        # No worker registers the renamed task: the job waits for one, unrun and unfailed, and
        # the line that says so is cut like any other.
        renamed_job = pgq.get_job(renamed)
        assert (renamed_job.state, renamed_job.attempts, renamed_job.last_error) == (
            JobState.QUEUED,
            0,
            None,
        )
    lines = [r.getMessage() for r in caplog.records if "not registered" in r.getMessage()]
    assert lines and all(_byte_len(line) <= 1_000 for line in lines), [len(x) for x in lines]
    sizes = {}
    for job_id in [bad_kwargs]:
        job = pgq.get_job(job_id)
        sizes[job_id] = [_byte_len(job.last_error or "")] + [
            _byte_len(e["error"]) for e in job.errors
        ]
    assert all(max(s) <= cap for s in sizes.values()), sizes


def test_max_error_bytes_default_and_minimum() -> None:
    assert Settings().max_error_bytes == 16_384
    # Below 256 bytes the head-and-tail cut cannot stay within the limit: refused up front.
    with pytest.raises(ConfigurationError, match="at least 256"):
        Settings(max_error_bytes=255)
    with pytest.raises(ConfigurationError, match="at least 256"):
        Settings.from_env({"PGQUEUE_MAX_ERROR_BYTES": "64"})


def _failing_helper() -> None:
    raise ValueError("out of stock")


def test_a_recorded_traceback_starts_at_the_handler_not_in_pgqueue(pgq: PgQueue) -> None:
    @pgq.task(name="hygiene.out_of_stock", max_attempts=1)
    def out_of_stock() -> None:
        _failing_helper()

    @pgq.task(name="hygiene.step_fails", max_attempts=1, pass_context=True)
    def step_fails(ctx: Any) -> None:
        ctx.step("reserve", _failing_helper)

    ids = [out_of_stock.enqueue(), step_fails.enqueue()]
    assert run_until_final(pgq, ids) == dict.fromkeys(ids, JobState.FAILED)
    package = str(Path(pgqueue.__file__).parent)
    for job_id in ids:
        lines = pgq.get_job(job_id).last_error.splitlines()
        assert lines[0] == "Traceback (most recent call last):"
        first_file = lines[1].split('"')[1]
        assert first_file == __file__, lines[1]
        assert lines[-1] == "ValueError: out of stock"
    # Frames of pgqueue between the handler and the error (a durable step's runner) stay.
    step_error = pgq.get_job(ids[1]).last_error
    assert package in step_error and "_failing_helper" in step_error


def test_a_failed_query_is_named_alike_in_the_log_the_cli_and_the_dashboard(
    pgq: PgQueue, database_url: URL, caplog: pytest.LogCaptureFixture
) -> None:
    @pgq.task(name="hygiene.missing_table", max_attempts=1, pass_context=True)
    def missing_table(ctx: Any) -> None:
        ctx.session.execute(text("SELECT * FROM no_such_table"))

    caplog.set_level(logging.INFO, logger="pgqueue.worker")
    job_id = missing_table.enqueue()
    assert run_until_final(pgq, [job_id]) == {job_id: JobState.FAILED}
    recorded = pgq.get_job(job_id).last_error or ""
    # PostgreSQL's excerpt of the statement ends the message, its caret last.
    assert "LINE 1: SELECT * FROM no_such_table" in recorded, recorded
    named = (
        'sqlalchemy.exc.ProgrammingError: (psycopg.errors.UndefinedTable) relation "no_such_table"'
        " does not exist"
    )
    logged = [r.getMessage() for r in caplog.records if f"job {job_id} " in r.getMessage()]
    assert [line.split(" error=", 1)[1] for line in logged if "outcome=fail" in line] == [named]

    explained = run_pgqueue("explain", str(job_id), url=database_url)
    assert explained.returncode == 0, explained.stderr[-2000:]
    assert f", last error: {named} (`pgqueue retry {job_id}`" in explained.stdout

    with dashboard_app(FlaskPgQueue(), database_url, "summaries") as app:
        client = app.test_client()
        listed = client.get("/pgqueue/jobs?state=failed").get_data(as_text=True)
        detail = client.get(f"/pgqueue/jobs/{job_id}").get_data(as_text=True)
    assert f'">{escape(named)}</span></td>' in listed
    assert f'<span class="headline">{escape(named)}</span>' in detail
