"""``pgqueue_enqueue(...)``, the SQL function of migration pgqueue_0020 (replaced by 0023 and
0026), held to Python's enqueue.

- As the role with only the documented grants (EXECUTE through the documented grant alone), it
  writes the job row, the ticket, the key row and the wake-up Python's enqueue writes for the
  same inputs, shares unique keys with it both ways, and a worker runs its jobs.
- From a trigger on an application table: the job commits with the row, or not at all.
- Every refused input raises its SQLSTATE with a message naming the parameter and writes
  nothing; and what it accepts is what Python accepts (names, numbers, nesting, as properties;
  times within 3650 days of now, measured between moments; argument numbers Python reads as
  given, to the edge where a fraction becomes 0.0).
- A bounded queue refuses it as it refuses Python, with the same message, and counts the
  enqueues (SQL or Python) that held its lock before; concurrent calls with one unique key make
  one job.
- What SQL cannot check is left to the worker: a task no worker registers waits, arguments that
  do not fit the function fail the first attempt for good.
- The migrations add, replace and remove the function on a database holding jobs.
"""

from __future__ import annotations

import datetime as dt
import json
import select
import threading
from collections.abc import Iterator, Mapping
from typing import Any

import psycopg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from server_databases import create_database, drop_database
from sqlalchemy import Connection, Engine, create_engine, text
from sqlalchemy.engine import URL
from sqlalchemy.exc import DBAPIError
from support.examples import examples
from support.locks import wait_for_lock_waiters
from support.roles import app_role, as_role  # noqa: F401

from pgqueue import PgQueue, QueueFull, Settings, codec, migrations, validation
from pgqueue.errors import PgQueueError
from pgqueue.sqlstates import sqlstate_of

# The SQL type each parameter is bound as (psycopg sends a str as text, which is no jsonb).
PARAMETER_TYPES: Mapping[str, str] = {
    "task_name": "text",
    "args": "jsonb",
    "kwargs": "jsonb",
    "queue": "text",
    "priority": "bigint",
    "max_attempts": "bigint",
    "run_at": "timestamptz",
    "delay": "interval",
    "unique_key": "text",
    "concurrency_key": "text",
    "key_limit": "bigint",
    "atomic": "boolean",
}
COUNTED = ("pgqueue_jobs", "pgqueue_message_queue", "pgqueue_concurrency_keys")
FAST = Settings(poll_interval=0.2, rescue_interval=0.5, lease_seconds=10.0)


def enqueue_sql(connection: Connection, **params: Any) -> int:
    """``SELECT pgqueue_enqueue(name => value, ...)`` in named notation; the returned id."""
    named = ", ".join(f"{k} => CAST(:{k} AS {PARAMETER_TYPES[k]})" for k in params)
    bound = {
        k: json.dumps(v) if PARAMETER_TYPES[k] == "jsonb" and v is not None else v
        for k, v in params.items()
    }
    return int(connection.execute(text(f"SELECT pgqueue_enqueue({named})"), bound).scalar_one())


def counts(connection: Connection) -> dict[str, int]:
    return {
        table: connection.execute(text(f"SELECT count(*) FROM {table}")).scalar_one()
        for table in COUNTED
    }


# What the comparison reads of a job: every column an enqueue writes; its times also relative
# to its creation (each enqueue takes now() from its own transaction).
JOB_COLUMNS = text(
    """SELECT task_name, queue, CAST(args AS jsonb) AS args, CAST(kwargs AS jsonb) AS kwargs,
              state, priority, attempts, max_attempts, run_at,
              run_at - created_at AS run_after, updated_at - created_at AS updated_after,
              started_at, finished_at, last_error, errors, result, lease_owner, lease_token,
              lease_expires_at, unique_key, cancel_requested, atomic, depends_on, dependents,
              trace_context IS NULL AS untraced, awaited, snoozes, progress, progress_message,
              progress_at, concurrency_key
       FROM pgqueue_jobs WHERE id = :id"""
)
TICKET_COLUMNS = text(
    """SELECT t.queue, t.priority, t.run_at = j.run_at, t.atomic, t.key_hash, t.keyed
       FROM pgqueue_message_queue t JOIN pgqueue_jobs j ON j.id = t.job_id
       WHERE t.job_id = :id"""
)


