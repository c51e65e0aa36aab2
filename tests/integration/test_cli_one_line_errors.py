"""Both CLIs (``pgqueue ...`` and ``flask pgqueue ...``) against what a user gets wrong: an
unmigrated or too-old schema, a stopped server, a wrong password, a malformed URL, an APP that
is not a ``PgQueue``. Each prints at most two lines naming the problem and its fix, exits 2,
and shows no traceback unless ``--debug`` asks for it. Real servers; a schema failure (an
unmigrated database) and a connection failure (a stopped server) in a real process of each CLI,
and every command for each failure in-process as a fresh process runs it (``cli_invoke``)."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import textwrap
from collections.abc import Set
from pathlib import Path

import click
import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.engine import URL
from support.cli_invoke import invoke

from pgqueue import PgQueue, migrations
from pgqueue import cli as core_cli
from pgqueue.contrib.flask import cli as flask_cli
from pgqueue.errors import SchemaNotCurrent

# Every command of both CLIs with the arguments it needs. APP is a module written into the
# test's directory (``app_module``); ``enqueue``, ``worker`` and ``schedules`` import it.
# ``test_every_command_is_checked`` fails for a command missing here: a new command gets its
# invocations here, and so is checked against each failure below.
INVOCATIONS: dict[str, list[list[str]]] = {
    "migrate": [["migrate"], ["migrate", "current"]],
    "stats": [["stats"], ["stats", "--json"]],
    "workers": [["workers"], ["workers", "--json"]],
    "jobs": [["jobs"], ["jobs", "--json", "--state", "failed"]],
    "show": [["show", "1"]],
    "explain": [["explain", "1"], ["explain", "1", "--json"]],
    "workflow": [["workflow", "1"], ["workflow", "1", "--json"]],
    "retry": [["retry", "1"]],
    "cancel": [["cancel", "1"]],
    "prune": [["prune"]],
    "history": [["history", "maintain"]],
    "pause": [["pause", "q"]],
    "resume": [["resume", "q"]],
    "limit": [["limit", "q", "3"]],
    "max-depth": [["max-depth", "q", "3"]],
    "key-limit": [["key-limit"], ["key-limit", "account:", "2"]],
    "rate-limit": [["rate-limit", "--json"], ["rate-limit", "--key", "t:", "5", "--per", "1"]],
    "enqueue": [["enqueue", "shop:pgq", "shop.noop"]],
    "worker": [["worker", "shop:pgq", "--drain"]],
    "schedules": [["schedules", "shop:pgq"]],
    # It checks the database and its schema before it serves (a bad one ends the command).
    "dashboard": [["dashboard", "shop:pgq", "--bind", "127.0.0.1:0"], ["dashboard"]],
    "demo": [["demo", "--jobs", "1"]],
    "bulk": [
        ["bulk", "retry", "--state", "failed", "--dry-run"],
        ["bulk", "delete", "--queue", "q", "--yes", "--json"],
        ["bulk", "cancel", "--all-jobs", "--yes"],
    ],
}
# Commands that never open a connection (they read the app's code only).
NO_DATABASE = {"schedules"}
# Commands that create pgqueue's tables (``demo`` in a database of its own): an unmigrated
# database is what they fix, not an error.
CREATE_THE_SCHEMA = {"migrate", "demo"}


def _commands(cli: str, *, skip: set[str]) -> list[list[str]]:
    group = core_cli.main if cli == "pgqueue" else flask_cli.pgqueue_group
    return [
        invocation if cli == "pgqueue" else [a for a in invocation if a != "shop:pgq"]
        for name in sorted(group.commands)
        if name not in skip
        for invocation in INVOCATIONS[name]
    ]


SHOP = """
import os

from flask import Flask

from pgqueue import PgQueue
from pgqueue.contrib.flask import PgQueue as FlaskPgQueue

pgq = PgQueue(os.environ["SHOP_URL"])
flask_pgq = FlaskPgQueue()


