"""Deleting a job that others depend on: a deleted dependency can never succeed, so the jobs
WAITING on it are cancelled (and, transitively, what waits on them) with a reason naming the
deleted job, in the delete's own transaction, whichever path deleted it: ``delete_job``, the
dashboard's delete button, ``bulk_delete`` and ``pgqueue bulk delete``. A dependency that had
SUCCEEDED before it was deleted (pruned, say) cancels nothing."""

from __future__ import annotations

import re
from collections.abc import Iterator

import pytest
from click.testing import CliRunner
from flask import Flask
from sqlalchemy.engine import URL
from support.dashboard import dashboard_app

from pgqueue import JobState, PgQueue
from pgqueue.admin import JobFilter
from pgqueue.cli import main as cli_main
from pgqueue.contrib.flask import PgQueue as FlaskPgQueue
from pgqueue.testing import run_until_final, states_of, table_counts

flask_pgq = FlaskPgQueue()


@flask_pgq.task(name="del.noop", queue="parents")
def flask_noop() -> None:
    return None


def _chain(pgq: PgQueue) -> tuple[int, int, int, int]:
    """A parent queued for later, a child waiting on it and on a job still queued, a grandchild
    waiting on the child; and that other queued job."""

    @pgq.task(name="del.step", queue="parents")
    def step() -> None:
        return None

    parent = step.configure(delay=3600).enqueue()
    other = step.configure(delay=3600, queue="others").enqueue()
    child = step.configure(depends_on=[parent, other], queue="children").enqueue()
    grandchild = step.configure(depends_on=[child], queue="children").enqueue()
    return parent, other, child, grandchild


def _assert_cancelled_for(pgq: PgQueue, parent: int, child: int, grandchild: int) -> None:
    assert states_of(pgq, [child, grandchild]) == {
        child: JobState.CANCELLED,
        grandchild: JobState.CANCELLED,
    }
    cancelled = pgq.get_job(child)
    assert cancelled.last_error == f"dependency {parent} was deleted; not run"
    assert cancelled.finished_at is not None
    assert pgq.get_job(grandchild).last_error == f"dependency {child} ended cancelled; not run"


def test_delete_job_cancels_what_waits_on_it(pgq: PgQueue) -> None:
    parent, other, child, grandchild = _chain(pgq)
    assert pgq.admin.delete_job(parent)
    _assert_cancelled_for(pgq, parent, child, grandchild)
    # The other dependency is untouched and still runs; nothing it releases is left waiting.
    assert states_of(pgq, [parent, other]) == {other: JobState.QUEUED}


def test_deleting_a_succeeded_dependency_cancels_nothing(pgq: PgQueue) -> None:
    @pgq.task(name="del.quick")
    def quick() -> None:
        return None

    done = quick.enqueue()
    run_until_final(pgq, [done])
    later = quick.configure(delay=3600).enqueue()
    waiting = quick.configure(depends_on=[done, later]).enqueue()
    assert pgq.admin.delete_job(done)
    assert states_of(pgq, [waiting]) == {waiting: JobState.WAITING}
    assert pgq.get_job(waiting).last_error is None


def test_a_delete_rolled_back_cancels_nothing(pgq: PgQueue) -> None:
    parent, _, child, grandchild = _chain(pgq)
    with pytest.raises(RuntimeError), pgq.sessions.begin() as session:
        assert pgq.admin.delete_job(parent, session=session)
        raise RuntimeError("the caller's transaction fails")
    assert states_of(pgq, [parent, child, grandchild]) == {
        parent: JobState.QUEUED,
        child: JobState.WAITING,
        grandchild: JobState.WAITING,
    }


def test_bulk_delete_cancels_what_waits_on_the_deleted_jobs(pgq: PgQueue) -> None:
    parent, other, child, grandchild = _chain(pgq)
    result = pgq.admin.bulk_delete(JobFilter(queue="parents"))
    assert result.count == 1
    _assert_cancelled_for(pgq, parent, child, grandchild)
    assert states_of(pgq, [other]) == {other: JobState.QUEUED}
    assert table_counts(pgq.engine)["pgqueue_message_queue"] == 1  # the other job's ticket


def test_pgqueue_bulk_delete_cancels_what_waits_on_the_deleted_jobs(
    pgq: PgQueue, database_url: URL
) -> None:
    parent, _, child, grandchild = _chain(pgq)
    url = database_url.render_as_string(hide_password=False)
    result = CliRunner().invoke(
        cli_main, ["bulk", "delete", "--queue", "parents", "--yes", "--database-url", url]
    )
    assert result.exit_code == 0, result.output
    assert result.output.startswith("deleted 1 job"), result.output
    _assert_cancelled_for(pgq, parent, child, grandchild)


@pytest.fixture
def app(database_url: URL) -> Iterator[Flask]:
    with dashboard_app(flask_pgq, database_url, "delete_dependents") as app:
        yield app


def test_the_dashboards_delete_cancels_what_waits_on_the_job(app: Flask) -> None:
    queue = flask_pgq.state(app).queue
    with app.app_context():
        parent = flask_noop.configure(delay=3600).enqueue()
        child = flask_noop.configure(depends_on=[parent]).enqueue()
    client = app.test_client()
    page = client.get(f"/pgqueue/jobs/{parent}")
    token = re.search(r'name="csrf_token" value="([^"]+)"', page.text)
    assert token is not None
    deleted = client.post(f"/pgqueue/jobs/{parent}/delete", data={"csrf_token": token.group(1)})
    assert deleted.status_code == 302
    assert states_of(queue, [parent, child]) == {child: JobState.CANCELLED}
    assert queue.get_job(child).last_error == f"dependency {parent} was deleted; not run"
