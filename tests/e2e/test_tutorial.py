"""The tutorial (docs/tutorial.md) runs as a reader runs it, from an empty directory.

Every fenced block of the page runs in order, exactly as written: a Python block the page says
to save ("Save this as `shop.py`") is written to that file, and every bash block runs through
``bash -c`` with this test's venv first on ``PATH``, the variables one block exports kept for
the next (one terminal). A command that runs until Ctrl-C (the app's server, the worker) is
started in the background and stopped as Ctrl-C stops it: SIGINT to its process group. A
block marked ``<!-- not run: ... -->`` for the in-process docs test runs here too. The lines not
run are the install lines (``python -m venv .venv && . .venv/bin/activate`` and ``pip install
"sqlalchemy-pgqueue[flask,embedded]"``): this test's venv, which has pgqueue installed, stands
in for them. The page's app listens on port 5000, so that port must be free.

Two readers, each checked against what the page says happens (the order's id, the job
succeeded after one attempt, the receipt written, the dashboard served):

- ``server``: the suite's test server. The page's role and database lines run as its
  superuser, reached through libpq's ``PGHOST``/``PGPORT``/``PGUSER``/``PGPASSWORD`` (what the
  page tells a managed service's reader to set); the app's URL, which names ``localhost`` and
  no port, reaches the server through ``PGPORT``.
- ``embedded``: a machine with only Python. The server block is left out, as the page says;
  the embedded server keeps its data in a directory of this test's
  (``PGQUEUE_EMBEDDED_DATA_DIR``) instead of the machine's.

``pgqueue demo`` runs before any database is named, on the embedded server: in the embedded
reader only, as it would be the same run twice.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from server_databases import admin_engine
from sqlalchemy import create_engine, make_url, text
from sqlalchemy.engine import URL
from support.docs_pages import DOCS, CodeBlock, code_blocks
from support.polling import wait_until

from pgqueue import Settings
from pgqueue.config import embedded_database_name

TUTORIAL = DOCS / "tutorial.md"
INSTALL_LINES = ("python -m venv ", "pip install ")
# Run by the embedded reader only: the same command on the same embedded server for both, and
# the dearest line of the page (10,000 jobs).
DEMO_LINE = "pgqueue demo"
# The commands the page runs until Ctrl-C, each in a block of its own.
UNTIL_STOPPED = ("flask --app shop run", "flask --app shop pgqueue worker --queues mail")
APP_PORT = 5000  # the page's `flask run` and `curl localhost:5000`
_SAVE_AS = re.compile(r"Save this as `(?P<name>[^`]+)`")

pytestmark = pytest.mark.slow


@dataclass
class Reader:
    """One reader's terminal: a working directory, an environment, what runs in the background."""

    directory: Path
    env: dict[str, str]
    state: Path  # the variables exported so far, as `export -p` prints them
    app_url: URL | None  # the app's database on a server; None: on the embedded server
    data_dir: Path  # the embedded server's
    background: dict[str, subprocess.Popen[str]] = field(default_factory=dict)
    logs: dict[str, Path] = field(default_factory=dict)

    def script(self, code: str) -> str:
        return f". {self.state}\nset -e -o pipefail\n{code}\nexport -p > {self.state}\n"

    def run(self, code: str, where: str) -> str:
        result = subprocess.run(
            ["bash", "-c", self.script(code)],
            cwd=self.directory,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert result.returncode == 0, f"{where} failed:\n{code}\n{result.stdout}\n{result.stderr}"
        return result.stdout

    def start(self, command: str) -> None:
        self.logs[command] = self.directory.parent / f"background-{len(self.logs)}.log"
        log = self.logs[command].open("w")
        # A session of its own: Ctrl-C in a terminal signals the foreground process group.
        self.background[command] = subprocess.Popen(
            ["bash", "-c", self.script(command)],
            cwd=self.directory,
            env=self.env,
            stdout=log,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
        log.close()

    def interrupt(self, command: str) -> int:
        """Ctrl-C: SIGINT to the command's process group, then its exit code."""
        process = self.background.pop(command)
        os.killpg(process.pid, signal.SIGINT)
        return process.wait(timeout=60)

    def database(self) -> URL:
        """The app's database: the server's, else the embedded one named after the directory."""
        if self.app_url is not None:
            return self.app_url
        from pgqueue.embedded import shared_server

        # Only while the app runs: that process owns the server, this one reuses it.
        server = make_url(shared_server(self.data_dir))
        return server.set(database=embedded_database_name(Settings(), self.directory))


def _blocks() -> list[tuple[CodeBlock, str]]:
    """The page's blocks, each with the prose between it and the block before it."""
    lines = TUTORIAL.read_text(encoding="utf-8").splitlines()
    blocks, end = [], 0
    for block in code_blocks(TUTORIAL):
        blocks.append((block, "\n".join(lines[end : block.line - 1])))
        end = block.line + block.code.count("\n") + 1
    return blocks


def _port_open(port: int) -> bool:
    with socket.socket() as probe:
        probe.settimeout(0.5)
        return probe.connect_ex(("127.0.0.1", port)) == 0


def _libpq_env(url: URL) -> dict[str, str]:
    """The superuser's connection as libpq's variables."""
    host = url.query.get("host") or url.host or "localhost"
    env = {"PGHOST": str(host), "PGUSER": url.username or "postgres"}
    port = url.query.get("port") or url.port
    if port:
        env["PGPORT"] = str(port)
    if url.password:
        env["PGPASSWORD"] = str(url.password)
    return env


@pytest.fixture
def embedded_data_dir() -> Iterator[Path]:
    # Not tmp_path: its directories are 0700, and as root the server runs as another user.
    root = Path(tempfile.mkdtemp(prefix="pgqueue-tutorial-"))
    root.chmod(0o755)
    try:
        yield root / "postgres"
    finally:
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def shop_role(server_tcp_url: URL) -> Iterator[URL]:
    """The role and database the page creates, dropped afterwards; the app's URL of them."""
    admin = admin_engine(server_tcp_url)
    with admin.connect() as connection:
        taken = connection.scalar(
            text(
                "SELECT exists(SELECT FROM pg_roles WHERE rolname = 'shop') "
                "OR exists(SELECT FROM pg_database WHERE datname = 'shop')"
            )
        )
    assert not taken, "the test server already has a role or database named shop"
    try:
        yield server_tcp_url.set(username="shop", password="secret", database="shop")
    finally:
        with admin.connect() as connection:
            connection.execute(text("DROP DATABASE IF EXISTS shop WITH (FORCE)"))
            connection.execute(text("DROP ROLE IF EXISTS shop"))
        admin.dispose()


@pytest.mark.parametrize("reader", ["server", "embedded"])
def test_the_tutorial_runs_as_written(
    reader: str,
    tmp_path: Path,
    embedded_data_dir: Path,
    request: pytest.FixtureRequest,
) -> None:
    assert not _port_open(APP_PORT), f"port {APP_PORT}, which the tutorial uses, is taken"
    directory = tmp_path / "shop"  # the reader's empty directory
    directory.mkdir()
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("PGQUEUE_", "PG", "FLASK_")) and k != "VIRTUAL_ENV"
    }
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    env["PGQUEUE_EMBEDDED_DATA_DIR"] = str(embedded_data_dir)
    env["COLUMNS"] = "200"  # rich tables: keep task names on one line
    app_url: URL | None = None
    if reader == "server":
        app_url = request.getfixturevalue("shop_role")
        env.update(_libpq_env(request.getfixturevalue("server_tcp_url")))
    state = tmp_path / "exported.sh"
    state.touch()
    terminal = Reader(directory, env, state, app_url, embedded_data_dir)
    skipped: list[str] = []
    checked: list[str] = []
    try:
        for block, prose in _blocks():
            where = f"docs/tutorial.md:{block.line}"
            if block.language in ("python", "py"):
                saved = _SAVE_AS.search(prose)
                assert saved, f"{where}: a Python block the page does not say where to save"
                (directory / saved["name"]).write_text(block.code, encoding="utf-8")
                continue
            assert block.language == "bash", f"{where}: a {block.language!r} block"
            if reader == "embedded" and "CREATE ROLE" in block.code:
                skipped.append(block.code)
                continue  # the server block: a machine with only Python has no server
            lines = block.code.splitlines()
            install = [line for line in lines if line.startswith(INSTALL_LINES)]
            if reader == "server":
                install += [line for line in lines if line == DEMO_LINE]
            skipped += install
            code = "\n".join(line for line in lines if line not in install)
            if code.strip() in UNTIL_STOPPED:
                terminal.start(code.strip())
                if code.strip() == UNTIL_STOPPED[0]:
                    wait_until(lambda: _port_open(APP_PORT), 60, "the app listening on 5000")
                else:
                    _check_the_worker(terminal)
                    checked.append("the worker")
                continue
            claim = _check_the_outcome(terminal, code, terminal.run(code, where))
            checked += [claim] if claim else []
        # The reader is done: Ctrl-C in the app's terminal.
        assert list(terminal.background) == [UNTIL_STOPPED[0]]
        assert terminal.interrupt(UNTIL_STOPPED[0]) in (0, -signal.SIGINT, 130)
    finally:
        for command in list(terminal.background):
            terminal.interrupt(command)
    assert any(line.startswith("python -m venv .venv") for line in skipped)
    assert 'pip install "sqlalchemy-pgqueue[flask,embedded]"' in skipped
    assert (DEMO_LINE in skipped) is (reader == "server"), skipped
    assert len(skipped) == 3, skipped
    assert checked == ["the order", "the worker", "the commands and the dashboard", "the script"]