@pgq.task(name="shop.noop")
def noop():
    return None


@flask_pgq.task(name="shop.noop")
def flask_noop():
    return None


@pgq.task(name="shop.fail")
def fail():
    raise ValueError("boom")


@flask_pgq.task(name="shop.fail")
def flask_fail():
    raise ValueError("boom")


@pgq.task(name="shop.send_receipt")
def send_receipt(*args, **kwargs):
    open(os.environ["CALLED_MARKER"], "w").close()


def make_queue():
    open(os.environ["CALLED_MARKER"], "w").close()
    return pgq


class Order:
    def __init__(self):
        open(os.environ["CALLED_MARKER"], "w").close()


app = Flask("shop")
app.config["PGQUEUE_DATABASE_URL"] = os.environ["SHOP_URL"]
flask_pgq.init_app(app)
"""


@pytest.fixture
def shop(tmp_path: Path) -> Path:
    (tmp_path / "shop.py").write_text(textwrap.dedent(SHOP))
    return tmp_path


def _environment(cwd: Path, url: URL | str) -> dict[str, str]:
    """The environment of a command run in ``cwd`` on ``url``: this one's, but pgqueue's and
    Flask's settings, with ``url`` as the database and ``cwd`` on the path."""
    rendered = url if isinstance(url, str) else url.render_as_string(hide_password=False)
    # No COLUMNS: output goes to a pipe, as in a script.
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("PGQUEUE_", "FLASK_")) and k != "COLUMNS"
    }
    env.update(
        PGQUEUE_DATABASE_URL=rendered,
        SHOP_URL=rendered,
        CALLED_MARKER=str(cwd / "called"),
        PYTHONPATH=os.pathsep.join(p for p in (str(cwd), env.get("PYTHONPATH", "")) if p),
        PGCONNECT_TIMEOUT="5",
    )
    return env


def _run(argv: list[str], cwd: Path, url: URL | str) -> subprocess.CompletedProcess[str]:
    """``python ARGV`` as a real process."""
    return subprocess.run(
        [sys.executable, *argv],
        cwd=cwd,
        env=_environment(cwd, url),
        capture_output=True,
        text=True,
        timeout=120,
    )


def _invoke(argv: list[str], cwd: Path, url: URL | str) -> subprocess.CompletedProcess[str]:
    """``python ARGV`` run in this process as a fresh process runs it."""
    return invoke(argv, cwd=cwd, env=_environment(cwd, url))


def pgqueue(args: list[str], cwd: Path, url: URL | str) -> subprocess.CompletedProcess[str]:
    return _invoke(["-m", "pgqueue", *args], cwd, url)


def flask(args: list[str], cwd: Path, url: URL | str) -> subprocess.CompletedProcess[str]:
    return _invoke(["-m", "flask", "--app", "shop:app", "pgqueue", *args], cwd, url)


def pgqueue_process(args: list[str], cwd: Path, url: URL | str) -> subprocess.CompletedProcess[str]:
    return _run(["-m", "pgqueue", *args], cwd, url)


def flask_process(args: list[str], cwd: Path, url: URL | str) -> subprocess.CompletedProcess[str]:
    return _run(["-m", "flask", "--app", "shop:app", "pgqueue", *args], cwd, url)


def _assert_one_line(result: subprocess.CompletedProcess[str], *expected: str) -> str:
    output = (result.stdout + result.stderr).strip().splitlines()
    assert result.returncode == 2, (result.args, result.stdout, result.stderr)
    assert len(output) <= 2, (result.args, result.stdout, result.stderr)
    assert "Traceback" not in result.stderr, result.stderr
    error = next(line for line in output if line.startswith("error: "))
    for part in expected:
        assert part in error, (result.args, error)
    return error


