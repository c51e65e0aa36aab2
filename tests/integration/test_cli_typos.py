"""Both CLIs given what a user mistypes or misreads: a revision that does not exist, a queue
that has no jobs, a name no job can have, a drain that leaves retries behind, a job's
tracebacks. A mistake prints one ``error:`` line and exits 2; what a command reports reads as
text. Real servers; each command in-process as a fresh process runs it (the helpers of
``test_cli_one_line_errors``)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.engine import URL
from test_cli_one_line_errors import _assert_one_line, _enqueue, _invoke, flask, pgqueue, shop

from pgqueue import PgQueue, migrations

__all__ = ["shop"]  # the fixture, used by name


APP = {pgqueue: ["shop:pgq"], flask: []}
# How a note under an empty listing ends for a queue name and for a task name no job has.
QUEUES = "pgqueue stats` lists the queues)"
TASKS = "(a task's name is as registered, module.function unless named)"


def _first_and_head() -> tuple[str, str]:
    return "pgqueue_0001", migrations.head()


def test_a_revision_that_does_not_exist(shop: Path, database_url: URL) -> None:
    first, head = _first_and_head()
    for cli in (pgqueue, flask):
        for action in ("upgrade", "downgrade"):
            error = _assert_one_line(
                cli(["migrate", action, "pgqueue_9999"], shop, database_url),
                "revision 'pgqueue_9999'",
                f"{first} to {head} (head)",
            )
            assert "nothing changed" in error
    current = pgqueue(["migrate", "current"], shop, database_url)
    assert current.stdout.strip() == f"{head} (head)", current.stdout


def test_the_library_raises_the_same_refusal(database_url: URL) -> None:
    from pgqueue.errors import UnknownRevision

    engine = create_engine(database_url)
    try:
        with engine.connect() as connection:
            for step in (migrations.upgrade, migrations.downgrade):
                try:
                    step(connection, "nosuch")
                except UnknownRevision as exc:
                    assert "revision 'nosuch'" in str(exc)
                else:
                    raise AssertionError(f"{step.__name__} took a revision that is not there")
                connection.rollback()
    finally:
        engine.dispose()


def test_a_queue_without_jobs_or_settings_is_refused(shop: Path, database_url: URL) -> None:
    _enqueue(database_url, "mail")
    for cli in (pgqueue, flask):
        for command in (
            ["pause", "nosuchqueue"],
            ["resume", "nosuchqueue"],
            ["limit", "nosuchqueue", "3"],
            ["max-depth", "nosuchqueue", "3"],
            ["rate-limit", "nosuchqueue", "3", "--per", "1"],
            ["rate-limit", "nosuchqueue", "none"],
        ):
            error = _assert_one_line(
                cli(command, shop, database_url), "queue 'nosuchqueue' has no jobs and no settings"
            )
            assert ("--new" in error) is (command[0] != "resume"), error
        # The queue that has jobs, and a queue set up on purpose before its first job.
        for command in (
            ["pause", "mail"],
            ["resume", "mail"],
            ["rate-limit", "mail", "3", "--per", "1"],
            ["pause", "later", "--new"],
            ["rate-limit", "sooner", "3", "--per", "1", "--new"],
        ):
            done = cli(command, shop, database_url)
            assert done.returncode == 0, done.stderr
        # Once it has settings, it is known.
        done = cli(["resume", "later"], shop, database_url)
        assert done.returncode == 0, done.stderr
    engine = create_engine(database_url)
    with engine.connect() as connection:
        names = connection.execute(text("SELECT name FROM pgqueue_queues")).scalars().all()
    engine.dispose()
    assert "nosuchqueue" not in names and {"later", "sooner"} <= set(names)


def test_listing_a_queue_or_task_no_job_has_says_so(shop: Path, database_url: URL) -> None:
    _enqueue(database_url, "mail")
    for cli in (pgqueue, flask):
        for options, note, hint in (
            (["--queue", "nosuch"], "note: no job has queue 'nosuch': check the name", QUEUES),
            (["--queue", "mial"], "no job has queue 'mial'", ": did you mean 'mail'?"),
            (["--task", "shop.nop"], "note: no job has task 'shop.nop': check the name", TASKS),
            (
                ["--queue", "mail", "--task", "shop.nop", "--json"],
                "note: no job has task 'shop.nop': check the name",
                TASKS,
            ),
            (
                ["--queue", "nosuch", "--task", "shop.nop"],
                "queue 'nosuch' or task 'shop.nop'",
                QUEUES,
            ),
        ):
            result = cli(["jobs", *options], shop, database_url)
            assert result.returncode == 0, result.stderr
            [line] = result.stderr.strip().splitlines()
            assert note in line and line.endswith(hint), line
            assert "nosuch" not in result.stdout and "shop.nop" not in result.stdout
        # Names that jobs have, matching nothing with the other filters: no note.
        result = cli(["jobs", "--queue", "mail", "--state", "failed"], shop, database_url)
        assert result.returncode == 0 and result.stderr == "", result.stderr


def test_a_bulk_action_that_matched_no_job_names_the_queue_no_job_has(
    shop: Path, database_url: URL
) -> None:
    _enqueue(database_url, "mail")
    for cli in (pgqueue, flask):
        for command in (
            ["bulk", "cancel", "--queue", "mial", "--dry-run"],
            ["bulk", "cancel", "--queue", "mial", "--yes"],
        ):
            result = cli(command, shop, database_url)
            assert result.returncode == 0, result.stderr
            assert "0 jobs" in result.stdout, result.stdout
            [line] = result.stderr.strip().splitlines()
            assert line == "note: no job has queue 'mial': check the name: did you mean 'mail'?"
        # A queue that has jobs, none of them matching the other filters: no note.
        result = cli(["bulk", "retry", "--queue", "mail", "--dry-run"], shop, database_url)
        assert result.returncode == 0 and result.stderr == "", result.stderr


def test_a_typo_of_a_known_name_is_answered_with_the_name(shop: Path, database_url: URL) -> None:
    _enqueue(database_url, "mail")
    for cli in (pgqueue, flask):
        _assert_one_line(
            cli(["pause", "mial"], shop, database_url),
            "queue 'mial' has no jobs and no settings; nothing changed: check its name "
            "(did you mean 'mail'?), or add --new to pause it before its first job",
        )
        _assert_one_line(
            cli(["enqueue", *APP[cli], "noop"], shop, database_url),
            "no task named 'noop' is registered: did you mean 'shop.noop'?",
        )
        _assert_one_line(
            cli(["enqueue", *APP[cli], "shop.nop"], shop, database_url),
            "no task named 'shop.nop' is registered: did you mean 'shop.noop'?",
        )
        error = _assert_one_line(
            cli(["enqueue", *APP[cli], "zzz"], shop, database_url),
            "no task named 'zzz' is registered: the registered ones are ",
        )
        assert "shop.noop" in error, error


def test_an_enqueue_typo_is_answered_before_the_schema_is_checked(
    shop: Path, empty_database_url: URL
) -> None:
    for cli in (pgqueue, flask):
        _assert_one_line(
            cli(["enqueue", *APP[cli], "noop"], shop, empty_database_url),
            "no task named 'noop' is registered: did you mean 'shop.noop'?",
        )
        _assert_one_line(
            cli(["enqueue", *APP[cli], "shop.noop", "--args", "[1,"], shop, empty_database_url),
            "--args and --kwargs must be JSON",
        )


def test_an_app_module_pgqueue_refuses_is_named_with_its_import(
    shop: Path, database_url: URL
) -> None:
    (shop / "badqueue.py").write_text(
        "import os\n"
        "from pgqueue import PgQueue\n"
        "pgq = PgQueue(os.environ['SHOP_URL'])\n"
        "@pgq.task(queue='bad queue')\n"
        "def noop():\n"
        "    return None\n"
    )
    for command in (["enqueue", "badqueue:pgq", "badqueue.noop"], ["worker", "badqueue:pgq"]):
        error = _assert_one_line(
            pgqueue(command, shop, database_url),
            "APP 'badqueue:pgq': importing 'badqueue' failed: ",
        )
        assert "'bad queue'" in error, error


def test_migrate_current_takes_no_revision(shop: Path, database_url: URL) -> None:
    for cli in (pgqueue, flask):
        error = _assert_one_line(
            cli(["migrate", "current", "pgqueue_0001"], shop, database_url),
            "migrate current takes no REVISION, got 'pgqueue_0001'",
            "migrate upgrade pgqueue_0001`",
        )
        assert error.startswith("error: ")


def test_a_name_no_job_can_have_is_refused_by_every_command(shop: Path, database_url: URL) -> None:
    for cli in (pgqueue, flask):
        for command in (
            ["jobs", "--queue", "bad queue"],
            ["jobs", "--task", "bad task"],
            ["jobs", "--json", "--queue", "bad queue"],
            ["pause", "bad queue"],
            ["pause", "bad queue", "--new"],
            ["resume", "bad queue"],
            ["limit", "bad queue", "2"],
            ["bulk", "retry", "--queue", "bad queue", "--dry-run"],
            ["bulk", "delete", "--task", "bad task", "--dry-run"],
            ["rate-limit", "bad queue", "3", "--per", "1"],
            ["enqueue", *APP[cli], "shop.noop", "--queue", "bad queue"],
            ["worker", *APP[cli], "--queues", "default,bad queue", "--drain"],
        ):
            _assert_one_line(cli(command, shop, database_url), "'bad ", "has characters outside")


SLOW_RETRIES = """
import os