def job_row(connection: Connection, job_id: int) -> dict[str, Any]:
    """The job's columns (``JOB_COLUMNS``) and its ticket's, by name."""
    job = dict(connection.execute(JOB_COLUMNS, {"id": job_id}).mappings().one())
    ticket = connection.execute(TICKET_COLUMNS, {"id": job_id}).one_or_none()
    job["ticket"] = None if ticket is None else tuple(ticket)
    return job


@pytest.fixture
def admin(database_url: URL) -> Iterator[Engine]:
    engine = create_engine(database_url, isolation_level="AUTOCOMMIT")
    yield engine
    engine.dispose()


def notifications(url: URL) -> psycopg.Connection[Any]:
    """A connection listening on the workers' channel."""
    listener = psycopg.connect(
        url.set(drivername="postgresql").render_as_string(hide_password=False), autocommit=True
    )
    listener.execute("LISTEN pgqueue")
    return listener


def received(listener: psycopg.Connection[Any]) -> list[str]:
    """The payloads delivered so far (waits briefly for the first)."""
    select.select([listener.fileno()], [], [], 2.0)
    return [n.payload for n in listener.notifies(timeout=0.5)]


@pytest.mark.slow
def test_the_dml_role_enqueues_from_sql_what_python_enqueues_and_a_worker_runs_it(
    database_url: URL,
    app_role: str,  # noqa: F811
    admin: Engine,
) -> None:
    with admin.connect() as connection:
        # Only the documented grant lets the role call it, not PostgreSQL's default for PUBLIC.
        connection.execute(text("REVOKE EXECUTE ON FUNCTION pgqueue_enqueue FROM PUBLIC"))
        assert connection.execute(
            text(
                "SELECT has_function_privilege(:r, 'pgqueue_enqueue(text, jsonb, jsonb, text,"
                " bigint, bigint, timestamptz, interval, text, text, bigint, boolean)',"
                " 'EXECUTE')"
            ),
            {"r": app_role},
        ).scalar_one()
    app_url = as_role(database_url, app_role)
    pgq = PgQueue(app_url.render_as_string(hide_password=False), settings=FAST)
    ran: list[tuple[Any, ...]] = []

    @pgq.task(name="sql.add", queue="sums")
    def add(a: int, b: float, *, label: dict[str, Any]) -> str:
        ran.append((a, b, label))
        return f"{label['name']}: {a + b}"

    @pgq.task(name="sql.keyed", concurrency_key="acct:1", key_limit=2, atomic=True)
    def keyed(n: int) -> int:
        return n * 2

    engine = create_engine(app_url)
    listener = notifications(database_url)
    later = dt.datetime(2031, 5, 6, 7, 8, 9, 123456, tzinfo=dt.UTC)
    label = {"name": "total", "tags": ["x", None, True], "nested": {"é": [1.5, -2]}}
    try:
        pairs: list[tuple[int, int]] = []
        payloads: list[tuple[list[str], list[str]]] = []
        for python_call, sql_params in (
            (
                lambda s: add.configure(session=s, priority=-7, max_attempts=5).enqueue(
                    2, 3.25, label=label
                ),
                {
                    "task_name": "sql.add",
                    "queue": "sums",
                    "args": [2, 3.25],
                    "kwargs": {"label": label},
                    "priority": -7,
                    "max_attempts": 5,
                },
            ),
            (
                lambda s: add.configure(session=s, delay=90, unique_key="py-1").enqueue(
                    1, 1.0, label=label
                ),
                {
                    "task_name": "sql.add",
                    "queue": "sums",
                    "args": [1, 1.0],
                    "kwargs": {"label": label},
                    "delay": dt.timedelta(seconds=90),
                    "unique_key": "sql-1",
                },
            ),
            (
                lambda s: keyed.configure(session=s, run_at=later).enqueue(4),
                {
                    "task_name": "sql.keyed",
                    "args": [4],
                    "run_at": later,
                    "concurrency_key": "acct:1",
                    "key_limit": 2,
                    "atomic": True,
                },
            ),
        ):
            with pgq.sessions() as session, session.begin():
                python_id = python_call(session)
            python_notified = received(listener)
            with engine.begin() as connection:
                sql_id = enqueue_sql(connection, **sql_params)
            payloads.append((python_notified, received(listener)))
            pairs.append((python_id, sql_id))

        with engine.connect() as connection:
            for python_id, sql_id in pairs:
                python_row, sql_row = job_row(connection, python_id), job_row(connection, sql_id)
                # The second pair's keys differ on purpose (each holds its own, shared below).
                keys = (python_row.pop("unique_key"), sql_row.pop("unique_key"))
                assert keys in {(None, None), ("py-1", "sql-1")}
                # A run_at given is the same moment; one from now (or a delay) the same offset.
                relative = (
                    "run_at" if python_row["run_after"] < dt.timedelta(days=1) else "run_after"
                )
                python_row.pop(relative), sql_row.pop(relative)
                assert sql_row == python_row
            key_rows = connection.execute(
                text("SELECT key, key_limit, running FROM pgqueue_concurrency_keys")
            ).all()
            epochs = [
                [
                    connection.execute(
                        text(
                            "SELECT extract(epoch FROM run_at)::text FROM pgqueue_jobs"
                            " WHERE id = :i"
                        ),
                        {"i": job_id},
                    ).scalar_one()
                    for job_id in pair
                ]
                for pair in pairs
            ]
        assert key_rows == [("acct:1", 2, 0)]
        # The same wake-ups: the queue of a job ready now, the queue and the epoch of its
        # run_at otherwise.
        assert payloads == [
            (["sums"], ["sums"]),
            ([f"sums {epochs[1][0]}"], [f"sums {epochs[1][1]}"]),
            ([f"default {epochs[2][0]}"], [f"default {epochs[2][1]}"]),
        ]
        assert epochs[2][0] == epochs[2][1]

        # A unique key held by either one's job is held for the other.
        with pgq.sessions() as session, session.begin():
            assert (
                add.configure(session=session, unique_key="sql-1").enqueue(0, 0.0, label=label)
                == pairs[1][1]
            )
        with engine.begin() as connection:
            before = counts(connection)
            held = enqueue_sql(
                connection,
                task_name="sql.add",
                queue="sums",
                args=[0, 0.0],
                kwargs={"label": label},
                unique_key="py-1",
            )
            assert held == pairs[1][0]
            assert counts(connection) == before

        # A worker of the role runs the SQL job with its arguments (the first pair: ready now).
        pgq.run_worker(queues=["sums"], drain=True)
        job = pgq.get_job(pairs[0][1])
        assert (job.state.value, job.result) == ("succeeded", "total: 5.25")
        assert ran == [(2, 3.25, label), (2, 3.25, label)]
    finally:
        listener.close()
        engine.dispose()
        pgq.dispose()


