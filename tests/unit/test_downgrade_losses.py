"""Every table and column a revision's ``downgrade()`` drops is declared in its
``downgrade_loses``, so ``pgqueue migrate downgrade`` can refuse to lose their data."""

from __future__ import annotations

import ast
from pathlib import Path

from alembic.script import ScriptDirectory

from pgqueue import migrations
from pgqueue.migrations.losses import DropsColumn, DropsTable

VERSIONS = Path(migrations.__file__).parent / "versions"


def _dropped(path: Path) -> set[tuple[str, ...]]:
    tree = ast.parse(path.read_text())
    (downgrade,) = (
        n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "downgrade"
    )
    found: set[tuple[str, ...]] = set()
    for node in ast.walk(downgrade):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            args = [a.value for a in node.args if isinstance(a, ast.Constant)]
            if node.func.attr == "drop_table":
                found.add((args[0],))
            elif node.func.attr == "drop_column":
                found.add((args[0], args[1]))
    return found


def test_each_revision_declares_what_its_downgrade_drops() -> None:
    script = ScriptDirectory.from_config(migrations.alembic_config())
    checked = 0
    for revision in script.walk_revisions():
        path = Path(revision.path)
        declared: set[tuple[str, ...]] = set()
        for loss in getattr(revision.module, "downgrade_loses", ()):
            if isinstance(loss, DropsTable):
                declared.add((loss.table,))
            elif isinstance(loss, DropsColumn):
                declared.add((loss.table, loss.column))
        assert declared == _dropped(path), path.name
        checked += 1
    assert checked == len(list(VERSIONS.glob("pgqueue_*.py")))