def _both_clis(
    shop: Path,
    url: URL | str,
    *expected: str,
    skip: Set[str] = frozenset(),
    in_a_process: bool = False,
) -> None:
    """Every database command of both CLIs but those in ``skip``, each failing with one line
    holding ``expected``, in-process; ``in_a_process``: ``stats`` in a real process of each CLI
    too (for one failure of each kind: a real process adds its start-up and exit, the same for
    every failure of a kind)."""
    skip = NO_DATABASE | skip
    for cli, run, process in (
        ("pgqueue", pgqueue, pgqueue_process),
        ("flask", flask, flask_process),
    ):
        if in_a_process:
            _assert_one_line(process(["stats"], shop, url), *expected)
        for command in _commands(cli, skip=skip):
            _assert_one_line(run(command, shop, url), *expected)


def test_every_command_is_checked() -> None:
    for group in (core_cli.main, flask_cli.pgqueue_group):
        unchecked = sorted(set(group.commands) - set(INVOCATIONS))
        assert not unchecked, f"{group.name}: add the invocations of {unchecked} to INVOCATIONS"


@pytest.mark.slow
def test_unmigrated_database(shop: Path, empty_database_url: URL) -> None:
    name = str(empty_database_url.database)
    _both_clis(
        shop,
        empty_database_url,
        f"pgqueue's tables are missing in database {name}",
        "pgqueue migrate`",  # `flask pgqueue migrate` in the Flask CLI
        skip=CREATE_THE_SCHEMA,
        in_a_process=True,
    )


def test_debug_shows_the_traceback(shop: Path, empty_database_url: URL) -> None:
    for result in (
        pgqueue_process(["--debug", "stats"], shop, empty_database_url),
        flask_process(["--debug", "stats"], shop, empty_database_url),
    ):
        assert result.returncode != 0
        assert "Traceback" in result.stderr
        assert "SchemaNotCurrent" in result.stderr


def _a_queued_job(url: URL) -> None:
    engine = create_engine(url)
    with engine.begin() as connection:
        connection.execute(
            text("INSERT INTO pgqueue_jobs (task_name, queue) VALUES ('shop.noop', 'q')")
        )
    engine.dispose()


def _jobs_untouched(url: URL) -> None:
    engine = create_engine(url)
    with engine.connect() as connection:
        rows = connection.execute(text("SELECT state, queue FROM pgqueue_jobs")).all()
    engine.dispose()
    assert [tuple(row) for row in rows] == [("queued", "q")]


@pytest.mark.slow
def test_every_command_refuses_a_schema_older_than_its_head(
    shop: Path, empty_database_url: URL
) -> None:
    head = migrations.head()
    engine = create_engine(empty_database_url)
    with engine.begin() as connection:
        migrations.upgrade(connection, "pgqueue_0005")
    engine.dispose()
    _a_queued_job(empty_database_url)
    _both_clis(
        shop,
        empty_database_url,
        "is at pgqueue_0005",
        f"needs {head}",
        "pgqueue migrate",
        skip=CREATE_THE_SCHEMA,
    )
    _jobs_untouched(empty_database_url)


@pytest.mark.slow
def test_every_command_refuses_a_schema_newer_than_it_knows(
    shop: Path, empty_database_url: URL
) -> None:
    engine = create_engine(empty_database_url)
    with engine.begin() as connection:
        migrations.upgrade(connection)
        connection.execute(
            text(f"UPDATE {migrations.VERSION_TABLE} SET version_num = 'pgqueue_9999_later'")
        )
    engine.dispose()
    _a_queued_job(empty_database_url)
    _both_clis(
        shop,
        empty_database_url,
        "is at pgqueue_9999_later, newer than this pgqueue knows",
        "upgrade pgqueue",
        skip=CREATE_THE_SCHEMA,
    )
    _jobs_untouched(empty_database_url)


