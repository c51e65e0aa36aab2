"""Property tests of enqueue's input checks, with Hypothesis.

Refusals: arguments that are not JSON, nested past the limit, or over the size limit, and queue or
task names with quotes, ``$$``, ``%``, NUL, newlines or over 63 bytes each raise a pgqueue
``ValidationError`` before any SQL is sent. "No SQL" is observed, not assumed: a
``before_cursor_execute`` listener on every SQLAlchemy engine counts statements while the
property runs (it must stay at 0), and after the property the row counts and a ``pg_catalog``
snapshot of the schema are compared with those taken before.

Acceptance: valid JSON arguments round-trip exactly (type included: floats stay floats, ``-0.0``
keeps its sign, big ints stay ints), read back with the ORM and as received by a handler.

Each property runs 1,000 examples (100 in the quick loop). Hypothesis's ``@given`` is applied to
an inner function so the per-test database fixtures are set up once per test, not once per
example. The round trip's database commits without waiting for its WAL flush: what it proves is
the values, not their durability, and its examples commit thousands of enqueues.
"""

from __future__ import annotations

import collections
import datetime as dt
import decimal
import enum
import json
import math
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given
from hypothesis import settings as hyp_settings
from hypothesis import strategies as st
from sqlalchemy import Engine, create_engine, event, select, text
from sqlalchemy.engine import URL
from support.examples import examples

from pgqueue import PgQueue, Settings
from pgqueue.context import JobContext
from pgqueue.errors import PayloadTooLarge, SerializationError, ValidationError
from pgqueue.models import Job
from pgqueue.testing import table_counts

EXAMPLES = examples(1000)
runs: list[int] = []  # one entry per example run by the current property
PROPERTY = hyp_settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    database=None,  # no .hypothesis directory written by CI runs
)

SIZE_LIMIT = 2048
DEPTH_LIMIT = 8

# --- strategies ------------------------------------------------------------------------------

json_leaves = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.integers(min_value=-(10**60), max_value=10**60),  # far past int64 and float precision
    st.floats(allow_nan=False, allow_infinity=False),
    st.sampled_from([-0.0, 0.0, 1.0, 1e308, -1e-308, 5e-324, 2.0**53 + 2]),
    st.text(),  # Hypothesis' default alphabet never has lone surrogates; NUL and controls yes
)
json_values = st.recursive(
    json_leaves,
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(), children, max_size=4)
    ),
    max_leaves=12,
)


class Color(enum.IntEnum):
    RED = 1


class Label(enum.StrEnum):
    A = "a"


class MyList(list[Any]):
    pass


class MyStr(str):
    __slots__ = ()


def _generator() -> Iterator[int]:
    yield 1


def _non_json_leaf_factories() -> list[Callable[[], Any]]:
    """Factories (a fresh object per example) of values JSON cannot hold as given."""
    return [
        object,
        lambda: float("nan"),
        lambda: float("inf"),
        lambda: float("-inf"),
        lambda: b"bytes",
        lambda: bytearray(b"x"),
        lambda: memoryview(b"x"),
        lambda: (1, 2),
        lambda: (),
        lambda: {1, 2},
        lambda: frozenset(),
        lambda: 1 + 2j,
        lambda: decimal.Decimal("1.5"),
        lambda: dt.datetime(2024, 1, 1, tzinfo=dt.UTC),
        lambda: dt.date(2024, 1, 1),
        lambda: uuid.UUID(int=7),
        lambda: Color.RED,  # an int subclass: JSON would hand back a plain 1
        lambda: Label.A,
        lambda: MyStr("s"),
        lambda: MyList([1]),
        lambda: collections.OrderedDict(a=1),
        lambda: collections.defaultdict(list),
        lambda: {1: "int key"},
        lambda: {None: "none key"},
        lambda: {(1, 2): "tuple key"},
        lambda: {MyStr("k"): "str-subclass key"},
        lambda: {"k" * 100_000: {(1,): 2}},  # a huge key must not end up in the message
        lambda: "lone \ud800 surrogate",
        lambda: {"lone \udfff key": 1},
        lambda: 10**5000,  # Python cannot print (or parse) ints over 4300 digits
        lambda: range(3),
        _generator,
        lambda: print,
        lambda: Exception("x"),
    ]