APP_SCHEMA = """
CREATE TABLE orders (id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, email text NOT NULL);
CREATE FUNCTION orders_enqueue_receipt() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pgqueue_enqueue(
        task_name => 'shop.send_receipt',
        args => jsonb_build_array(NEW.id),
        kwargs => jsonb_build_object('email', NEW.email),
        queue => 'emails',
        unique_key => 'receipt:' || NEW.id
    );
    RETURN NEW;
END
$$;
CREATE TRIGGER orders_receipt AFTER INSERT ON orders
FOR EACH ROW EXECUTE FUNCTION orders_enqueue_receipt();
"""


def test_a_trigger_enqueues_in_the_inserting_transaction(pgq: PgQueue, engine: Engine) -> None:
    sent: list[tuple[int, str]] = []

    @pgq.task(name="shop.send_receipt", queue="emails")
    def send_receipt(order_id: int, email: str) -> str:
        sent.append((order_id, email))
        return f"receipt {order_id} to {email}"

    with engine.begin() as connection:
        connection.execute(text(APP_SCHEMA))
    with engine.begin() as connection:
        order_id = connection.execute(
            text("INSERT INTO orders (email) VALUES ('a@example.com') RETURNING id")
        ).scalar_one()
        # In the same transaction, before the commit, the job is there.
        assert (
            connection.execute(
                text("SELECT count(*) FROM pgqueue_jobs WHERE args::jsonb = jsonb_build_array(:i)"),
                {"i": order_id},
            ).scalar_one()
            == 1
        )
    with engine.connect() as connection:
        connection.execute(text("INSERT INTO orders (email) VALUES ('gone@example.com')"))
        connection.rollback()
        # Nothing of the rolled-back order: no job, no ticket.
        assert counts(connection)["pgqueue_jobs"] == 1
        assert counts(connection)["pgqueue_message_queue"] == 1
    # A refused enqueue refuses the row that fired it.
    with engine.begin() as connection:
        connection.execute(
            text(
                "CREATE OR REPLACE FUNCTION orders_enqueue_receipt() RETURNS"
                " trigger LANGUAGE plpgsql AS $$ BEGIN PERFORM pgqueue_enqueue("
                "task_name => 'shop.send_receipt', queue => 'bad queue');"
                " RETURN NEW; END $$"
            )
        )
    with pytest.raises(DBAPIError) as refused, engine.begin() as connection:
        connection.execute(text("INSERT INTO orders (email) VALUES ('b@example.com')"))
    assert sqlstate_of(refused.value) == "22023"
    with engine.connect() as connection:
        assert connection.execute(text("SELECT count(*) FROM orders")).scalar_one() == 1
        assert counts(connection)["pgqueue_jobs"] == 1

    pgq.run_worker(queues=["emails"], drain=True)
    assert sent == [(order_id, "a@example.com")]


