"""Job arguments do not reach logs or ``last_error`` through a database error's message.

SQLAlchemy appends a failed statement's bound values to the error's text (``[parameters:
...]``) unless the engine hides them. pgqueue's engines bind job arguments, results and error
texts, and handlers bind arguments into their own queries; such an error is logged and stored
as the job's ``last_error``, so both engines hide them.
"""

from __future__ import annotations

import logging

import pytest
from sqlalchemy import Engine, text
from sqlalchemy.exc import DBAPIError

from pgqueue import PgQueue
from pgqueue.states import JobState
from pgqueue.testing import run_until_final

SECRET = "4111-1111-1111-1111"


def _all_text(record: logging.LogRecord) -> str:
    return "\n".join(
        [record.getMessage(), repr(record.args), repr(vars(record)), record.exc_text or ""]
    )


@pytest.mark.parametrize("atomic", [False, True], ids=["leased", "atomic"])
def test_handler_database_error_keeps_arguments_out_of_last_error_and_logs(
    pgq: PgQueue, caplog: pytest.LogCaptureFixture, atomic: bool
) -> None:
    caplog.set_level(logging.DEBUG)

    @pgq.task(name="hidden.charge", max_attempts=1, atomic=atomic, pass_context=True)
    def charge(ctx: object, card: str) -> None:
        # Fails at run time, after the card number was bound into the statement.
        ctx.session.execute(  # type: ignore[attr-defined]
            text("SELECT 1 / (length(CAST(:card AS text)) - length(CAST(:card AS text)))"),
            {"card": card},
        )

    job_id = charge.enqueue(SECRET)
    assert run_until_final(pgq, [job_id]) == {job_id: JobState.FAILED}
    job = pgq.get_job(job_id)
    assert job.last_error is not None
    # The error is recorded (so the absence of the argument is not the absence of an error).
    assert "division by zero" in job.last_error
    assert SECRET not in job.last_error
    assert all(SECRET not in entry["error"] for entry in job.errors)
    leaked = [r.name for r in caplog.records if SECRET in _all_text(r)]
    assert leaked == []


def test_error_of_an_enqueue_statement_does_not_carry_the_arguments(
    pgq: PgQueue, engine: Engine, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    with engine.begin() as connection:
        # A real server-side failure of pgqueue's own INSERT, raised after the values were bound.
        connection.execute(
            text(
                "CREATE FUNCTION refuse_jobs() RETURNS trigger LANGUAGE plpgsql AS "
                "$$ BEGIN RAISE EXCEPTION 'jobs refused here'; END $$"
            )
        )
        connection.execute(
            text(
                "CREATE TRIGGER refuse_jobs BEFORE INSERT ON pgqueue_jobs "
                "FOR EACH ROW EXECUTE FUNCTION refuse_jobs()"
            )
        )

    @pgq.task(name="hidden.store")
    def store(card: str) -> None:
        pass

    # In the caller's session: the statement goes through SQLAlchemy's execution, whose errors
    # are the ones that would carry the bound values.
    with pytest.raises(DBAPIError) as raised, pgq.sessions() as session:
        store.configure(session=session).enqueue(SECRET)
    assert "jobs refused here" in str(raised.value)
    assert SECRET not in str(raised.value)
    leaked = [r.name for r in caplog.records if SECRET in _all_text(r)]
    assert leaked == []
