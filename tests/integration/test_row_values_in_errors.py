"""A database error's text carries no job data into pgqueue's logs or stored errors.

PostgreSQL puts the whole refused row in a constraint violation's message (``DETAIL: Failing
row contains (...)``): for a row of ``pgqueue_jobs`` that is the job's arguments. SQLAlchemy
adds the statement's bound values (``[parameters: ...]``) unless the engine hides them, which
an engine the application passes to ``PgQueue`` may not. Both are cut from log lines, logged
tracebacks, ``last_error`` and ``errors``; the error itself (its type, constraint, message)
stays.
"""

from __future__ import annotations

import logging
import traceback

import pytest
from sqlalchemy import Engine, create_engine, text
from sqlalchemy.engine import URL
from sqlalchemy.exc import IntegrityError

from pgqueue import PgQueue, Settings
from pgqueue.errors import error_line, error_summary, hide_row_values
from pgqueue.states import JobState
from pgqueue.testing import run_until_final

SECRET = "4111-1111-1111-1111"


def _printed(record: logging.LogRecord) -> str:
    """What a handler prints of a record: its formatted text (the traceback included) and
    arguments. (``exc_info`` keeps the exception object itself, for structured handlers.)"""
    formatted = logging.Formatter("%(message)s").format(record)
    return "\n".join([formatted, repr(record.args), record.exc_text or ""])


def _violation(engine: Engine) -> IntegrityError:
    """A real check violation of pgqueue's jobs table, on an engine that shows parameters."""
    with pytest.raises(IntegrityError) as raised, engine.begin() as connection:
        connection.execute(
            text(
                "INSERT INTO pgqueue_jobs (task_name, args, attempts)"
                " VALUES ('t', CAST(:args AS json), -1)"
            ),
            {"args": f'["{SECRET}", "line one\\nline two). [SQL: x"]'},
        )
    return raised.value


def test_the_texts_made_of_a_violation_keep_the_error_and_drop_the_row(engine: Engine) -> None:
    exc = _violation(engine)
    raw = "".join(traceback.format_exception(exc))
    # What the server and SQLAlchemy produced: the row and the bound values are in it.
    assert "Failing row contains" in raw and "[parameters:" in raw and SECRET in raw
    for shown in (hide_row_values(raw), error_summary(raw), error_line(exc)):
        assert SECRET not in shown
        assert "line two" not in shown
        assert "attempts_non_negative" in shown
    hidden = hide_row_values(raw)
    assert "[SQL: INSERT INTO pgqueue_jobs" in hidden  # the statement stays, not its values
    assert hidden.count("CheckViolation") >= 2  # both exceptions of the chain are still there
    assert "Traceback" in hidden
    assert error_summary(raw).startswith("sqlalchemy.exc.IntegrityError: (psycopg.errors.Check")


def test_a_logged_traceback_drops_the_row(engine: Engine, caplog: pytest.LogCaptureFixture) -> None:
    exc = _violation(engine)
    caplog.set_level(logging.DEBUG)
    for name in ("pgqueue.worker", "pgqueue.uow", "pgqueue.scheduler"):
        logging.getLogger(name).error("failed", exc_info=exc)
    assert len(caplog.records) == 3
    for record in caplog.records:
        assert "attempts_non_negative" in _printed(record)
        assert SECRET not in _printed(record)
    assert SECRET not in caplog.text


@pytest.mark.parametrize("atomic", [False, True], ids=["leased", "atomic"])
def test_a_handler_violating_a_constraint_on_pgqueue_jobs(
    pgq: PgQueue, caplog: pytest.LogCaptureFixture, atomic: bool
) -> None:
    caplog.set_level(logging.DEBUG)

    @pgq.task(name="rows.break", max_attempts=2, atomic=atomic, pass_context=True)
    def break_row(ctx: object, card: str) -> None:
        ctx.session.execute(  # type: ignore[attr-defined]
            text("UPDATE pgqueue_jobs SET attempts = -1 WHERE id = :id"),
            {"id": ctx.job_id},  # type: ignore[attr-defined]
        )
        ctx.session.flush()  # type: ignore[attr-defined]

    job_id = break_row.enqueue(SECRET)
    assert run_until_final(pgq, [job_id]) == {job_id: JobState.FAILED}
    job = pgq.get_job(job_id)
    assert job.last_error is not None and "attempts_non_negative" in job.last_error
    assert SECRET not in job.last_error
    assert len(job.errors) == 2
    assert all(SECRET not in entry["error"] for entry in job.errors)
    leaked = [r.name for r in caplog.records if SECRET in _printed(r)]
    assert leaked == []


def test_a_host_engine_showing_parameters(
    database_url: URL, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    host_engine = create_engine(database_url)  # no hide_parameters: SQLAlchemy's default
    pgq = PgQueue(host_engine, settings=Settings(poll_interval=0.2))
    try:

        @pgq.task(name="rows.charge", max_attempts=1, pass_context=True)
        def charge(ctx: object, card: str) -> None:
            ctx.session.execute(  # type: ignore[attr-defined]
                text("SELECT 1 / (length(CAST(:card AS text)) - length(CAST(:card AS text)))"),
                {"card": card},
            )

        job_id = charge.enqueue(SECRET)
        assert run_until_final(pgq, [job_id]) == {job_id: JobState.FAILED}
        job = pgq.get_job(job_id)
    finally:
        pgq.dispose()
        host_engine.dispose()
    assert job.last_error is not None and "division by zero" in job.last_error
    assert SECRET not in job.last_error
    assert all(SECRET not in entry["error"] for entry in job.errors)
    leaked = [r.name for r in caplog.records if SECRET in _printed(r)]
    assert leaked == []
