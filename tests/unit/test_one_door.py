"""One door to operations: ``Admin`` does the work; ``PgQueue``'s job-control names are
declared aliases of its methods, listed in ``PgQueue``'s docstring; both CLIs and the dashboard
call ``pgq.admin``, never an alias."""

from __future__ import annotations

import ast
import inspect
import re
from pathlib import Path

import pytest

from pgqueue import PgQueue
from pgqueue.admin import Admin
from pgqueue.core import AdminAlias

PACKAGE = Path(__file__).resolve().parents[2] / "pgqueue"
SURFACES = sorted(
    [
        *PACKAGE.glob("cli/*.py"),
        *PACKAGE.glob("contrib/flask/*.py"),
        *PACKAGE.glob("dashboard/*.py"),
    ]
)


def aliases() -> dict[str, AdminAlias[..., object]]:
    return {name: value for name, value in vars(PgQueue).items() if isinstance(value, AdminAlias)}


def test_each_alias_is_the_admin_method_of_its_name() -> None:
    assert aliases()
    for name, alias in aliases().items():
        assert alias.name == name
        assert inspect.isfunction(getattr(Admin, name))


def test_the_docstring_lists_the_aliases() -> None:
    doc = inspect.getdoc(PgQueue) or ""
    listed = doc[doc.index("These attributes are aliases") :]
    assert set(re.findall(r"``(\w+)``", listed)) == set(aliases())


def test_an_alias_reads_the_admin_method_on_each_access() -> None:
    pgq = PgQueue("postgresql+psycopg://user@localhost/never_connected")
    assert pgq.retry_job == pgq.admin.retry_job
    assert inspect.signature(pgq.set_rate_limit) == inspect.signature(pgq.admin.set_rate_limit)
    assert inspect.iscoroutinefunction(pgq.aget_job)
    assert isinstance(PgQueue.get_job, AdminAlias)


def _alias_calls(path: Path) -> list[str]:
    """``x.name(...)`` calls in ``path`` whose name is an alias and whose ``x`` is neither an
    admin object (``pgq.admin``, ``admin``, ``_admin()``) nor an imported module."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    imported = {
        alias.asname or alias.name
        for node in ast.walk(tree)
        if isinstance(node, ast.Import | ast.ImportFrom)
        for alias in node.names
    }
    found = []
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
            continue
        if node.func.attr not in aliases():
            continue
        owner = ast.unparse(node.func.value)
        if owner not in imported and not re.search(r"(^|\.|_)admin(\(\))?$", owner):
            found.append(
                f"{path.relative_to(PACKAGE.parent)}:{node.lineno} {owner}.{node.func.attr}"
            )
    return found


@pytest.mark.parametrize("path", SURFACES, ids=lambda path: path.name)
def test_surfaces_call_admin_not_an_alias(path: Path) -> None:
    assert _alias_calls(path) == []