# (parameters, SQLSTATE, what the message says); task_name is "t" unless given.
REFUSED: list[tuple[dict[str, Any], str, str]] = [
    ({"task_name": None}, "22004", "task_name must not be NULL"),
    ({"task_name": ""}, "22023", 'task_name "" has characters outside'),
    ({"task_name": "a b"}, "22023", 'task_name "a b" has characters outside'),
    ({"task_name": "1abc"}, "22023", 'task_name "1abc" has characters outside'),
    ({"task_name": "x" * 64}, "22023", "is longer than 63 bytes"),
    ({"task_name": "é"}, "22023", 'task_name "é" has characters outside'),
    ({"task_name": "a\nb"}, "22023", 'task_name "a\\nb" has characters outside'),
    ({"queue": None}, "22004", "queue must not be NULL"),
    ({"queue": "a/b"}, "22023", 'queue "a/b" has characters outside'),
    ({"queue": "<locals>"}, "22023", 'queue "<locals>" has characters outside'),
    ({"queue": "q" * 64}, "22023", 'queue "qqqq'),
    ({"priority": None}, "22004", "priority must not be NULL"),
    ({"priority": 32768}, "22023", "priority must be within -32768..32767, got 32768"),
    ({"priority": -32769}, "22023", "priority must be within -32768..32767, got -32769"),
    ({"priority": 2**40}, "22023", "priority must be within"),
    ({"max_attempts": 0}, "22023", "max_attempts must be a whole number from 1 to 1000000, got 0"),
    ({"max_attempts": 1_000_001}, "22023", "max_attempts must be"),
    ({"max_attempts": None}, "22004", "max_attempts must not be NULL"),
    ({"atomic": None}, "22004", "atomic must be true or false"),
    ({"args": None}, "22004", "args must be a JSON array, not NULL"),
    ({"args": {"a": 1}}, "22023", "args must be a JSON array, got object"),
    ({"args": "x"}, "22023", "args must be a JSON array, got string"),
    ({"kwargs": None}, "22004", "kwargs must be a JSON object, not NULL"),
    ({"kwargs": [1]}, "22023", "kwargs must be a JSON object, got array"),
    ({"kwargs": 3}, "22023", "kwargs must be a JSON object, got number"),
    (
        {"args": ["x" * 1_000_000]},
        "54000",
        "task arguments are 1000006 bytes encoded; the limit is 1000000",
    ),
    ({"kwargs": {"k": ["y" * 999_990]}}, "54000", "the limit is 1000000"),
    (
        {"args": [[[]]], "kwargs": {"k": json.loads("[" * 65 + "]" * 65)}},
        "54000",
        "kwargs is nested deeper than 64 levels",
    ),
    ({"args": json.loads("[" * 66 + "]" * 66)}, "54000", "args is nested deeper than 64 levels"),
    ({"delay": dt.timedelta(seconds=-1)}, "22023", "delay must be a non-negative interval"),
    ({"delay": dt.timedelta(days=3651)}, "22023", "of at most 3650 days"),
    (
        {"delay": dt.timedelta(0), "run_at": dt.datetime(2030, 1, 1, tzinfo=dt.UTC)},
        "22023",
        "give either delay or run_at, not both",
    ),
    ({"unique_key": ""}, "22023", "unique_key must be a non-empty string of at most 512"),
    ({"unique_key": "k" * 513}, "22023", "unique_key must be"),
    ({"concurrency_key": ""}, "22023", "concurrency_key must be a non-empty string"),
    ({"concurrency_key": "c" * 513}, "22023", "concurrency_key must be"),
    ({"key_limit": 2, "concurrency_key": None}, "22023", "key_limit needs a concurrency_key"),
    ({"key_limit": 0, "concurrency_key": "c"}, "22023", "key_limit must be a whole number"),
    ({"key_limit": 2**31, "concurrency_key": "c"}, "22023", "key_limit must be"),
]
# Values psycopg cannot bind as they are: written into the statement as SQL.
REFUSED_SQL: list[tuple[str, str, str]] = [
    ("run_at => 'infinity'", "22023", "run_at must be a finite time within 3650 days of now"),
    ("run_at => '-infinity'", "22023", "run_at must be a finite time"),
    ("run_at => '10000-01-01 00:00:00+00'", "22023", "run_at must be a finite time"),
    ("run_at => now() + interval '3651 days'", "22023", "within 3650 days of now, got"),
    ("run_at => now() - interval '3651 days'", "22023", "within 3650 days of now, got"),
    # Compared as intervals, 121 months are 3630 days; from now they are more than 3650.
    ("delay => '121 months'", "22023", "delay must be a non-negative interval of at most 3650"),
    ("delay => '1 month -32 days'", "22023", "delay must be a non-negative interval"),
    ("delay => '200000 years'", "22023", "delay must be a non-negative interval"),
    # Compared as an interval 0 days long; added to now, beyond the range of timestamps.
    ("delay => '1000000 years -360000000 days'", "22023", "delay must be a non-negative"),
    # Python reads these as 0.0: an enqueue from Python never stores them.
    ("args => '[1e-400]'", "22023", "args[0] holds a number Python cannot read as given"),
    ("args => '[1, [2, -2.4703282292062327e-324]]'", "22023", "args[1] holds a number"),
    ('kwargs => \'{"a": 1, "b": {"c": [1e-330]}}\'', "22023", 'kwargs["b"] holds a number'),
    ("args => ('[1' || repeat('0', 4300) || ']')::jsonb", "22023", "a number Python cannot read"),
    (
        "kwargs => ('{\"f\": 2' || repeat('0', 308) || '.5}')::jsonb",
        "22023",
        "a number Python cannot read",
    ),
]


