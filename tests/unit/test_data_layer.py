"""Pure logic of the data layer, without a database: how the driver path translates parameters,
which claim variant a claimer runs, the dependency rule for new jobs, and COPY text rows."""

from __future__ import annotations

import datetime as dt
import itertools
import uuid

from sqlalchemy import BigInteger, Float, bindparam, select
from sqlalchemy.dialects import postgresql
from sqlalchemy.dialects.postgresql import ARRAY

from pgqueue import driver
from pgqueue.data import claim as claim_data
from pgqueue.data import copy_rows, dependencies
from pgqueue.jobs import NewJob
from pgqueue.sql import claim, outcomes
from pgqueue.sql.claim import ClaimVariant
from pgqueue.states import JobState

DIALECT = postgresql.psycopg.dialect()  # type: ignore[attr-defined]


def test_id_and_uuid_arrays_become_array_literals() -> None:
    token = uuid.UUID("12345678-1234-5678-1234-567812345678")
    assert driver.array_literal([3, 1, 2]) == "{3,1,2}"
    assert driver.array_literal([]) == "{}"
    assert driver.array_literal([token]) == "{12345678-1234-5678-1234-567812345678}"
    assert driver.array_literal(None) is None


def test_text_arrays_become_literals_only_when_all_null() -> None:
    assert driver.text_array_literal(["null", "null"]) == '{"null","null"}'
    mixed = ["null", '{"a": 1}']
    assert driver.text_array_literal(mixed) is mixed
    assert driver.text_array_literal([]) == []
    assert driver.text_array_literal(None) is None


def test_compiled_statement_converts_arrays_and_keeps_its_own_literals() -> None:
    statement = select(
        bindparam("ids", type_=ARRAY(BigInteger)),
        bindparam("delays", type_=ARRAY(Float)),
        bindparam("fixed", value=7),
    )
    compiled = driver.CompiledStatement(statement, DIALECT)
    params = compiled.params({"ids": [1, 2], "delays": [0.5, None]})
    assert params["ids"] == "{1,2}"
    assert params["delays"] == [0.5, None]
    assert params["fixed"] == 7
    assert "%(ids)s" in compiled.sql


def test_compiled_statements_compile_each_statement_once() -> None:
    statements = driver.CompiledStatements(DIALECT)
    first = statements.get(outcomes.lock_jobs())
    assert statements.get(outcomes.lock_jobs()) is first
    assert statements.get(outcomes.complete()) is not first


def _given(statement: object) -> set[str]:
    """The bind parameters a caller must give ``statement`` (not its own literals)."""
    compiled = statement.compile(dialect=DIALECT)  # type: ignore[attr-defined]
    return {name for bind, name in compiled.bind_names.items() if bind.required}


def test_heartbeat_binds_one_lease_length_per_job() -> None:
    assert _given(outcomes.heartbeat()) == {"ids", "tokens", "lease_seconds"}


def test_outcome_statements_bind_what_the_repository_sends() -> None:
    from pgqueue.data.outcomes import _OUTCOME_STATEMENTS, _outcome_params

    for kind, statement in _OUTCOME_STATEMENTS.items():
        assert set(_outcome_params(kind, [])) == _given(statement()), kind


def test_every_claim_variant_is_its_own_cached_statement() -> None:
    variants = [ClaimVariant(*flags) for flags in itertools.product([False, True], repeat=4)]
    statements = {id(claim.claim(v)) for v in variants}
    assert len(statements) == 16
    assert all(claim.claim(v) is claim.claim(v) for v in variants)
    assert len({v.name for v in variants}) == 16


def test_claim_variant_follows_the_request() -> None:
    lean = claim_data.claim_variant(
        atomic=False, queues=None, limits_exist=False, task_leases=False
    )
    assert lean.name == "leased/all-queues/lean/default-lease"
    full = claim_data.claim_variant(atomic=True, queues=["a"], limits_exist=True, task_leases=True)
    assert full.name == "atomic/some-queues/limits/task-leases"
    no_queues = claim_data.claim_variant(
        atomic=False, queues=[], limits_exist=False, task_leases=False
    )
    assert no_queues.some_queues  # an empty list claims from no queue, not from all
    assert "queues" in _given(claim.claim(full))
    assert "queues" not in _given(claim.claim(lean))