@pytest.mark.slow
def test_stopped_server(shop: Path) -> None:
    with socket.socket() as probe:  # a free port: nothing listens there once closed
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    url = f"postgresql+psycopg://postgres:x@127.0.0.1:{port}/shop"
    # The worker too: it waits for its database only when told to (--wait-for-database).
    _both_clis(shop, url, f'"127.0.0.1", port {port} failed: Connection refused', in_a_process=True)
    # A worker names the connection that failed and its database.
    for result in (
        pgqueue(["worker", "shop:pgq"], shop, url),
        flask(["worker"], shop, url),
    ):
        _assert_one_line(result, f"pgqueue connection to 127.0.0.1:{port}/shop failed")


@pytest.mark.slow
def test_wrong_password(shop: Path, server_tcp_url: URL, database_url: URL) -> None:
    if not server_tcp_url.password:
        pytest.skip("the test server takes no password")
    url = server_tcp_url.set(database=database_url.database, password="not-the-password")
    _both_clis(shop, url, "password authentication failed")


def test_malformed_url(shop: Path) -> None:
    url = "postgresql://host:port-is-not-a-number/db"
    _assert_one_line(pgqueue_process(["stats"], shop, url))
    for command in _commands("pgqueue", skip=NO_DATABASE):
        _assert_one_line(pgqueue(command, shop, url))


@pytest.mark.parametrize("target", ["shop:send_receipt", "shop:make_queue", "shop:Order"])
def test_a_target_that_is_not_a_queue_is_never_called(
    shop: Path, database_url: URL, target: str
) -> None:
    for command in (["worker", target, "--drain"], ["enqueue", target, "shop.noop"]):
        error = _assert_one_line(pgqueue(command, shop, database_url), "not a PgQueue")
        assert target in error and "name the PgQueue object" in error
        assert not (shop / "called").exists(), f"{target} was called"


def test_the_flask_extension_given_to_the_plain_cli_is_told_to_use_flask(
    shop: Path, database_url: URL
) -> None:
    for command in (["worker", "shop:flask_pgq", "--drain"], ["enqueue", "shop:flask_pgq", "t"]):
        error = _assert_one_line(pgqueue(command, shop, database_url), "is the Flask extension")
        assert "`flask --app shop pgqueue ...`" in error, error
        assert "not a PgQueue" not in error


def _enqueue(
    url: URL, *queues: str, task: str = "shop.noop", max_attempts: int | None = None
) -> list[int]:
    pgq = PgQueue(url)
    noop = pgq.task(name=task)(lambda: None)
    ids = [noop.configure(queue=queue, max_attempts=max_attempts).enqueue() for queue in queues]
    pgq.dispose()
    return ids


@pytest.mark.slow
def test_flask_worker_logs_like_the_core_worker(shop: Path, database_url: URL) -> None:
    _enqueue(database_url, "default", "default", task="shop.fail", max_attempts=1)
    # Real processes: a worker's log lines are the logging each CLI sets up in its process.
    core = pgqueue_process(["worker", "shop:pgq", "--drain"], shop, database_url)
    _enqueue(database_url, "default", "default", task="shop.fail", max_attempts=1)
    hosted = flask_process(["worker", "--drain"], shop, database_url)
    for result in (core, hosted):
        assert result.returncode == 0, result.stderr
        assert " started: queues=*" in result.stderr, result.stderr
        assert " stopped: " in result.stderr, result.stderr

    def lines(stderr: str) -> list[str]:
        # Without the time, and with numbers (ids, durations, the worker's pid) made alike.
        return [
            re.sub(r"\d+(\.\d+)?", "N", re.sub(r":[0-9a-f]{8}\b", ":H", line.split(" ", 2)[2]))
            for line in stderr.strip().splitlines()
        ]

    core_lines, hosted_lines = lines(core.stderr), lines(hosted.stderr)
    assert core_lines == hosted_lines, (core.stderr, hosted.stderr)
    assert core_lines[0].startswith("INFO pgqueue.worker: worker "), core_lines
    assert " started: queues=* concurrency=N pool=thread listen=True" in core_lines[0], core_lines
    assert core_lines[0].endswith(
        "; successes are counted in one line every Ns (PGQUEUE_LOG_SUCCESSES=true logs each)"
    ), core_lines
    job_lines = [line for line in core_lines if "task=shop.fail" in line]
    assert len(job_lines) == 2, core_lines
    assert all(
        line.startswith("INFO pgqueue.worker: job N task=shop.fail attempt=N outcome=fail ")
        and line.endswith(" error=ValueError: boom")
        for line in job_lines
    ), job_lines
    assert " stopped: claimed N, succeeded N, retried N," in core_lines[-1], core_lines