NON_JSON_LEAVES = _non_json_leaf_factories()


@st.composite
def with_bad_leaf(draw: st.DrawFn) -> tuple[list[Any], dict[str, Any]]:
    """Valid JSON args/kwargs with one non-JSON value hidden somewhere inside."""
    value: Any = draw(st.sampled_from(NON_JSON_LEAVES))()
    for _ in range(draw(st.integers(0, 4))):
        if draw(st.booleans()):
            siblings = draw(st.lists(json_leaves, max_size=3))
            siblings.insert(draw(st.integers(0, len(siblings))), value)
            value = siblings
        else:
            siblings_d = draw(st.dictionaries(st.text(max_size=4), json_leaves, max_size=3))
            siblings_d[draw(st.text(max_size=4))] = value
            value = siblings_d
    args = draw(st.lists(json_values, max_size=2))
    kwargs = draw(st.dictionaries(st.text(min_size=1, max_size=8), json_values, max_size=2))
    if draw(st.booleans()):
        args.insert(draw(st.integers(0, len(args))), value)
    else:
        kwargs[draw(st.text(min_size=1, max_size=8))] = value
    return args, kwargs


@st.composite
def too_deep(draw: st.DrawFn) -> Any:
    """Lists and dicts nested deeper than DEPTH_LIMIT (sometimes far deeper)."""
    depth = draw(st.integers(DEPTH_LIMIT + 1, DEPTH_LIMIT + 40) | st.sampled_from([500, 5_000]))
    kinds = draw(st.lists(st.booleans(), min_size=1, max_size=16))
    value: Any = draw(json_leaves)
    for level in range(depth):
        value = [value] if kinds[level % len(kinds)] else {"k": value}
    return value


SAFE_CHARS = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_.:-"
SAFE_FIRST = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz_"
HOSTILE = [
    "'",
    '"',
    "$$",
    "$1",
    "%",
    "%s",
    "%(x)s",
    "\x00",
    "\n",
    "\r",
    "\t",
    " ",
    ";",
    "\\",
    "`",
    "/*",
    "{}",
    "é",
    "\u2028",
    "\ufeff",
    "\U0001f600",
]


def _outside_safe(s: str) -> bool:
    # "<" and ">" are allowed in task names (for "<locals>" in qualified names), so a name is
    # hostile to both kinds only with some other character outside the safe set.
    return any(c not in SAFE_CHARS + "<>" for c in s)


hostile_names = st.one_of(
    # Valid-looking text with something hostile spliced in.
    st.builds(
        lambda a, bad, b: a + bad + b,
        st.text(SAFE_CHARS, max_size=20),
        st.sampled_from(HOSTILE) | st.text(min_size=1, max_size=5).filter(_outside_safe),
        st.text(SAFE_CHARS, max_size=20),
    ),
    # Only allowed characters, but longer than 63 bytes.
    st.text(SAFE_CHARS, min_size=64, max_size=300),
    st.just(""),
)
non_string_names = st.one_of(
    st.binary(max_size=10), st.integers(), st.just(b"default"), st.lists(st.text(max_size=3))
)
valid_queue_names = st.text(SAFE_CHARS, min_size=1, max_size=63).filter(lambda s: s[0] not in ".:-")
valid_task_names = st.builds(
    lambda first, rest: first + rest,
    st.sampled_from(SAFE_FIRST),
    st.text(SAFE_CHARS + "<>", max_size=62),
)


# --- observation helpers ---------------------------------------------------------------------


