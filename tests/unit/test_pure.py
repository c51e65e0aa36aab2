"""Unit tests of the pure modules: backoff, validation, codec, states, config, errors. No database."""

from __future__ import annotations

import datetime as dt
import json
import math
import traceback
from pathlib import Path

import psycopg
import pytest
from sqlalchemy.exc import OperationalError, ProgrammingError

from pgqueue import backoff, codec, validation
from pgqueue.config import Settings, embedded_database_name
from pgqueue.database_urls import normalize_database_url
from pgqueue.errors import (
    ConfigurationError,
    PayloadTooLarge,
    SerializationError,
    ValidationError,
    connection_failure,
    error_summary,
    name_connection_failure,
    storable_text,
)
from pgqueue.sqlstates import is_connection_error, is_transient_conflict, sqlstate_of
from pgqueue.states import FINAL_STATES, TRANSITIONS, JobState, allowed
from pgqueue.tasks import Task


def test_constant_and_linear_backoff() -> None:
    assert [backoff.constant(3)(n) for n in (1, 2, 5)] == [3.0, 3.0, 3.0]
    assert [backoff.linear(2)(n) for n in (1, 2, 3)] == [2.0, 4.0, 6.0]
    assert backoff.linear(2, cap=5)(10) == 5.0


def test_exponential_backoff_grows_caps_and_jitters_within_half() -> None:
    plain = backoff.exponential(base=2, cap=100, jitter=False)
    assert [plain(n) for n in (1, 2, 3, 10)] == [2.0, 4.0, 8.0, 100.0]
    jittered = backoff.exponential(base=2, cap=3600, jitter=True)
    for attempt in range(1, 12):
        nominal = min(2.0**attempt, 3600)
        assert nominal / 2 <= jittered(attempt) <= nominal
    assert math.isfinite(plain(10**9))


@pytest.mark.parametrize("bad", [-1, float("nan"), "3", True])
def test_backoff_rejects_bad_numbers(bad: object) -> None:
    with pytest.raises(ValidationError):
        backoff.constant(bad)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "name", ["", "a b", "x'y", "a$$b", "50%", "nul\x00", "new\nline", "q" * 64, "é"]
)
def test_bad_queue_names_are_refused(name: str) -> None:
    with pytest.raises(ValidationError):
        validation.queue_name(name)


@pytest.mark.parametrize("name", ["default", "emails", "reports.high", "a:b-c_d", "q" * 63])
def test_good_queue_names_pass(name: str) -> None:
    assert validation.queue_name(name) == name


@pytest.mark.parametrize(
    ("value", "error"),
    [
        (object(), SerializationError),
        (float("nan"), SerializationError),
        (float("inf"), SerializationError),
        (b"bytes", SerializationError),
        ((1, 2), SerializationError),
        ({1: "int key"}, SerializationError),
        (dt.datetime(2020, 1, 1), SerializationError),
        ("\ud800", SerializationError),
    ],
)
def test_non_json_arguments_are_refused(value: object, error: type[Exception]) -> None:
    with pytest.raises(error):
        codec.encode_args([value], {}, max_bytes=10_000, max_depth=10)


def test_depth_and_size_limits() -> None:
    deep: list[object] = []
    cursor = deep
    for _ in range(20):
        nxt: list[object] = []
        cursor.append(nxt)
        cursor = nxt
    with pytest.raises(SerializationError, match="deeper than 10"):
        codec.encode_args([deep], {}, max_bytes=10_000, max_depth=10)
    with pytest.raises(PayloadTooLarge, match="limit is 100"):
        codec.encode_args(["x" * 200], {}, max_bytes=100, max_depth=10)


def test_valid_arguments_encode_exactly() -> None:
    args_text, kwargs_text = codec.encode_args(
        [1, 1.5, "é\x00", None, True, [1, {"k": "v"}]], {"n": -0.0}, max_bytes=10_000, max_depth=10
    )
    assert args_text == '[1,1.5,"é\\u0000",null,true,[1,{"k":"v"}]]'
    assert kwargs_text == '{"n":-0.0}'


@pytest.mark.parametrize("bad", [-1, float("nan"), float("inf"), "5", True])
def test_bad_delay(bad: object) -> None:
    with pytest.raises(ValidationError):
        validation.delay(bad)


