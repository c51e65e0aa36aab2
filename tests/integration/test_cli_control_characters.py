"""Job data never drives the terminal: control characters in it print as visible escapes.

Queue and task names, keys, error texts and worker rows are written by other clients too, and
an ESC, CSI, BEL or C1 character printed raw would retitle the terminal, clear it or recolour
what follows. Every command's output (tables, lines, errors, logs) shows such a character as
``\\x1b``-style text; ``--json`` output escapes it as JSON does (``\\u001b``). The commands run
in-process as a fresh process runs them (``cli_invoke``).
"""

from __future__ import annotations

import json
import logging
import os
import re
import subprocess
from typing import Any

import pytest
from sqlalchemy import Engine, text
from sqlalchemy.engine import URL
from support.cli_invoke import invoke

from pgqueue.cli.shared import VisibleFormatter, visible

# Every C0 control but newline and tab, DEL, and every C1 control.
RAW_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")

QUEUE = "q\x1b[31mred"
TASK = "t\x1b]0;pwned\x07"
KEY = "k\x9b2J\x00"
ERROR = "boom\x1b[2J\r\x08gone"
ARG = "a\x1b[5m"
WORKER = "w\x1b[1m"
HOST = "h\x1bc"


@pytest.fixture
def hostile(engine: Engine) -> dict[str, int]:
    """A failed job, a queued one, a worker and a key limit whose texts hold control
    characters, written by another client (pgqueue's own enqueue refuses such names)."""
    with engine.begin() as connection:
        failed = connection.execute(
            text(
                "INSERT INTO pgqueue_jobs (task_name, queue, state, unique_key, last_error, args)"
                " VALUES (:task, :queue, 'failed', :key, :error, CAST(:args AS json))"
                " RETURNING id"
            ),
            {
                "task": TASK,
                "queue": QUEUE,
                "key": KEY.replace("\x00", ""),  # PostgreSQL's text holds no NUL
                "error": ERROR,
                "args": json.dumps([ARG]),
            },
        ).scalar_one()
        queued = connection.execute(
            text("INSERT INTO pgqueue_jobs (task_name, queue) VALUES (:task, :queue) RETURNING id"),
            {"task": TASK, "queue": QUEUE},
        ).scalar_one()
        connection.execute(
            text("INSERT INTO pgqueue_message_queue (job_id, queue) VALUES (:id, :queue)"),
            {"id": queued, "queue": QUEUE},
        )
        connection.execute(
            text("INSERT INTO pgqueue_queues (name, paused) VALUES (:queue, true)"),
            {"queue": QUEUE},
        )
        connection.execute(
            text(
                "INSERT INTO pgqueue_workers (id, host, pid, queues, concurrency, version,"
                " claim_error, claim_failing_since)"
                " VALUES (:id, :host, 1, ARRAY[:queue], 1, 'v\x07', :error, now())"
            ),
            {"id": WORKER, "host": HOST, "queue": QUEUE, "error": ERROR},
        )
        connection.execute(
            text("INSERT INTO pgqueue_key_limits (prefix, key_limit) VALUES (:prefix, 1)"),
            {"prefix": "p\x9b"},
        )
    return {"failed": failed, "queued": queued}


def _run(database_url: URL, *args: str) -> subprocess.CompletedProcess[str]:
    url = database_url.render_as_string(hide_password=False)
    return invoke(["-m", "pgqueue", *args], env={**os.environ, "PGQUEUE_DATABASE_URL": url})


def _output(result: subprocess.CompletedProcess[str]) -> str:
    return result.stdout + result.stderr


def _assert_no_raw_control(result: subprocess.CompletedProcess[str]) -> None:
    found = sorted({hex(ord(c)) for c in RAW_CONTROL.findall(result.stdout + result.stderr)})
    assert found == [], (found, _output(result)[-3000:])