@pytest.fixture(scope="module")
def refusals_engine(server_url: URL, template_name: str) -> Iterator[Engine]:
    """An engine on a database the refusal tests share (each rolls back what it sent), which
    holds a keyed job and its key, so a refusal could show in every counted table."""
    url = create_database(server_url, template_name)
    engine = create_engine(url)
    with engine.begin() as connection:
        enqueue_sql(connection, task_name="t", concurrency_key="c", unique_key="held")
    yield engine
    engine.dispose()
    drop_database(server_url, url)


@pytest.mark.parametrize(("params", "sqlstate", "says"), REFUSED, ids=lambda v: str(v)[:40])
def test_every_refused_input_names_the_problem_and_writes_nothing(
    refusals_engine: Engine, params: dict[str, Any], sqlstate: str, says: str
) -> None:
    call = {"task_name": "t", **params}
    with refusals_engine.connect() as connection:
        before = counts(connection)
        assert before == dict.fromkeys(COUNTED, 1)
        with pytest.raises(DBAPIError) as refused:
            enqueue_sql(connection, **call)
        connection.rollback()
        assert counts(connection) == before
    assert sqlstate_of(refused.value) == sqlstate
    message = str(refused.value.orig).splitlines()[0]
    assert says in message, message
    assert len(message) < 300  # a long value is cut, never quoted whole


@pytest.mark.parametrize(("call", "sqlstate", "says"), REFUSED_SQL)
def test_refused_values_written_in_sql(
    refusals_engine: Engine, call: str, sqlstate: str, says: str
) -> None:
    with refusals_engine.connect() as connection:
        before = counts(connection)
        with pytest.raises(DBAPIError) as refused:
            connection.execute(text(f"SELECT pgqueue_enqueue(task_name => 't', {call})"))
        connection.rollback()
        assert counts(connection) == before
    assert sqlstate_of(refused.value) == sqlstate
    assert says in str(refused.value.orig)