from flask import Flask

from pgqueue import PgQueue, backoff
from pgqueue.contrib.flask import PgQueue as FlaskPgQueue

pgq = PgQueue(os.environ["SHOP_URL"])
flask_pgq = FlaskPgQueue()


def fail():
    raise ValueError("boom")


pgq.task(name="shop.later", retry=backoff.constant(600))(fail)
flask_pgq.task(name="shop.later", retry=backoff.constant(600))(fail)
app = Flask("slow")
app.config["PGQUEUE_DATABASE_URL"] = os.environ["SHOP_URL"]
flask_pgq.init_app(app)
"""


@pytest.mark.slow
def test_a_drain_names_the_retries_it_leaves(shop: Path, database_url: URL) -> None:
    (shop / "slow.py").write_text(SLOW_RETRIES)
    pgq = PgQueue(database_url)
    runs = {
        "pgqueue": ["-m", "pgqueue", "worker", "slow:pgq", "--drain"],
        "flask": ["-m", "flask", "--app", "slow:app", "pgqueue", "worker", "--drain"],
    }
    for argv in runs.values():
        [job_id] = _enqueue(database_url, "default", task="shop.later", max_attempts=3)
        result = _invoke(argv, shop, database_url)
        assert result.returncode == 0, result.stderr
        [line] = [line for line in result.stderr.splitlines() if "drained" in line]
        assert "leaving 1 job waiting (1 retrying, 0 queued)" in line, line
        # Counted down from the retry's 600 s backoff when the drain ends: a loaded machine may
        # take a few seconds between the two.
        due = re.search(rf"the next, job {job_id}, is due in (\d+) s", line)
        assert due is not None and 590 <= int(due.group(1)) <= 600, line
        pgq.admin.cancel_job(job_id)
    pgq.dispose()
    done = _invoke(runs["pgqueue"], shop, database_url)
    assert done.returncode == 0, done.stderr
    assert "drained" not in done.stderr, done.stderr


def test_show_prints_tracebacks_as_text(shop: Path, database_url: URL) -> None:
    [job_id] = _enqueue(database_url, "default", task="shop.fail", max_attempts=1)
    assert pgqueue(["worker", "shop:pgq", "--drain"], shop, database_url).returncode == 0
    for cli in (pgqueue, flask):
        shown = cli(["show", str(job_id)], shop, database_url)
        assert shown.returncode == 0, shown.stderr
        lines = shown.stdout.splitlines()
        assert "\\n" not in shown.stdout, shown.stdout
        assert "    Traceback (most recent call last):" in lines, shown.stdout
        assert "    ValueError: boom" in lines, shown.stdout
        assert any(line.startswith("error of attempt 1 at ") for line in lines), shown.stdout
        assert any(line.split() == ["state", "failed"] for line in lines), shown.stdout
        record = json.loads(cli(["show", str(job_id), "--json"], shop, database_url).stdout)
        assert record["state"] == "failed" and "Traceback" in record["last_error"]


def test_enqueue_arguments_that_are_not_json(shop: Path, database_url: URL) -> None:
    for cli in (pgqueue, flask):
        for options, expected in (
            (["--args", "[1,"], "--args and --kwargs must be JSON"),
            (["--kwargs", "[]"], "--args must be a JSON array and --kwargs a JSON object"),
        ):
            command = ["enqueue", *APP[cli], "shop.noop", *options]
            _assert_one_line(cli(command, shop, database_url), expected)


@pytest.mark.slow
def test_a_worker_s_queue_that_nothing_knows_is_answered_with_a_warning(
    shop: Path, database_url: URL
) -> None:
    _enqueue(database_url, "mail")
    for cli in (pgqueue, flask):
        done = cli(["worker", *APP[cli], "--queues", "mial,default", "--drain"], shop, database_url)
        assert done.returncode == 0, done.stderr
        warned = [line for line in done.stderr.splitlines() if "of --queues" in line]
        assert len(warned) == 1, done.stderr
        assert " WARNING " in warned[0], warned
        assert "queue 'mial' of --queues has no task declared in it" in warned[0]
        assert "(did you mean 'mail'?)" in warned[0]
        # A queue no name is close to is one a job may be enqueued into later: said at INFO.
        done = cli(["worker", *APP[cli], "--queues", "reports", "--drain"], shop, database_url)
        [said] = [line for line in done.stderr.splitlines() if "of --queues" in line]
        assert " INFO " in said and said.endswith("no jobs and no settings yet"), said
