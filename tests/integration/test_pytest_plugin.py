"""pgqueue's pytest plugin as a host application uses it: host test suites run by pytest
(``pytester``), where the plugin loads through its entry point (in a new interpreter where its
loading by itself is the point, else in a new pytest session in this process), and the Flask
example's own tests."""

from __future__ import annotations

from pathlib import Path

import pytest
from server_databases import run_example_tests
from sqlalchemy import create_engine, text
from sqlalchemy.engine import URL
from sqlalchemy.exc import OperationalError

from pgqueue.testing import TestDatabases

pytest_plugins = ["pytester"]

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "flask_app"


def prepare_fixture(table: str) -> str:
    """A host conftest's ``pgqueue_prepare_database``, creating ``table`` (its definition)."""
    return f"""
def prepare(url):
    engine = create_engine(url)
    with engine.begin() as connection:
        connection.execute(text("CREATE TABLE {table}"))
    engine.dispose()


@pytest.fixture(scope="session")
def pgqueue_prepare_database():
    return prepare
"""


HOST_CONFTEST = (
    """
import pytest
from sqlalchemy import create_engine, text

from pgqueue import JobContext, PgQueue

"""
    + prepare_fixture("greetings (name text PRIMARY KEY)")
    + """

def register(pgq):
    @pgq.task(name="greet", pass_context=True)
    def greet(ctx: JobContext, name: str, punctuation: str = "!") -> str:
        ctx.session.execute(text("INSERT INTO greetings VALUES (:n)"), {"n": name})
        return f"hello {name}{punctuation}"

    @pgq.task(name="fail", max_attempts=1)
    def fail(reason: str) -> None:
        raise RuntimeError(reason)

    return greet, fail


@pytest.fixture
def pgqueue_queue(pgqueue_database_url):
    pgq = PgQueue(pgqueue_database_url)
    pgq.tasks = register(pgq)
    yield pgq
    pgq.dispose()


@pytest.fixture
def pgq():
    return "the host's own fixture named pgq"
"""
)

HOST_TESTS = """
import os

from sqlalchemy import create_engine, text

from pgqueue import JobState
from pgqueue.testing import assert_enqueued, assert_not_enqueued


def greetings(url):
    engine = create_engine(url)
    with engine.connect() as connection:
        names = [row[0] for row in connection.execute(text("SELECT name FROM greetings"))]
    engine.dispose()
    return names


def test_a_fresh_migrated_database_with_the_hosts_tables(pgqueue_database_url, pgq):
    assert pgq == "the host's own fixture named pgq"
    assert os.environ["PGQUEUE_DATABASE_URL"] == pgqueue_database_url
    assert greetings(pgqueue_database_url) == []


def test_assert_enqueued_matches_by_meaning(pgqueue_queue):
    greet, fail = pgqueue_queue.tasks
    greet.enqueue("ada")
    assert_enqueued(greet, name="ada")
    assert_enqueued(greet, "ada", "!")
    assert_not_enqueued(greet, name="bob")
    assert_not_enqueued(fail)


def test_a_missing_job_fails_with_what_was_enqueued(pgqueue_queue):
    greet, fail = pgqueue_queue.tasks
    greet.enqueue("ada")
    fail.configure(queue="other").enqueue(reason="boom")
    assert_enqueued(greet, name="bob")


def test_run_jobs_returns_what_ran(pgqueue_queue, pgqueue_run_jobs, pgqueue_database_url):
    greet, fail = pgqueue_queue.tasks
    ok = greet.enqueue("ada", punctuation="?")
    bad = fail.enqueue("boom")
    runs = pgqueue_run_jobs()
    assert [(r.job_id, r.task, r.state, r.result) for r in runs] == [
        (ok, "greet", JobState.SUCCEEDED, "hello ada?"),
        (bad, "fail", JobState.FAILED, None),
    ]
    assert "RuntimeError: boom" in runs[1].error
    assert greetings(pgqueue_database_url) == ["ada"]
    assert pgqueue_run_jobs() == []


def test_each_test_gets_its_own_database(pgqueue_database_url):
    assert greetings(pgqueue_database_url) == []


def test_immediate_mode(pgqueue_queue, pgqueue_immediate, pgqueue_database_url):
    greet, fail = pgqueue_queue.tasks
    with pgqueue_queue.sessions() as session:
        greet.configure(session=session).enqueue("rolled back")
        session.rollback()
        greet.configure(session=session).enqueue("committed")
        assert greetings(pgqueue_database_url) == []
        session.commit()
        assert greetings(pgqueue_database_url) == ["committed"]
    assert [r.args for r in pgqueue_immediate.runs] == [("committed",)]
"""


def database_names(server_url: URL) -> set[str]:
    engine = create_engine(server_url)
    try:
        with engine.connect() as connection:
            return set(connection.scalars(text("SELECT datname FROM pg_database")))
    finally:
        engine.dispose()


@pytest.fixture
def server_env(server_url: URL, monkeypatch: pytest.MonkeyPatch) -> str:
    """The subprocesses make their databases on this session's server."""
    url = server_url.render_as_string(hide_password=False)
    monkeypatch.setenv("PGQUEUE_TEST_DATABASE_URL", url)
    return url