def _rows(url: URL, sql: str) -> list[tuple[object, ...]]:
    engine = create_engine(url)
    try:
        with engine.connect() as connection:
            return [tuple(row) for row in connection.execute(text(sql))]
    finally:
        engine.dispose()


def _check_the_worker(terminal: Reader) -> None:
    """The worker runs the waiting job once, writes the receipt, and stops on Ctrl-C."""
    url = terminal.database()
    wait_until(
        lambda: (
            _rows(url, "SELECT state, attempts FROM pgqueue_jobs WHERE id = 1")
            == [("succeeded", 1)]
        ),
        60,
        "job 1 succeeded after one attempt",
    )
    assert _rows(url, "SELECT order_id FROM receipt") == [(1,)]
    assert terminal.interrupt(UNTIL_STOPPED[1]) == 0, terminal.logs[UNTIL_STOPPED[1]].read_text()


def _check_the_outcome(terminal: Reader, code: str, output: str) -> str | None:
    """What the page says a block does; the name of the claim checked, if any."""
    if code.startswith("curl "):
        assert json.loads(output) == {"id": 1}, output
        url = terminal.database()
        assert _rows(url, "SELECT state, args FROM pgqueue_jobs") == [("queued", [1])]
        return "the order"
    elif "pgqueue stats" in code:
        assert "send_receipt" in output and "succeeded" in output, output
        with urllib.request.urlopen(f"http://localhost:{APP_PORT}/pgqueue") as page:
            assert page.status == 200
        return "the commands and the dashboard"
    elif code.startswith("python try_shop.py"):
        script = (terminal.directory / "try_shop.py").read_text(encoding="utf-8")
        printed = re.findall(r"^\s*print\(.*\)  # (.+)$", script, flags=re.MULTILINE)
        assert len(printed) == 2, script
        assert output.splitlines() == printed, output
        url = terminal.database()
        assert _rows(url, "SELECT order_id FROM receipt ORDER BY order_id") == [(1,), (2,)]
        return "the script"
    return None