@contextmanager
def no_sql_sent() -> Iterator[list[str]]:
    """Record every statement any SQLAlchemy engine sends while the block runs."""
    sent: list[str] = []

    def record(conn: Any, cursor: Any, statement: str, *rest: Any) -> None:
        sent.append(statement)

    event.listen(Engine, "before_cursor_execute", record)
    try:
        yield sent
    finally:
        event.remove(Engine, "before_cursor_execute", record)
    assert sent == [], f"{len(sent)} statements were sent; first: {sent[0][:200]!r}"


SCHEMA_SNAPSHOT = [
    """SELECT c.relname, c.relkind, c.reloptions::text
       FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
       WHERE n.nspname = 'public' ORDER BY 1""",
    """SELECT a.attrelid::regclass::text, a.attname, format_type(a.atttypid, a.atttypmod),
              a.attnotnull, pg_get_expr(d.adbin, d.adrelid)
       FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid
       JOIN pg_namespace n ON n.oid = c.relnamespace
       LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
       WHERE n.nspname = 'public' AND a.attnum > 0 AND NOT a.attisdropped ORDER BY 1, 2""",
    """SELECT indexrelid::regclass::text, pg_get_indexdef(indexrelid) FROM pg_index
       WHERE indrelid::regclass::text LIKE 'pgqueue%' ORDER BY 1""",
    """SELECT conname, pg_get_constraintdef(oid) FROM pg_constraint
       WHERE connamespace = 'public'::regnamespace ORDER BY 1""",
    """SELECT tgname, pg_get_triggerdef(oid) FROM pg_trigger WHERE NOT tgisinternal ORDER BY 1""",
    """SELECT proname, prosrc FROM pg_proc WHERE pronamespace = 'public'::regnamespace
       ORDER BY 1""",
    """SELECT version_num FROM pgqueue_alembic_version""",
]


def snapshot(engine: Engine) -> dict[str, Any]:
    with engine.connect() as connection:
        schema = [[tuple(r) for r in connection.execute(text(q))] for q in SCHEMA_SNAPSHOT]
    return {"schema": schema, "rows": table_counts(engine)}


def same_json(a: Any, b: Any) -> bool:
    """Equal with identical types at every level (1 != 1.0, -0.0 != 0.0)."""
    if type(a) is not type(b):
        return False
    if type(a) is float:
        return a == b and math.copysign(1.0, a) == math.copysign(1.0, b)
    if type(a) is list:
        return len(a) == len(b) and all(same_json(x, y) for x, y in zip(a, b, strict=True))
    if type(a) is dict:
        return a.keys() == b.keys() and all(same_json(a[k], b[k]) for k in a)
    return bool(a == b)


def test_same_json_is_strict() -> None:
    """The round-trip oracle itself distinguishes what a lax one would not."""
    assert same_json({"a": [1, -0.0, 10**30]}, {"a": [1, -0.0, 10**30]})
    assert not same_json(1, 1.0)
    assert not same_json(-0.0, 0.0)
    assert not same_json(True, 1)
    assert not same_json([1], [1, 2])
    assert not same_json({"a": 1}, {"b": 1})


# --- fixtures --------------------------------------------------------------------------------


@pytest.fixture
def small_pgq(database_url: URL) -> Iterator[PgQueue]:
    """A queue with small payload and depth limits, so oversize inputs are cheap to generate."""
    queue = PgQueue(
        database_url.render_as_string(hide_password=False),
        settings=Settings(
            max_payload_bytes=SIZE_LIMIT, max_json_depth=DEPTH_LIMIT, poll_interval=0.2
        ),
    )
    yield queue
    queue.dispose()


@pytest.fixture
def unflushed_pgq(database_url: URL, settings: Settings) -> Iterator[PgQueue]:
    """A queue on a database whose commits do not wait for their WAL flush."""
    admin = create_engine(database_url, isolation_level="AUTOCOMMIT")
    with admin.connect() as connection:
        connection.execute(
            text(f'ALTER DATABASE "{database_url.database}" SET synchronous_commit = off')
        )
    admin.dispose()
    queue = PgQueue(database_url.render_as_string(hide_password=False), settings=settings)
    yield queue
    queue.dispose()