def test_naive_run_at_is_refused() -> None:
    with pytest.raises(ValidationError, match="timezone-aware"):
        validation.run_at(dt.datetime(2030, 1, 1))


def test_transition_table_is_consistent() -> None:
    for transition in TRANSITIONS.values():
        assert transition.target not in transition.sources
        assert not (transition.sources & FINAL_STATES) or transition.name == "rerun"
    assert allowed(JobState.RUNNING, JobState.SUCCEEDED)
    assert not allowed(JobState.SUCCEEDED, JobState.RUNNING)
    assert not allowed(JobState.QUEUED, JobState.SUCCEEDED)


@pytest.mark.parametrize(
    "url", ["not a url", "mysql://u@h/db", "sqlite:///x.db", "postgresql+asyncpg://u@h/db"]
)
def test_bad_database_urls(url: str) -> None:
    with pytest.raises(ConfigurationError):
        normalize_database_url(url)


@pytest.mark.parametrize(
    "url",
    [
        "postgresql://u@h/db",
        "postgres://u:p@h:5432/db",  # the scheme Heroku and other platforms hand out
        "postgres+psycopg://u@h/db",
        "postgresql+psycopg_async://u@h/db",
        "postgresql+psycopg2://u@h/db",  # most Flask apps': pgqueue's engines use psycopg 3
    ],
)
def test_url_driver_is_normalised(url: str) -> None:
    normalized = normalize_database_url(url)
    assert normalized.drivername == "postgresql+psycopg"
    assert (normalized.host, normalized.database) == ("h", "db")


def test_a_postgres_scheme_url_with_another_driver_is_refused_by_name() -> None:
    with pytest.raises(ConfigurationError, match="got driver 'pg8000'"):
        normalize_database_url("postgres+pg8000://u@h/db")


def test_settings_from_env_and_validation() -> None:
    settings = Settings.from_env({"PGQUEUE_LEASE_SECONDS": "60", "PGQUEUE_LISTEN": "off"})
    assert settings.lease_seconds == 60.0 and settings.listen is False
    assert settings.effective_heartbeat_interval == 20.0
    with pytest.raises(ConfigurationError, match="PGQUEUE_POLL_INTERVAL"):
        Settings.from_env({"PGQUEUE_POLL_INTERVAL": "soon"})
    with pytest.raises(ConfigurationError, match="heartbeat_interval"):
        Settings(lease_seconds=5, heartbeat_interval=10)


def test_process_pool_settings_are_checked_and_need_the_process_pool() -> None:
    settings = Settings.from_env({"PGQUEUE_POOL": "process", "PGQUEUE_MAX_TASKS_PER_CHILD": "5"})
    assert (settings.pool, settings.max_tasks_per_child) == ("process", 5)
    with pytest.raises(ConfigurationError, match="pool must be one of thread, process"):
        Settings(pool="fork")
    with pytest.raises(ConfigurationError, match="max_memory_per_child must be a positive"):
        Settings(pool="process", max_memory_per_child=0)
    with pytest.raises(ConfigurationError, match="max_tasks_per_child applies to the children"):
        Settings(max_tasks_per_child=5)
    with pytest.raises(ValidationError, match=r"soft_timeout \(2.0\) must be shorter than timeout"):
        Task(lambda: None, sink=None, name="t", timeout=1.0, soft_timeout=2.0)  # type: ignore[arg-type]


def test_overrides_replace_the_settings_given_and_keep_the_others() -> None:
    settings = Settings.from_env({"PGQUEUE_CONCURRENCY": "4", "PGQUEUE_HEARTBEAT_INTERVAL": "20"})
    assert settings.concurrency == 4 and Settings().concurrency == 10
    assert settings.overridden(concurrency=None, poll_interval=None) is settings
    mine = settings.overridden(concurrency=2, listen=False, prefetch=0, lease_seconds=6.0)
    assert (mine.concurrency, mine.listen, mine.prefetch) == (2, False, 0)
    # The lease given is heartbeated every third of it, not every 20 s (longer than the lease).
    assert mine.effective_heartbeat_interval == 2.0
    assert mine.poll_interval == settings.poll_interval
    for wrong in (0, 1001, True, 2.5):
        with pytest.raises(ConfigurationError, match="concurrency must be an integer from 1"):
            settings.overridden(concurrency=wrong)