def test_json_output_and_parity(shop: Path, database_url: URL) -> None:
    ids = _enqueue(database_url, "a", "a", "b")
    engine = create_engine(database_url)
    with engine.begin() as connection:  # a registered worker, as a running one writes it
        connection.execute(
            text(
                "INSERT INTO pgqueue_workers (id, host, pid, queues, concurrency, version) "
                "VALUES ('h:7:ab', 'h', 7, '{a,b}', 4, '0.1.0')"
            )
        )
    engine.dispose()
    for cli in (pgqueue, flask):
        app = ["shop:pgq"] if cli is pgqueue else []
        listed = cli(["jobs", "--json", "--queue", "a"], shop, database_url)
        assert listed.returncode == 0, listed.stderr
        page = json.loads(listed.stdout)
        assert [job["id"] for job in page["jobs"]] == [ids[1], ids[0]]
        assert page["jobs"][0]["state"] == "queued"
        assert page["jobs"][0]["task_name"] == "shop.noop"
        stats = json.loads(cli(["stats", "--json"], shop, database_url).stdout)
        assert stats["a"]["queued"] == 2 and stats["b"]["queued"] == 1
        shown = json.loads(cli(["show", str(ids[2]), "--json"], shop, database_url).stdout)
        assert shown["queue"] == "b" and shown["id"] == ids[2]
        for command in (["pause", "b"], ["limit", "b", "2"], ["resume", "b"]):
            done = cli(command, shop, database_url)
            assert done.returncode == 0, done.stderr
        [registered] = json.loads(cli(["workers", "--json"], shop, database_url).stdout)
        assert (registered["id"], registered["queues"], registered["running"]) == (
            "h:7:ab",
            ["a", "b"],
            0,
        )
        scheduled = cli(["schedules", *app], shop, database_url)
        assert scheduled.returncode == 0, scheduled.stderr


@pytest.mark.slow
def test_tables_are_full_width_when_not_a_terminal(shop: Path, database_url: URL) -> None:
    long_queue, long_task = "q" * 63, "t" * 63  # a row far wider than 80 columns
    _enqueue(database_url, long_queue, task=long_task)
    # A real process of each CLI: what is not a terminal is the process's standard output, a
    # pipe. The other table in-process (its standard output is no terminal either): every
    # table is printed on the same console.
    for cli, command in (
        (pgqueue_process, ["jobs"]),
        (flask_process, ["jobs"]),
        (pgqueue, ["stats"]),
        (flask, ["stats"]),
    ):
        result = cli(command, shop, database_url)
        assert result.returncode == 0, result.stderr
        assert long_queue in result.stdout, result.stdout
        if command == ["jobs"]:
            assert long_task in result.stdout, result.stdout


def test_schema_check_reads_a_hosts_alembic_version(database_url: URL) -> None:
    """pgqueue's revisions run by the host's own Alembic are recorded in its ``alembic_version``
    (beside the host's own head): a worker starts on that as on ``pgqueue_alembic_version``."""
    engine = create_engine(database_url)
    try:
        with engine.begin() as connection:
            migrations.check_schema(connection)
            connection.execute(text("DROP TABLE pgqueue_alembic_version"))
            with pytest.raises(SchemaNotCurrent, match="tables are missing"):
                migrations.check_schema(connection)
            connection.execute(text("CREATE TABLE alembic_version (version_num varchar(32))"))
            connection.execute(
                text("INSERT INTO alembic_version VALUES ('host_0007'), (:head)"),
                {"head": migrations.head()},
            )
            migrations.check_schema(connection)
            connection.execute(
                text(
                    "UPDATE alembic_version SET version_num = 'pgqueue_0003' "
                    "WHERE version_num LIKE 'pgqueue%'"
                )
            )
            with pytest.raises(SchemaNotCurrent, match="is at pgqueue_0003"):
                migrations.check_schema(connection)
    finally:
        engine.dispose()