def _register_anything(pgq: PgQueue) -> Any:
    @pgq.task(name="props.anything")
    def anything(*args: Any, **kwargs: Any) -> None:
        return None

    return anything


# --- refusals: no SQL, nothing changed ----------------------------------------------------------


@pytest.mark.slow
def test_non_json_arguments_are_refused_before_any_sql(small_pgq: PgQueue, engine: Engine) -> None:
    task = _register_anything(small_pgq)
    task.enqueue("warm-up")  # the engine exists and has connected: SQL *could* be sent
    before = snapshot(engine)
    seen_kinds: set[str] = set()

    @PROPERTY
    @given(with_bad_leaf(), st.booleans())
    def prop(payload: tuple[list[Any], dict[str, Any]], many: bool) -> None:
        runs.append(1)
        args, kwargs = payload
        with no_sql_sent(), pytest.raises(SerializationError) as info:
            if many:
                task.enqueue_many([kwargs, args])
            else:
                task.enqueue(*args, **kwargs)
        # The message names the problem and stays small whatever the input's size.
        assert len(str(info.value)) < 600, str(info.value)[:200]
        seen_kinds.add(str(info.value).split(" is ")[-1][:12])

    runs.clear()
    prop()
    assert len(runs) >= EXAMPLES  # Hypothesis ran every example asked for
    assert snapshot(engine) == before
    assert len(seen_kinds) > 5  # many different refusals were exercised, not one


@pytest.mark.slow
def test_nesting_past_the_limit_is_refused_before_any_sql(
    small_pgq: PgQueue, engine: Engine
) -> None:
    task = _register_anything(small_pgq)
    before = snapshot(engine)

    @PROPERTY
    @given(too_deep(), st.booleans())
    def prop(value: Any, as_kwarg: bool) -> None:
        runs.append(1)
        with no_sql_sent(), pytest.raises(SerializationError, match="nested deeper than 8"):
            if as_kwarg:
                task.enqueue(deep=value)
            else:
                task.enqueue(value)

    runs.clear()
    prop()
    assert len(runs) >= EXAMPLES  # Hypothesis ran every example asked for
    assert snapshot(engine) == before


def test_default_depth_limit_is_64(pgq: PgQueue) -> None:
    task = _register_anything(pgq)
    very_deep: Any = 0
    for _ in range(200_000):  # far past Python's recursion limit: the check must not recurse
        very_deep = [very_deep]
    with no_sql_sent(), pytest.raises(SerializationError, match="deeper than 64"):
        task.enqueue(very_deep)
    value: Any = 1
    for _ in range(65):
        value = [value]
    with no_sql_sent(), pytest.raises(SerializationError, match="deeper than 64"):
        task.enqueue(value)
    assert json.loads(json.dumps(value[0]))  # 64 levels is JSON-encodable (and accepted below)
    job_id = task.enqueue(value[0])
    assert pgq.get_job(job_id).args == [value[0]]


@st.composite
def oversized(draw: st.DrawFn) -> tuple[list[Any], dict[str, Any]]:
    """Valid JSON whose encoded args + kwargs exceed SIZE_LIMIT bytes (multi-byte chars too)."""
    args = draw(st.lists(json_values, max_size=3))
    kwargs = draw(st.dictionaries(st.text(min_size=1, max_size=5), json_values, max_size=2))
    char = draw(st.sampled_from(["x", "é", "€", "\U0001f600", "\n", '"']))
    # Multi-byte characters count by bytes: SIZE_LIMIT/3 euro signs are over the limit.
    # '\n' and '"' are escaped to two bytes by JSON.
    width = {"\n": 2, '"': 2}.get(char, len(char.encode("utf-8")))
    count = SIZE_LIMIT // width + draw(st.integers(0, 3 * SIZE_LIMIT))
    filler = char * count
    if draw(st.booleans()):
        args.insert(draw(st.integers(0, len(args))), filler)
    else:
        kwargs["filler"] = [filler] if draw(st.booleans()) else filler
    return args, kwargs