def test_the_edges_of_each_rule_are_accepted(engine: Engine) -> None:
    with engine.begin() as connection:
        for params in (
            {"task_name": "_<locals>.x:y-z" + "a" * 48, "queue": "0" + "q" * 62},
            {"task_name": "t", "priority": -32768, "max_attempts": 1},
            {"task_name": "t", "priority": 32767, "max_attempts": 1_000_000},
            {"task_name": "t", "delay": dt.timedelta(days=3650)},
            {"task_name": "t", "run_at": dt.datetime.now(dt.UTC) - dt.timedelta(days=3649)},
            {"task_name": "t", "run_at": dt.datetime.now(dt.UTC) + dt.timedelta(days=3649)},
            {"task_name": "t", "delay": "119 months"},
            {"task_name": "t", "args": [5e-324, 0.0, -0.0], "kwargs": {"z": [-5e-324]}},
            {
                "task_name": "t",
                "unique_key": "k" * 512,
                "concurrency_key": "c" * 512,
                "key_limit": 2**31 - 1,
            },
            {"task_name": "t", "args": json.loads("[" * 65 + "]" * 65)},
            {"task_name": "t", "args": [int("9" * 4300), -1.7976931348623157e308]},
            {"task_name": "t", "args": ["x" * 999_994]},
        ):
            enqueue_sql(connection, **params)
    # The size limit's edge is Python's too.
    codec.encode_args(["x" * 999_994], {}, max_bytes=1_000_000, max_depth=64)
    with pytest.raises(PgQueueError, match="1000001 bytes"):
        codec.encode_args(["x" * 999_995], {}, max_bytes=1_000_000, max_depth=64)


# 2**-1075 (5**1075 / 10**1075), half the smallest float above 0: Python rounds it (a tie, to
# even) and anything smaller to 0.0, anything larger to 5e-324. Written out whole, as jsonb
# writes numbers.
HALF_TINY = 5**1075
# (the number as jsonb writes it, whether Python reads it as 0.0)
EDGES = {
    "2**-1075": (f"0.{HALF_TINY:0>1075}", True),
    "beyond -2**-1075": (f"-0.{HALF_TINY:0>1075}1", False),
    "within -2**-1075": (f"-0.{HALF_TINY - 1:0>1075}9", True),
}


@pytest.mark.parametrize(("written", "python_reads_zero"), EDGES.values(), ids=EDGES.keys())
def test_a_fraction_is_refused_exactly_where_python_reads_it_as_zero(
    held_connection: Connection, written: str, python_reads_zero: bool
) -> None:
    assert (json.loads(written) == 0.0) == python_reads_zero
    savepoint = held_connection.begin_nested()
    try:
        held_connection.execute(
            text("SELECT pgqueue_enqueue(task_name => 't', kwargs => CAST(:kwargs AS jsonb))"),
            {"kwargs": f'{{"n": [{written}]}}'},
        )
    except DBAPIError as exc:
        assert sqlstate_of(exc) == "22023", exc
        assert 'kwargs["n"] holds a number Python cannot read as given' in str(exc.orig)
        refused = True
    else:
        refused = False
    savepoint.rollback()
    assert refused == python_reads_zero


# Text PostgreSQL can hold (no NUL), weighted to the characters the name rules are about.
NAMES = st.text(
    st.one_of(
        st.sampled_from("aZ_09.:-<>/ é\n"),
        st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"),
    ),
    max_size=70,
)


def _python_accepts(check: Any, value: Any) -> bool:
    try:
        check(value)
    except PgQueueError:
        return False
    return True


def _sql_accepts(connection: Connection, **params: Any) -> bool:
    savepoint = connection.begin_nested()
    try:
        enqueue_sql(connection, **params)
    except DBAPIError as exc:
        savepoint.rollback()
        assert sqlstate_of(exc) in {"22023", "54000"}, exc
        return False
    savepoint.rollback()
    return True


@pytest.fixture
def held_connection(engine: Engine) -> Iterator[Connection]:
    with engine.connect() as connection:
        yield connection
        connection.rollback()