# Every command of both CLIs (groups and their commands, by path) with bad inputs, each with
# the words its one error line must hold in both CLIs. APP (``shop:pgq``) is dropped for the
# Flask CLI. ``test_every_command_has_bad_inputs`` fails for a command missing here.
BAD_INPUTS: dict[str, list[tuple[list[str], str]]] = {
    "": [
        (["nosuch"], "no such command 'nosuch'"),
        (["--bogus", "stats"], "no such option '--bogus'"),
    ],
    "migrate": [
        (["migrate", "sideways"], "'sideways' is not one of 'upgrade', 'downgrade', 'current'"),
        (["migrate", "downgrade"], "migrate downgrade needs a REVISION"),
        (["migrate", "current", "pgqueue_0001"], "migrate current takes no REVISION"),
        (["migrate", "upgrade", "--yess"], "no such option '--yess'"),
    ],
    "worker": [
        (["worker", "shop:pgq", "--concurrency", "0"], "0 is not in the range 1<=x<=1000"),
        (["worker", "shop:pgq", "--processes", "two"], "'two' is not a valid integer"),
        (["worker", "shop:pgq", "--processes", "10000"], "10000 is not in the range 1<=x<=256"),
        (["worker", "shop:pgq", "--queues", ""], "--queues must name at least one queue"),
        (["worker", "shop:pgq", "--poll-interval", "1e12"], "poll_interval must be at most"),
    ],
    "workers": [(["workers", "--al"], "no such option '--al'")],
    "jobs": [
        (["jobs", "--state", "faild"], "'faild' is not one of 'queued'"),
        (["jobs", "--limit", "0"], "0 is not in the range 1<=x<=1000"),
        (["jobs", "--before", "yesterday"], "'yesterday' is not a valid integer"),
    ],
    "stats": [(["stats", "all"], "unexpected extra argument (all)")],
    "show": [
        (["show", "abc"], "'abc' is not a valid integer"),
        (["show"], "missing argument 'JOB_ID'"),
        (["show", "-12"], "a negative number is read as an option; no argument here takes one"),
    ],
    "explain": [(["explain", "abc"], "'abc' is not a valid integer")],
    "workflow": [
        (["workflow", "abc"], "'abc' is not a valid integer"),
        (["workflow", "99"], "no workflow with id 99"),
        (["workflow", "0"], "workflow id must be a positive int, got 0"),
    ],
    "retry": [(["retry", "abc"], "'abc' is not a valid integer")],
    "cancel": [(["cancel", "1", "2"], "unexpected extra argument (2)")],
    "enqueue": [
        (["enqueue", "shop:pgq", "shop.noop", "--priority", "high"], "'high' is not a valid"),
        (["enqueue", "shop:pgq"], "missing argument 'TASK_NAME'"),
    ],
    "prune": [(["prune", "now"], "unexpected extra argument (now)")],
    "history": [(["history", "prune"], "no such command 'prune'")],
    "history maintain": [
        (["history", "maintain", "--days-ahead", "0"], "0 is not in the range x>=1"),
        (["history", "maintain", "--days-ahead", "5000"], "days_ahead must be at most 366"),
    ],
    "dashboard": [
        (["dashboard", "--bind", "300.1.1.1:99999"], "expected HOST:PORT"),
        (["dashboard", "--no-auth", "--bind", "0.0.0.0:8321"], "without authentication"),
    ],
    "schedules": [(["schedules", "shop:pgq", "all"], "unexpected extra argument (all)")],
    "schedules list": [(["schedules", "list", "shop:pgq", "x"], "unexpected extra argument (x)")],
    "schedules pause": [(["schedules", "pause", "nosuch"], "no schedule named 'nosuch'")],
    "schedules resume": [(["schedules", "resume"], "missing argument 'NAME'")],
    "schedules run": [(["schedules", "run", "shop:pgq", "nosuch"], "no schedule named 'nosuch'")],
    "pause": [
        (["pause", "nosuchqueue"], "queue 'nosuchqueue' has no jobs and no settings"),
        (["pause"], "missing argument 'QUEUE'"),
    ],
    "resume": [(["resume", "nosuchqueue"], "queue 'nosuchqueue' has no jobs and no settings")],
    "limit": [
        (["limit", "nosuchqueue", "3"], "queue 'nosuchqueue' has no jobs and no settings"),
        (["limit", "default", "lots"], "'lots' is not a whole number or 'none'"),
        (["limit", "default", "2147483648"], "queue limit must be at most 2147483647"),
        (["limit", "q", "-3"], "limit: a negative number is read as an option"),
    ],
    "max-depth": [(["max-depth", "default", "deep"], "'deep' is not a whole number")],
    "key-limit": [
        (["key-limit", "account:", "0"], "key limit must be a whole number of at least 1"),
        (["key-limit", "--jsn"], "no such option: --jsn"),
    ],
    "rate-limit": [
        (["rate-limit", "nosuchq", "3", "--per", "1"], "queue 'nosuchq' has no jobs and no"),
        (["rate-limit", "default", "3"], "a rate limit needs --per SECONDS"),
    ],
    "demo": [(["demo", "--jobs", "0"], "0 is not in the range x>=1")],
    "bulk": [(["bulk", "requeue"], "no such command 'requeue'")],
    "bulk retry": [(["bulk", "retry", "--state", "faild", "--dry-run"], "unknown state 'faild'")],
    "bulk cancel": [(["bulk", "cancel", "--since", "soon", "--dry-run"], "--since")],
    "bulk delete": [(["bulk", "delete", "--dry-rn"], "no such option '--dry-rn'")],
}