@pytest.mark.slow
def test_oversized_arguments_are_refused_before_any_sql(small_pgq: PgQueue, engine: Engine) -> None:
    task = _register_anything(small_pgq)
    before = snapshot(engine)

    @PROPERTY
    @given(oversized())
    def prop(payload: tuple[list[Any], dict[str, Any]]) -> None:
        runs.append(1)
        args, kwargs = payload
        with no_sql_sent(), pytest.raises(PayloadTooLarge, match=f"the limit is {SIZE_LIMIT}"):
            task.enqueue(*args, **kwargs)

    runs.clear()
    prop()
    assert len(runs) >= EXAMPLES  # Hypothesis ran every example asked for
    assert snapshot(engine) == before


def test_size_limit_boundary_and_default(small_pgq: PgQueue, engine: Engine) -> None:
    """Exactly the limit is accepted, one byte more is not; the default limit is 1 MB."""
    task = _register_anything(small_pgq)
    # '["' + s + '"]' plus '{}' for kwargs: len(s) + 6 bytes.
    exact = "é" * ((SIZE_LIMIT - 6) // 2)
    assert len(json.dumps([exact], ensure_ascii=False).encode()) + 2 <= SIZE_LIMIT
    job_id = task.enqueue(exact + "x" * ((SIZE_LIMIT - 6) % 2))
    assert len(pgq_args_bytes(engine, job_id)) + 2 == SIZE_LIMIT
    with no_sql_sent(), pytest.raises(PayloadTooLarge):
        task.enqueue(exact + "x" * ((SIZE_LIMIT - 6) % 2 + 1))

    assert Settings().max_payload_bytes == 1_000_000
    default_pgq = PgQueue(engine.url, settings=Settings())
    big = default_pgq.task(name="props.big")(lambda payload: None)
    with no_sql_sent(), pytest.raises(PayloadTooLarge, match="the limit is 1000000"):
        big.enqueue("x" * 999_997)  # '["' + 999,997 + '"]' + '{}' = 1,000,003 bytes


def pgq_args_bytes(engine: Engine, job_id: int) -> bytes:
    with engine.connect() as connection:
        raw = connection.execute(
            text("SELECT args::text FROM pgqueue_jobs WHERE id = :id"), {"id": job_id}
        ).scalar_one()
    return str(raw).encode("utf-8")


def test_hostile_names_are_refused_before_any_sql(pgq: PgQueue, engine: Engine) -> None:
    task = _register_anything(pgq)
    before = snapshot(engine)

    def handler() -> None:
        return None

    @PROPERTY
    @given(hostile_names | non_string_names)
    @example("x'); DROP TABLE pgqueue_jobs; --")
    @example("$$; DROP TABLE pgqueue_jobs; $$")
    @example("q" * 64)
    @example("é" * 32)  # 32 characters, 64 bytes
    def prop(name: Any) -> None:
        runs.append(1)
        with no_sql_sent():
            with pytest.raises(ValidationError) as queue_error:
                task.configure(queue=name)
            with pytest.raises(ValidationError):
                pgq.task(name="props.handler", queue=name)(handler)
            with pytest.raises(ValidationError) as task_error:
                pgq.task(name=name)(handler)
        if isinstance(name, str) and len(name.encode("utf-8")) > 63:
            assert "longer than 63 bytes" in str(queue_error.value)
            assert "longer than 63 bytes" in str(task_error.value)

    runs.clear()
    prop()
    assert len(runs) >= EXAMPLES  # Hypothesis ran every example asked for
    assert snapshot(engine) == before
    assert pgq.registry.names() == ["props.anything"]  # nothing half-registered


def test_valid_names_are_accepted_without_sql(pgq: PgQueue) -> None:
    """The refusal is not trivial: every name of the documented alphabet, 1-63 bytes, passes."""
    task = _register_anything(pgq)

    def handler() -> None:
        return None

    @PROPERTY
    @given(valid_queue_names, valid_task_names)
    def prop(queue: str, name: str) -> None:
        runs.append(1)
        with no_sql_sent():
            assert task.configure(queue=queue).options.queue == queue
            registered = pgq.task(name=name, queue=queue)(handler)
        assert (registered.name, registered.queue) == (name, queue)

    runs.clear()
    prop()
    assert len(runs) >= EXAMPLES  # Hypothesis ran every example asked for


# --- acceptance: exact round trip ----------------------------------------------------------------


@pytest.mark.slow  # 1,000 examples of 2 transactions each, then a worker run: ~20-30 s
def test_valid_arguments_round_trip_exactly(unflushed_pgq: PgQueue) -> None:
    """1,000 examples of 1-4 jobs each, read back through the ORM, then run by a worker whose
    handler sees exactly the enqueued values."""
    pgq = unflushed_pgq
    received: dict[int, tuple[list[Any], dict[str, Any]]] = {}

    @pgq.task(name="props.echo", pass_context=True)
    def echo(ctx: JobContext, /, *args: Any, **kwargs: Any) -> None:
        received[ctx.job_id] = (list(args), kwargs)

    expected: dict[int, tuple[list[Any], dict[str, Any]]] = {}
    job_items = st.one_of(
        st.lists(json_values, max_size=4).map(lambda a: (a, {})),
        st.dictionaries(st.text(), json_values, max_size=4).map(lambda k: ([], k)),
    )

    @PROPERTY
    @given(st.lists(job_items, min_size=1, max_size=4), json_values)
    @example([([-0.0, 0.0, 1.0, 10**40, -(10**40), 5e-324, 1e308], {})], "\x00")
    @example([([], {"": None, "\x00": "\x00", "a\nb": [{"$$": "%s"}]})], {"\ud7ff": -0.0})
    def prop(items: list[tuple[list[Any], dict[str, Any]]], extra: Any) -> None:
        runs.append(1)
        # One statement for the batch; the single enqueue path gets args and kwargs together.
        payloads = [k if k else a for a, k in items]
        ids = echo.enqueue_many(payloads)
        single_args, single_kwargs = [extra], {"extra": extra}
        ids.append(echo.enqueue(*single_args, **single_kwargs))
        items = [*items, (single_args, single_kwargs)]
        with pgq.sessions() as session:
            rows = dict(
                (r.id, (r.args, r.kwargs))
                for r in session.execute(
                    select(Job.id, Job.args, Job.kwargs).where(Job.id.in_(ids))
                )
            )
        for job_id, (args, kwargs) in zip(ids, items, strict=True):
            got_args, got_kwargs = rows[job_id]
            assert same_json(got_args, args), (got_args, args)
            assert same_json(got_kwargs, kwargs), (got_kwargs, kwargs)
            expected[job_id] = (args, kwargs)

    runs.clear()
    prop()
    assert len(runs) >= EXAMPLES  # Hypothesis ran every example asked for
    assert len(expected) >= 2 * EXAMPLES
    # get_job, the public read path, agrees (on a sample: each call is a round trip).
    for job_id in list(expected)[::20]:
        job = pgq.get_job(job_id)
        assert same_json(job.args, expected[job_id][0])
        assert same_json(job.kwargs, expected[job_id][1])
    stats = pgq.run_worker(drain=True, concurrency=4)
    assert stats.succeeded == len(expected)
    assert received.keys() == expected.keys()
    mismatched = [
        job_id
        for job_id, (args, kwargs) in expected.items()
        if not (same_json(received[job_id][0], args) and same_json(received[job_id][1], kwargs))
    ]
    assert mismatched == []