@settings(
    max_examples=examples(300),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(name=NAMES)
def test_names_are_refused_exactly_where_python_refuses_them(
    held_connection: Connection, name: str
) -> None:
    assert _sql_accepts(held_connection, task_name=name) == _python_accepts(
        validation.task_name, name
    )
    assert _sql_accepts(held_connection, task_name="t", queue=name) == _python_accepts(
        validation.queue_name, name
    )


@settings(
    max_examples=examples(200),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(number=st.integers(min_value=-(2**40), max_value=2**40) | st.integers(-3, 3))
def test_numbers_are_refused_exactly_where_python_refuses_them(
    held_connection: Connection, number: int
) -> None:
    assert _sql_accepts(held_connection, task_name="t", priority=number) == _python_accepts(
        validation.priority, number
    )
    assert _sql_accepts(held_connection, task_name="t", max_attempts=number) == _python_accepts(
        validation.max_attempts, number
    )


@settings(
    max_examples=examples(60),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(depth=st.integers(min_value=0, max_value=70), keyword=st.booleans(), empty=st.booleans())
def test_nesting_is_refused_exactly_where_python_refuses_it(
    held_connection: Connection, depth: int, keyword: bool, empty: bool
) -> None:
    value: Any = [] if empty else [1]
    for level in range(depth):
        value = [value] if level % 2 else {"k": value}
    args, kwargs = ([], {"v": value}) if keyword else ([value], {})

    def python(_: object) -> None:
        codec.encode_args(args, kwargs, max_bytes=1_000_000, max_depth=64)

    assert _sql_accepts(held_connection, task_name="t", args=args, kwargs=kwargs) == (
        _python_accepts(python, None)
    )


def test_a_bounded_queue_refuses_sql_as_it_refuses_python(pgq: PgQueue, engine: Engine) -> None:
    @pgq.task(name="b.job", queue="bounded")
    def job() -> None:
        """Enqueued only."""

    pgq.set_queue_max_depth("bounded", 2)
    job.enqueue()
    with engine.begin() as connection:
        enqueue_sql(connection, task_name="b.job", queue="bounded")
    with pytest.raises(QueueFull) as python_refused:
        job.enqueue()
    with engine.connect() as connection:
        before = counts(connection)
        with pytest.raises(DBAPIError) as sql_refused:
            enqueue_sql(connection, task_name="b.job", queue="bounded")
        connection.rollback()
        assert counts(connection) == before
    # REPEATABLE READ could not count the queue exactly: refused, as Python refuses it.
    repeatable_read = engine.execution_options(isolation_level="REPEATABLE READ")
    with pytest.raises(DBAPIError) as repeatable, repeatable_read.begin() as connection:
        enqueue_sql(connection, task_name="b.job", queue="bounded")
    assert sqlstate_of(sql_refused.value) == "PQ001"
    assert str(sql_refused.value.orig).splitlines()[0] == str(python_refused.value)
    assert sqlstate_of(repeatable.value) == "25000"
    assert "READ COMMITTED or SERIALIZABLE" in str(repeatable.value.orig)
    # Room again once a job left: the next enqueue fits.
    pgq.run_worker(queues=["bounded"], drain=True)
    with engine.begin() as connection:
        enqueue_sql(connection, task_name="b.job", queue="bounded")


FUNCTION_EXISTS = text("SELECT count(*) FROM pg_proc WHERE proname = 'pgqueue_enqueue'")


def test_the_migration_adds_and_removes_the_function_with_jobs_present(
    empty_database_url: URL,
) -> None:
    engine = create_engine(empty_database_url)
    pgq = PgQueue(empty_database_url.render_as_string(hide_password=False), settings=FAST)

    @pgq.task(name="m.job")
    def job(n: int) -> int:
        return n

    try:
        with engine.begin() as connection:
            migrations.upgrade(connection, "pgqueue_0019")
            assert connection.execute(FUNCTION_EXISTS).scalar_one() == 0
        ids = [job.enqueue(n) for n in range(5)]
        with engine.begin() as connection:
            migrations.upgrade(connection, "pgqueue_0020")
            assert migrations.current(connection) == "pgqueue_0020"
            ids.append(enqueue_sql(connection, task_name="m.job", args=[5]))
        with engine.begin() as connection:
            before = counts(connection)
            migrations.downgrade(connection, "pgqueue_0019", refuse_data_loss=True)
            assert connection.execute(FUNCTION_EXISTS).scalar_one() == 0
            assert counts(connection) == before
            migrations.upgrade(connection)
            assert connection.execute(FUNCTION_EXISTS).scalar_one() == 1
            ids.append(enqueue_sql(connection, task_name="m.job", args=[6]))
        pgq.run_worker(drain=True)
        assert [pgq.get_job(i).result for i in ids] == list(range(7))
    finally:
        pgq.dispose()
        engine.dispose()


def test_the_time_and_number_bounds_go_both_ways_with_the_migration(engine: Engine) -> None:
    def accepts(connection: Connection, call: str) -> bool:
        savepoint = connection.begin_nested()
        try:
            connection.execute(text(f"SELECT pgqueue_enqueue(task_name => 't', {call})"))
        except DBAPIError as exc:
            assert sqlstate_of(exc) == "22023", exc
            return False
        finally:
            savepoint.rollback()
        return True

    calls = ("delay => '121 months'", "args => '[1e-400]'")
    with engine.begin() as connection:
        migrations.downgrade(connection, "pgqueue_0025")
        assert [accepts(connection, call) for call in calls] == [True, True]
        migrations.upgrade(connection)
        assert migrations.current(connection) == migrations.head()
        assert [accepts(connection, call) for call in calls] == [False, False]


def test_what_sql_cannot_check_is_handled_by_the_worker(pgq: PgQueue, engine: Engine) -> None:
    """A task no worker registers waits for one that does; arguments that do not fit the
    function fail the job's first attempt for good, naming the mismatch (as the how-to says)."""

    @pgq.task(name="w.known", max_attempts=5)
    def known(a: int) -> int:
        return a

    with engine.begin() as connection:
        unknown = enqueue_sql(connection, task_name="w.unknown")
        misfit = enqueue_sql(connection, task_name="w.known", args=[1, 2], max_attempts=5)
        fits = enqueue_sql(connection, task_name="w.known", kwargs={"a": 7})
    pgq.run_worker(drain=True)
    waiting, failed, done = (pgq.get_job(i) for i in (unknown, misfit, fits))
    assert (waiting.state.value, waiting.attempts, waiting.last_error) == ("queued", 0, None)
    assert (failed.state.value, failed.attempts) == ("failed", 1)
    assert "arguments do not match task w.known" in (failed.last_error or "")
    assert (done.state.value, done.result) == ("succeeded", 7)


@pytest.mark.parametrize("first_ends", ["commit", "rollback"])
def test_a_unique_key_enqueued_at_once_twice_makes_one_job(engine: Engine, first_ends: str) -> None:
    """The second call waits for the first's key: a committed holder's id comes back, a
    rolled-back one leaves the key to the second."""
    answers: dict[str, int] = {}

    def second() -> None:
        with engine.begin() as connection:
            answers["second"] = enqueue_sql(connection, task_name="t", unique_key="race")

    with engine.connect() as first:
        answers["first"] = enqueue_sql(first, task_name="t", unique_key="race")
        thread = threading.Thread(target=second)
        thread.start()
        thread.join(0.5)
        assert thread.is_alive()  # waiting for the first's key
        getattr(first, first_ends)()
        thread.join(30)
    with engine.connect() as connection:
        ids = (
            connection.execute(text("SELECT id FROM pgqueue_jobs WHERE unique_key = 'race'"))
            .scalars()
            .all()
        )
    assert ids == [answers["second"]]
    assert (answers["second"] == answers["first"]) is (first_ends == "commit")


def test_a_bounded_queue_counts_the_enqueue_it_waited_for(pgq: PgQueue, engine: Engine) -> None:
    """An enqueue into a bounded queue waits for the queue's lock and counts what its holder
    committed: with room for one, a SQL and a Python enqueue waiting behind a SQL one are both
    refused."""

    @pgq.task(name="b.one", queue="one")
    def one() -> None:
        """Enqueued only."""

    pgq.set_queue_max_depth("one", 1)
    refused: dict[str, Exception] = {}

    def from_sql() -> None:
        try:
            with engine.begin() as connection:
                enqueue_sql(connection, task_name="b.one", queue="one")
        except DBAPIError as exc:
            refused["sql"] = exc

    def from_python() -> None:
        try:
            one.enqueue()
        except QueueFull as exc:
            refused["python"] = exc

    with engine.connect() as first:
        enqueue_sql(first, task_name="b.one", queue="one")
        threads = [threading.Thread(target=f) for f in (from_sql, from_python)]
        for thread in threads:
            thread.start()
        wait_for_lock_waiters(engine, count=2)
        assert all(thread.is_alive() for thread in threads)  # waiting for the queue's lock
        first.commit()
        for thread in threads:
            thread.join(30)
    assert sqlstate_of(refused["sql"]) == "PQ001"
    assert isinstance(refused["python"], QueueFull)
    with engine.connect() as connection:
        assert (
            connection.execute(
                text("SELECT count(*) FROM pgqueue_jobs WHERE queue = 'one'")
            ).scalar_one()
            == 1
        )