def test_sqlstate_classification() -> None:
    class Fake(Exception):
        sqlstate = "40P01"

    class Wrapped(Exception):
        def __init__(self) -> None:
            super().__init__("wrapped")
            self.orig = Fake()

    assert is_transient_conflict(Wrapped())
    assert not is_transient_conflict(ValueError())


def _recorded(exc: BaseException) -> str:
    """``exc`` raised, then formatted as a worker records a handler's error: its traceback."""
    try:
        raise exc
    except BaseException as raised:
        return "".join(traceback.format_exception(raised))


def _undefined_table() -> psycopg.errors.UndefinedTable:
    # The server's message, then its excerpt of the statement with a caret under the error.
    return psycopg.errors.UndefinedTable(
        'relation "nope" does not exist\nLINE 1: SELECT * FROM nope\n                      ^'
    )


def _wrapped_by_sqlalchemy() -> str:
    """A failed query run through a session: the driver's error, then SQLAlchemy's around it
    (its statement, its parameters and its documentation link after the server's message)."""
    try:
        try:
            raise _undefined_table()
        except psycopg.Error as orig:
            raise ProgrammingError("SELECT * FROM nope", {"id": 1}, orig) from orig
    except ProgrammingError as exc:
        return "".join(traceback.format_exception(exc))


def test_error_summary_is_the_line_naming_the_error() -> None:
    undefined = 'relation "nope" does not exist'
    driver = _recorded(_undefined_table())
    assert driver.rstrip().endswith("^")
    assert error_summary(driver) == f"psycopg.errors.UndefinedTable: {undefined}"
    wrapped = _wrapped_by_sqlalchemy()
    assert "[SQL: SELECT * FROM nope]" in wrapped and "sqlalche.me" in wrapped
    assert error_summary(wrapped) == (
        f"sqlalchemy.exc.ProgrammingError: (psycopg.errors.UndefinedTable) {undefined}"
    )
    # Recorded without a traceback (as pgqueue's own errors about a job are), named alike.
    without_frames = wrapped[wrapped.rindex("sqlalchemy.exc.ProgrammingError") :]
    assert error_summary(without_frames) == error_summary(wrapped)
    assert error_summary(f"psycopg.errors.UndefinedTable: {_undefined_table()}") == (
        f"psycopg.errors.UndefinedTable: {undefined}"
    )
    assert error_summary(_recorded(OperationalError("SELECT 1", {}, Exception("closed")))) == (
        "sqlalchemy.exc.OperationalError: (builtins.Exception) closed"
    )
    assert error_summary(_recorded(ValueError("first line\nsecond line"))) == (
        "ValueError: first line"
    )
    assert error_summary("Retry: rate limited\nmore") == "Retry: rate limited"
    assert error_summary("\n\n   \n  lease expired (worker lost)\n") == (
        "lease expired (worker lost)"
    )
    group = _recorded(ExceptionGroup("two failed", [ValueError("a"), KeyError("b")]))
    assert error_summary(group) == "ExceptionGroup: two failed (2 sub-exceptions)"
    # Cut to fit its column, a traceback keeps its head and its end (the error), resuming
    # inside a line, maybe past its last exception's header.
    marker = "\n... [traceback truncated] ...\n"
    assert marker in storable_text(wrapped, 256)
    resume = wrapped.rindex('File "') + len('File "')
    cut = wrapped[:120] + marker + wrapped[resume:]
    assert cut.count("Traceback (most recent call last)") == 1
    assert error_summary(cut) == error_summary(wrapped)
    long = error_summary(_recorded(ValueError("bad value " + "x" * 300)))
    assert long == ("ValueError: bad value " + "x" * 300)[:199] + "…"
    assert len(error_summary("ValueError: " + "x" * 300, limit=90)) == 90
    assert error_summary("") == error_summary(None) == error_summary("\n \n") == ""