@pytest.mark.slow
def test_a_host_suite_uses_the_plugins_fixtures_and_assertions(
    pytester: pytest.Pytester, server_env: str, server_url: URL
) -> None:
    pytester.makeconftest(HOST_CONFTEST)
    pytester.makepyfile(test_host=HOST_TESTS)
    before = database_names(server_url)
    # In this process: a new pytest session all the same, which loads the plugin through its
    # entry point (the suite below shows it loads in a new interpreter).
    result = pytester.runpytest_inprocess("-p", "no:cacheprovider", "-v")
    result.assert_outcomes(passed=5, failed=1)
    assert database_names(server_url) == before  # each test's copy and the template dropped
    result.stdout.fnmatch_lines(
        [
            "*test_a_missing_job_fails_with_what_was_enqueued FAILED*",
            "E*AssertionError: no job greet(name='bob') is enqueued; the 2 enqueued job(s):",
            "E*  #1 greet('ada') queued",
            "E*  #2 fail(reason='boom') queued",
        ]
    )
    # The failure points at the test's own line, with no frame of pgqueue's assertions.
    failure = result.stdout.str().split("test_a_missing_job_fails_with_what_was_enqueued _")[1]
    assert "pgqueue/testing" not in failure
    assert '>       assert_enqueued(greet, name="bob")' in failure


@pytest.mark.slow
def test_the_plugin_loads_by_itself_and_touches_no_database_unless_asked(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Nothing listens there: a suite that asks for none of the fixtures never notices.
    monkeypatch.setenv("PGQUEUE_TEST_DATABASE_URL", "postgresql+psycopg://nobody@127.0.0.1:9/none")
    pytester.makepyfile(
        test_plain="""
        import sys

        def test_plain():
            assert "pgqueue.testing.plugin" in sys.modules
        """
    )
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    result.assert_outcomes(passed=1)
    # The listing in this process: what it shows is the plugin's fixtures, loaded above.
    listing = pytester.runpytest_inprocess("-p", "no:cacheprovider", "--fixtures")
    listing.stdout.fnmatch_lines(["pgqueue_database_url*", "pgqueue_run_jobs*"])


@pytest.mark.slow
def test_the_flask_examples_own_tests_pass_on_the_plugin(server_env: str) -> None:
    assert "4 passed" in run_example_tests(EXAMPLE, server_env).stdout


def test_test_databases_start_an_embedded_server_of_their_own(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("PGQUEUE_TEST_DATABASE_URL", raising=False)
    prepared: list[str] = []
    databases = TestDatabases(prepare=prepared.append)
    try:
        first, second = databases.create(), databases.create()
        assert first != second
        assert len(prepared) == 1  # the template, once
        engine = create_engine(first)
        with engine.connect() as connection:
            assert connection.scalar(text("SELECT count(*) FROM pgqueue_jobs")) == 0
        engine.dispose()
        databases.drop(first)
        with pytest.raises(ValueError, match="is not a database these test databases made"):
            databases.drop(databases.server_url)
        server_url = databases.server_url
    finally:
        databases.close()
    engine = create_engine(server_url)
    with pytest.raises(OperationalError):
        engine.connect()
    engine.dispose()


IMPORT_BOUND_CONFTEST = (
    """
import os

import pytest
from sqlalchemy import create_engine, text

from pgqueue import PgQueue

# Bound when imported, as many services are: the plugin set the variable before this import.
URL = os.environ["APP_DATABASE_URL"]
app_queue = PgQueue(URL)


@app_queue.task(name="double")
def double(n: int) -> int:
    return 2 * n

"""
    + prepare_fixture("app_things (id int)")
    + """

@pytest.fixture
def pgqueue_queue():
    return app_queue
"""
)

IMPORT_BOUND_TESTS = """
from sqlalchemy import create_engine, text

from conftest import URL, double


def test_the_session_database_is_the_one_the_app_imported_with(
    pgqueue_session_database_url, pgqueue_run_jobs
):
    assert pgqueue_session_database_url == URL
    job_id = double.enqueue(21)
    assert [(r.job_id, r.result) for r in pgqueue_run_jobs()] == [(job_id, 42)]


def test_per_test_databases_still_get_the_prepared_tables(pgqueue_database_url):
    assert pgqueue_database_url != URL
    engine = create_engine(pgqueue_database_url)
    with engine.connect() as connection:
        assert connection.scalar(text("SELECT count(*) FROM app_things")) == 0
    engine.dispose()
"""


@pytest.mark.slow
def test_an_app_bound_at_import_gets_a_session_database_before_its_conftest_runs(
    pytester: pytest.Pytester, server_env: str, server_url: URL
) -> None:
    pytester.makeini("[pytest]\npgqueue_database_env = APP_DATABASE_URL\n")
    pytester.makeconftest(IMPORT_BOUND_CONFTEST)
    pytester.makepyfile(test_bound=IMPORT_BOUND_TESTS)
    before = database_names(server_url)
    # In this process: the new session imports this suite's conftest.py anew, after the
    # plugin's first hook, as a new interpreter would.
    result = pytester.runpytest_inprocess("-p", "no:cacheprovider")
    result.assert_outcomes(passed=2)
    assert database_names(server_url) == before