def test_limits_are_assumed_until_looked_at_and_trusted_until_stale() -> None:
    seen = claim_data.LimitsSeen()
    assert seen.exist and seen.stale(0.0)
    seen.record(False, until=10.0)
    assert not seen.exist
    assert not seen.stale(9.9)
    assert seen.stale(10.0)


def test_new_job_state_follows_its_dependencies() -> None:
    s, f, c, r = JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED, JobState.RUNNING
    assert dependencies.initial_state({1: s, 2: s}) == (JobState.QUEUED, None)
    assert dependencies.initial_state({1: s, 2: r}) == (JobState.WAITING, None)
    assert dependencies.initial_state({1: r, 2: f, 3: c}) == (
        JobState.CANCELLED,
        "dependency 2 ended failed; not run",
    )
    assert dependencies.initial_state({4: c}) == (
        JobState.CANCELLED,
        "dependency 4 ended cancelled; not run",
    )


def test_dependency_helpers() -> None:
    assert dependencies.array_text((3, 1)) == "{3,1}"
    assert dependencies.array_text(()) is None
    # One entry per ended edge: job 6 had two of its dependencies end.
    ended = dependencies.ended_dependents([(1, [5, 6]), (2, None), (3, [6, 7])], 1)
    assert ended == [5, 6, 6, 7]


def _job(queue: str = "q", task: str = "t", args: str = "[]") -> NewJob:
    return NewJob(task, queue, args, "{}", 0, 3, None, None, None, False)


def test_copy_rows_escape_text_and_share_the_run_at() -> None:
    stamp = dt.datetime(2026, 1, 2, 3, 4, 5, tzinfo=dt.UTC).isoformat()
    jobs = [_job(queue="b\\q", args='["tab\\there"]'), _job(queue="b\\q")]
    columns, lines = copy_rows.lines([10, 11], jobs, None, None, None, stamp)
    assert columns[:3] == ("id", "args", "kwargs") and columns[-1] == "run_at"
    assert list(lines) == [
        f'10\t["tab\\\\there"]\t{{}}\tt\tb\\\\q\t0\t3\tf\t{stamp}\n',
        f"11\t[]\t{{}}\tt\tb\\\\q\t0\t3\tf\t{stamp}\n",
    ]


def test_copy_rows_of_a_workflow_carry_edges_states_and_roles() -> None:
    stamp = "2026-01-01T00:00:00+00:00"
    edges = {
        "state": ["queued", "waiting"],
        "depends_on": [None, "{10}"],
        "dependents": ["{11}", None],
        "pending_dependencies": [None, 1],
    }
    columns, lines = copy_rows.lines([10, 11], [_job(), _job()], edges, [0, 1], 7, stamp, "{}")
    assert columns[3:6] == ("depends_on", "pending_dependencies", "dependents")
    assert columns[-5:] == ("run_at", "state", "workflow_role", "workflow_id", "trace_context")
    assert list(lines) == [
        f"10\t[]\t{{}}\t\\N\t\\N\t{{11}}\tt\tq\t0\t3\tf\t{stamp}\tqueued\t0\t7\t{{}}\n",
        f"11\t[]\t{{}}\t{{10}}\t1\t\\N\tt\tq\t0\t3\tf\t{stamp}\twaiting\t1\t7\t{{}}\n",
    ]


def test_copy_chunks_hold_a_bounded_number_of_rows() -> None:
    lines = [f"{i}\n" for i in range(copy_rows.CHUNK_ROWS * 2 + 3)]
    chunks = list(copy_rows.chunks(lines))
    assert [c.count("\n") for c in chunks] == [copy_rows.CHUNK_ROWS, copy_rows.CHUNK_ROWS, 3]
    assert "".join(chunks) == "".join(lines)


def test_outcome_statements_touch_the_key_counters_only_in_their_keyed_form() -> None:
    from pgqueue.data.outcomes import _OUTCOME_STATEMENTS

    for statement in _OUTCOME_STATEMENTS.values():
        for with_progress in (False, True):
            keyed = str(statement(with_progress, True).compile(dialect=DIALECT))
            plain = str(statement(with_progress, False).compile(dialect=DIALECT))
            assert "pgqueue_concurrency_keys" in keyed, statement.__name__
            assert "pgqueue_concurrency_keys" not in plain, statement.__name__
            # Both forms still give limited queues their slots back.
            assert "UPDATE pgqueue_queues" in plain, statement.__name__
