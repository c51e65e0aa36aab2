"""The ``pgqueue`` command prints names and error messages as they are: square brackets in
them are text, not Rich markup (which would crash on ``[/x]`` or restyle ``[bold]``). The
command runs in-process as a fresh process runs it (``cli_invoke``)."""

from __future__ import annotations

import os
import subprocess

from sqlalchemy import Engine, text
from sqlalchemy.engine import URL
from support.cli_invoke import invoke


def _pgqueue(*args: str, url: URL) -> subprocess.CompletedProcess[str]:
    return invoke(
        ["-m", "pgqueue", *args],
        env={
            **os.environ,
            "COLUMNS": "200",
            "PGQUEUE_DATABASE_URL": url.render_as_string(hide_password=False),
        },
    )


def test_error_naming_a_bracketed_queue_is_one_plain_line(database_url: URL) -> None:
    result = _pgqueue("pause", "[/x]", url=database_url)
    assert result.returncode != 0
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("error: ")
    assert "'[/x]'" in lines[0]
    assert "Traceback" not in result.stderr


def test_stats_prints_hand_written_queue_names_verbatim(database_url: URL, engine: Engine) -> None:
    # Names enqueue would refuse, written by another client: printed, never interpreted.
    names = ["[/x]", "[b]y[/b]"]
    with engine.begin() as connection:
        for name in names:
            connection.execute(
                text("INSERT INTO pgqueue_jobs (task_name, queue) VALUES ('t', :q)"), {"q": name}
            )
    result = _pgqueue("stats", url=database_url)
    assert result.returncode == 0, result.stderr[-2000:]
    for name in names:
        assert name in result.stdout