@pytest.mark.parametrize(
    "command",
    [
        ["jobs"],
        ["jobs", "--queue", QUEUE],
        ["stats"],
        ["workers"],
        ["show", "{failed}"],
        ["explain", "{queued}"],
        ["explain", "{failed}"],
        ["bulk", "cancel", "--error-contains", "boom", "--dry-run"],
        ["key-limit", KEY.replace("\x00", ""), "2"],
        ["key-limit"],
    ],
    ids=lambda command: "-".join(command[:2]),
)
def test_tables_and_lines_show_control_characters_escaped(
    database_url: URL, hostile: dict[str, int], command: list[str]
) -> None:
    args = [part.format(**hostile) for part in command]
    result = _run(database_url, *args)
    assert result.returncode == 0, _output(result)[-3000:]
    _assert_no_raw_control(result)
    # Shown, not dropped: the data is there, its control characters as visible text (``show``
    # prints JSON, which escapes them its own way).
    shown = {"show": "\\u001b", "key-limit": "\\x9b", "bulk": None}.get(command[0], "\\x1b")
    if shown is not None:
        assert shown in result.stdout, result.stdout[-3000:]


@pytest.mark.parametrize(
    "command", [["jobs"], ["stats"], ["workers"], ["show", "{failed}"], ["explain", "{failed}"]]
)
def test_json_output_escapes_control_characters(
    database_url: URL, hostile: dict[str, int], command: list[str]
) -> None:
    result = _run(database_url, *[part.format(**hostile) for part in command], "--json")
    assert result.returncode == 0, _output(result)[-3000:]
    _assert_no_raw_control(result)
    document: Any = json.loads(result.stdout)
    # The values are the data itself: JSON's escapes decode to the original characters.
    assert QUEUE in _strings(document)


def _strings(document: Any) -> set[str]:
    if isinstance(document, str):
        return {document}
    if isinstance(document, dict):
        return set(document) | {s for value in document.values() for s in _strings(value)}
    if isinstance(document, list):
        return {s for value in document for s in _strings(value)}
    return set()


def test_errors_show_control_characters_escaped(database_url: URL, hostile: dict[str, int]) -> None:
    # Names pgqueue refuses, echoed in the error line; the server's own message naming a
    # database that does not exist.
    missing = database_url.set(database="missing\x1b[31m").render_as_string(hide_password=False)
    for args in (
        ["pause", "bad\x1b[31m name"],
        ["resume", QUEUE],
        ["limit", QUEUE, "3"],
        ["stats", "--database-url", missing],
    ):
        result = _run(database_url, *args)
        assert result.returncode == 2, _output(result)[-3000:]
        assert result.stderr.startswith("error: ")
        _assert_no_raw_control(result)


def test_visible_escapes_every_control_but_newline_and_tab() -> None:
    every = "".join(chr(c) for c in range(0x00, 0xA0))
    shown = visible(every)
    assert RAW_CONTROL.findall(shown) == []
    assert "\n" in shown and "\t" in shown
    assert "\\x1b" in shown and "\\x9b" in shown and "\\x07" in shown and "\\x7f" in shown
    assert "\\x0d" in shown and "\\x00" in shown
    assert visible("plain text, [brackets] and ünïcödé") == "plain text, [brackets] and ünïcödé"


def test_cli_log_lines_show_control_characters_escaped() -> None:
    formatter = VisibleFormatter("%(levelname)s %(name)s: %(message)s")
    record = logging.LogRecord(
        "pgqueue.worker", logging.WARNING, __file__, 1, "job %s task=%s", (1, TASK), None
    )
    try:
        raise ValueError(ERROR)
    except ValueError:
        import sys

        record.exc_info = sys.exc_info()
    line = formatter.format(record)
    assert RAW_CONTROL.findall(line) == []
    assert "task=t\\x1b]0;pwned\\x07" in line
    assert "Traceback" in line and "\n" in line  # the traceback keeps its lines
