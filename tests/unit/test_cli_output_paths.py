"""The commands print only through ``pgqueue.cli.shared``'s outputs, which show control
characters as text; a direct ``click.echo``, ``print`` or ``sys.stdout.write`` in a command
module would let job data drive the terminal."""

from __future__ import annotations

import ast
from pathlib import Path

import pgqueue

ROOT = Path(pgqueue.__file__).parent
COMMAND_MODULES = [
    "cli/__init__.py",
    "cli/bulk.py",
    "cli/demo.py",
    "cli/flow.py",
    "cli/history.py",
    "cli/jobs.py",
    "cli/migrate.py",
    "cli/queues.py",
    "cli/reports.py",
    "cli/workers.py",
    "contrib/flask/cli.py",
]


def _direct_outputs(path: Path) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if not isinstance(node, ast.Call):
            continue
        function = node.func
        name = ast.unparse(function)
        if name in {"click.echo", "click.secho", "print", "sys.stdout.write", "sys.stderr.write"}:
            found.append(f"{path.name}:{node.lineno} {name}")
    return found


def test_command_modules_print_only_through_cli_shared() -> None:
    found = [line for module in COMMAND_MODULES for line in _direct_outputs(ROOT / module)]
    assert found == []
