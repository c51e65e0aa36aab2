"""Every claim commits durably: no form of the claim statement changes ``synchronous_commit``
for its transaction, so a claim acknowledged to a worker survives a crash of the server and a
restarted server never gives a job that runs to a second worker (docs/explanation/guarantees.md).

The test server runs with ``synchronous_commit = off``; the module's database has its default
set to ``on`` first, so that a claim's own setting would be what the test sees. Its tests share
that database (each on new connections, with the jobs and tickets a new database would have).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from typing import Any

import pytest
from server_databases import create_database, drop_database
from sqlalchemy import Connection, Engine, create_engine, text
from sqlalchemy.engine import URL
from sqlalchemy.sql.dml import ReturningUpdate

from pgqueue.sql import claim as claim_sql

TASK = "commit.task"


def _variants(*, atomic: bool) -> list[claim_sql.ClaimVariant]:
    """Every form of the claim in one mode (the flow form always comes with queue limits)."""
    return [
        claim_sql.ClaimVariant(
            atomic=atomic,
            some_queues=some_queues,
            queue_limits=controls != "lean",
            task_leases=task_leases,
            flow=controls == "flow",
            excluded=excluded,
        )
        for some_queues, controls, task_leases, excluded in itertools.product(
            (False, True), ("lean", "limits", "flow"), (False, True), (False, True)
        )
    ]


def _claims(*, atomic: bool) -> list[tuple[str, ReturningUpdate[Any]]]:
    """Each claim statement of one mode, with a label: every ``claim`` form and ``claim_listed``."""
    statements = [(variant.name, claim_sql.claim(variant)) for variant in _variants(atomic=atomic)]
    statements.append((f"claim_listed({atomic})", claim_sql.claim_listed(atomic)))
    return statements


LEASED = _claims(atomic=False)
ATOMIC = _claims(atomic=True)


@pytest.fixture(scope="module")
def durable_url(server_url: URL, template_name: str) -> Iterator[URL]:
    """A new database whose default is ``synchronous_commit = on`` (for connections opened after
    it was set)."""
    url = create_database(server_url, template_name)
    setup = create_engine(url, isolation_level="AUTOCOMMIT")
    with setup.connect() as connection:
        name = connection.dialect.identifier_preparer.quote(url.database or "")
        connection.execute(text(f"ALTER DATABASE {name} SET synchronous_commit = on"))
    setup.dispose()
    yield url
    drop_database(server_url, url)


@pytest.fixture
def durable_engine(durable_url: URL) -> Iterator[Engine]:
    """A new engine on ``durable_url`` (so its connections are new ones), with 3 leased and 3
    atomic jobs ready and no other job or ticket: a claim writes only those two tables, so the
    claims of earlier tests leave nothing else behind."""
    setup = create_engine(durable_url, isolation_level="AUTOCOMMIT")
    with setup.connect() as connection:
        connection.execute(text("DELETE FROM pgqueue_message_queue"))
        connection.execute(text("DELETE FROM pgqueue_jobs"))
        connection.execute(
            text(
                """WITH jobs AS (
                       INSERT INTO pgqueue_jobs (task_name, queue, atomic)
                       SELECT :task, 'default', atomic
                       FROM generate_series(1, 3), (VALUES (false), (true)) AS modes (atomic)
                       RETURNING id, queue, priority, run_at, atomic)
                   INSERT INTO pgqueue_message_queue (job_id, queue, priority, run_at, atomic)
                   SELECT id, queue, priority, run_at, atomic FROM jobs"""
            ),
            {"task": TASK},
        )
    setup.dispose()
    engine = create_engine(durable_url)
    yield engine
    engine.dispose()


def _params(connection: Connection, atomic: bool) -> dict[str, Any]:
    """Binds for any claim form: every job of the mode is claimable by each of them."""
    job_ids = connection.execute(
        text("SELECT id FROM pgqueue_jobs WHERE atomic = :atomic ORDER BY id"), {"atomic": atomic}
    ).scalars()
    return {
        "limit": 10,
        "worker": "commit-test",
        "lease_seconds": 30.0,
        "task_leases": {"another.task": 5.0},
        "queues": ["default"],
        "excluded": ["another.task"],
        "job_ids": list(job_ids),
    }


def _synchronous_commit(connection: Connection) -> str:
    return str(connection.execute(text("SHOW synchronous_commit")).scalar_one())


def _claim_then_show(engine: Engine, statement: ReturningUpdate[Any], atomic: bool) -> str:
    """Run ``statement`` in an explicit transaction (asserting it claimed all 3 jobs), and give
    ``synchronous_commit`` as that transaction sees it after the claim; then check that a new
    transaction on the same connection sees the database's default again."""
    with engine.connect() as connection:
        assert _synchronous_commit(connection) == "on"
        connection.commit()
        with connection.begin():
            claimed = connection.execute(statement, _params(connection, atomic)).all()
            assert len(claimed) == 3
            seen = _synchronous_commit(connection)
        with connection.begin():
            assert _synchronous_commit(connection) == "on", "leaked past the transaction"
    return seen


@pytest.mark.parametrize(
    ("label", "statement", "atomic"),
    [(label, statement, False) for label, statement in LEASED]
    + [(label, statement, True) for label, statement in ATOMIC],
    ids=[label for label, _ in LEASED] + [f"atomic {label}" for label, _ in ATOMIC],
)
def test_every_claim_commits_as_the_server_says(
    durable_engine: Engine, label: str, statement: ReturningUpdate[Any], atomic: bool
) -> None:
    assert _claim_then_show(durable_engine, statement, atomic=atomic) == "on", label