def _command_paths(group: click.Group, prefix: str = "") -> list[str]:
    """The group's path and every command's below it (``history maintain``), by name."""
    paths = [prefix]
    for name, command in group.commands.items():
        path = f"{prefix} {name}".strip()
        paths.extend(_command_paths(command, path) if isinstance(command, click.Group) else [path])
    return paths


GROUPS = {"pgqueue": core_cli.main, "flask": flask_cli.pgqueue_group}


def test_every_command_has_bad_inputs() -> None:
    for cli, group in GROUPS.items():
        missing = sorted(set(_command_paths(group)) - set(BAD_INPUTS))
        assert not missing, f"{cli}: add the bad inputs of {missing} to BAD_INPUTS"


@pytest.mark.parametrize("cli", sorted(GROUPS))
def test_every_command_given_bad_input_prints_one_line(
    shop: Path, database_url: URL, cli: str
) -> None:
    _enqueue(database_url, "default")  # a queue that is known, beside the mistyped ones
    run = pgqueue if cli == "pgqueue" else flask
    cases = [
        ([a for a in argv if cli == "pgqueue" or a != "shop:pgq"], problem)
        for path in _command_paths(GROUPS[cli])
        for argv, problem in BAD_INPUTS[path]
    ]
    results = [run(argv, shop, database_url) for argv, _ in cases]
    failures = []
    for (argv, problem), result in zip(cases, results, strict=True):
        lines = [line for line in (result.stdout + result.stderr).splitlines() if line.strip()]
        if not (
            result.returncode == 2
            and len(lines) == 1
            and "Traceback" not in result.stderr
            and lines[0].startswith("error: ")
            and problem in lines[0]
        ):
            failures.append((argv, result.returncode, problem, lines[:6]))
    assert not failures, "\n".join(map(repr, failures))
