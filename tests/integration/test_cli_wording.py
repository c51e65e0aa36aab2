"""What both CLIs say, read as a user reads it: tables titled for what they show, counts in
plain English, states in sentences, the Flask CLI's suggestions in its own commands, a
database URL given once for the whole command line. Real server; each command in-process as a
fresh process runs it (``cli_invoke``)."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import click
from sqlalchemy.engine import URL
from support.cli_invoke import invoke
from test_cli_one_line_errors import _assert_one_line, _enqueue, flask, pgqueue, shop

__all__ = ["shop"]  # the fixture, used by name


def _failed_job(shop: Path, database_url: URL) -> int:
    [job_id] = _enqueue(database_url, "default", task="shop.fail", max_attempts=1)
    assert pgqueue(["worker", "shop:pgq", "--drain"], shop, database_url).returncode == 0
    return job_id


def test_stats_is_titled_for_its_counts(shop: Path, database_url: URL) -> None:
    _enqueue(database_url, "mail")
    for cli in (pgqueue, flask):
        shown = cli(["stats"], shop, database_url)
        assert shown.returncode == 0, shown.stderr
        assert shown.stdout.splitlines()[0].strip() == "jobs per queue and state", shown.stdout


def test_counts_of_one_are_singular(shop: Path, database_url: URL) -> None:
    _failed_job(shop, database_url)
    for cli in (pgqueue, flask):
        dry = cli(["bulk", "retry", "--state", "failed", "--dry-run"], shop, database_url)
        assert dry.stdout.strip() == "dry run: retry would change 1 job", dry.stdout


def test_states_read_as_sentences(shop: Path, database_url: URL) -> None:
    [job_id] = _enqueue(database_url, "default")
    assert pgqueue(["worker", "shop:pgq", "--drain"], shop, database_url).returncode == 0
    for cli in (pgqueue, flask):
        _assert_one_line(
            cli(["retry", str(job_id)], shop, database_url),
            f"cannot retry job {job_id}: it has succeeded",
        )


def test_the_flask_cli_suggests_its_own_commands(shop: Path, database_url: URL) -> None:
    job_id = _failed_job(shop, database_url)
    hosted = flask(["explain", str(job_id)], shop, database_url)
    assert hosted.returncode == 0, hosted.stderr
    assert f"`flask pgqueue retry {job_id}`" in hosted.stdout, hosted.stdout
    assert " `pgqueue " not in hosted.stdout, hosted.stdout
    core = pgqueue(["explain", str(job_id)], shop, database_url)
    assert f"`pgqueue retry {job_id}`" in core.stdout, core.stdout


def test_the_database_url_as_a_group_option(shop: Path, database_url: URL) -> None:
    _enqueue(database_url, "grouped")
    rendered = database_url.render_as_string(hide_password=False)
    # The environment names a server where nothing listens: only the option can be used.
    nowhere = "postgresql+psycopg://postgres:x@127.0.0.1:9/none"
    shown = pgqueue(["--database-url", rendered, "stats"], shop, nowhere)
    assert shown.returncode == 0, shown.stderr
    assert "grouped" in shown.stdout
    # A command's own option wins over the group's.
    own = pgqueue(["--database-url", nowhere, "stats", "--database-url", rendered], shop, nowhere)
    assert own.returncode == 0 and "grouped" in own.stdout, own.stderr


def test_a_bad_setting_names_what_it_must_hold(shop: Path, database_url: URL) -> None:
    rendered = database_url.render_as_string(hide_password=False)
    env = {**os.environ, "PGQUEUE_DATABASE_URL": rendered, "PGQUEUE_METRICS_PORT": "eighty"}
    result = invoke(["-m", "pgqueue", "stats"], cwd=shop, env=env)
    error = _assert_one_line(result, "PGQUEUE_METRICS_PORT='eighty' is not a whole number")
    assert "None" not in error


def test_the_embedded_warning_is_said_where_jobs_run() -> None:
    from pgqueue.cli.shared import _quiet_embedded_notice
    from pgqueue.engines import EMBEDDED_FALLBACK

    def shown(command: str | None, level: int) -> tuple[bool, str]:
        record = logging.LogRecord("pgqueue.engines", logging.WARNING, "", 0, "x", None, None)
        setattr(record, EMBEDDED_FALLBACK, True)
        logging.getLogger().setLevel(level)
        if command is None:
            return _quiet_embedded_notice(record), record.levelname
        with click.Context(click.Command(command), info_name=command):
            return _quiet_embedded_notice(record), record.levelname

    before = logging.getLogger().level
    try:
        assert shown("worker", logging.WARNING) == (True, "WARNING")
        assert shown("stats", logging.WARNING) == (False, "INFO")
        assert shown("stats", logging.INFO) == (True, "INFO")
    finally:
        logging.getLogger().setLevel(before)