@pytest.mark.parametrize(
    "text",
    ["[]", "{}", "[ ]", "{ }", '{"n":1}', '[1,"a",null,true,1.5]', '"x"', "null", '{"é":"ü"}'],
)
def test_load_json_reads_what_json_loads_reads(text: str) -> None:
    for data in (text.encode(), text):
        loaded = codec.load_json(data)
        assert loaded == json.loads(text)
        assert type(loaded) is type(json.loads(text))


def test_load_json_refuses_what_json_loads_refuses() -> None:
    for bad in (b"[", b"{]", b"", "[1,]"):
        with pytest.raises(json.JSONDecodeError):
            codec.load_json(bad)


def test_checked_argument_shapes_do_not_let_other_shapes_through() -> None:
    # Shapes decided by the compiled rules, twice: none of the refused ones gets through.
    def handler(a: int, b: int = 1) -> None:
        """Two parameters, one optional."""

    task = Task(handler, sink=None, name="shapes")  # type: ignore[arg-type]
    for _ in range(2):  # the second round answers from the remembered shapes
        task.check_arguments([1], {})
        task.check_arguments([], {"a": 1, "b": 2})
    for args, kwargs in (
        ([1, 2, 3], {}),
        ([], {}),
        ([1], {"a": 2}),
        ([], {"a": 1, "c": 2}),
        ([], {"b": 2}),
    ):
        with pytest.raises(ValidationError):
            task.check_arguments(args, kwargs)
        with pytest.raises(ValidationError):  # and not remembered as good
            task.check_arguments(args, kwargs)


def test_copy_text_escapes_what_copys_text_format_would_read_as_syntax() -> None:
    from pgqueue.data.copy_rows import copy_text as _copy_text

    assert _copy_text('{"a":"plain"}') == '{"a":"plain"}'
    # One pass: the backslashes the escapes add are not escaped again; \N stays text, not NULL.
    assert _copy_text("a\tb\nc\rd\\e\\N") == "a\\tb\\nc\\rd\\\\e\\\\N"
    assert _copy_text(json.dumps(["tab\t", "\\"])) == '["tab\\\\t", "\\\\\\\\"]'


def test_state_check_allows_exactly_the_job_states() -> None:
    from pgqueue.models import STATE_CHECK

    listed = STATE_CHECK.split("'{", 1)[1].split("}'", 1)[0].split(",")
    assert sorted(listed) == sorted(s.value for s in JobState)


def test_a_named_connection_failure_is_one_line_and_classified_as_before() -> None:
    import psycopg.errors

    refused = psycopg.errors.CannotConnectNow(
        "connection failed: the database system is starting up\n\tHINT: wait"
    )
    wrapped = OperationalError(None, None, refused)
    assert connection_failure(wrapped) is None  # not named yet: nothing to say
    name_connection_failure(refused, None, "db.example:5432/app")
    named = "pgqueue connection to db.example:5432/app failed: "
    assert connection_failure(wrapped) == named + "the database system is starting up; HINT: wait"
    assert type(refused) is psycopg.errors.CannotConnectNow
    assert sqlstate_of(wrapped) == "57P03" and is_connection_error(wrapped)
    # The listener's connection is opened by the engine: renamed, same server, same reason.
    name_connection_failure(refused, "listener")
    assert connection_failure(wrapped) == (
        "pgqueue listener connection to db.example:5432/app failed: "
        "the database system is starting up; HINT: wait"
    )


@pytest.mark.parametrize(
    ("directory", "database"),
    [
        ("/home/ana/Orders-App", "orders_app"),
        ("/srv/shop.v2", "shop_v2"),
        ("/srv/postgres", "app_postgres"),
        ("/", "app"),
        ("/srv/" + "x" * 80, "x" * 63),
    ],
)
def test_the_embedded_database_is_named_after_the_directory(directory: str, database: str) -> None:
    assert embedded_database_name(Settings(), Path(directory)) == database
    named = Settings(embedded_database="mine")
    assert embedded_database_name(named, Path(directory)) == "mine"


@pytest.mark.parametrize("name", ["", "postgres", "template1", "x" * 64])
def test_an_embedded_database_name_that_cannot_be_an_apps_own_is_refused(name: str) -> None:
    with pytest.raises(ConfigurationError, match="embedded_database"):
        Settings(embedded_database=name)
