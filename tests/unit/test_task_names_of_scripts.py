"""A task defined in a script is named after the module a worker imports it as: run as
``python jobs.py`` or ``python -m jobs``, ``jobs`` is ``__main__`` to itself, and a name
``__main__.send`` would be enqueued under a name no worker (``pgqueue worker jobs:pgq``) has."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = """
import sys

from pgqueue import PgQueue

pgq = PgQueue("postgresql+psycopg://nobody@127.0.0.1:1/nothing")  # never connected


@pgq.task()
def send(order_id):
    return order_id


print(send.name)
"""


def _run(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    (tmp_path / "jobs.py").write_text(SCRIPT)
    return subprocess.run(
        [sys.executable, *args],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


@pytest.mark.parametrize("how", [["jobs.py"], ["-m", "jobs"], ["-c", "import jobs"]])
def test_a_script_s_task_has_the_name_a_worker_importing_it_gives_it(
    tmp_path: Path, how: list[str]
) -> None:
    done = _run(tmp_path, *how)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "jobs.send"


def test_a_task_defined_where_no_module_can_be_imported_needs_a_name(tmp_path: Path) -> None:
    code = SCRIPT.replace("print(send.name)", "")
    done = subprocess.run(
        [sys.executable, "-c", code],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 1
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("pgqueue.errors.ValidationError: task 'send' is defined in __main__")
    assert "pass name=" in last
