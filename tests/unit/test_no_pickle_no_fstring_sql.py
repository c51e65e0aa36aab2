"""Source scans of the ``pgqueue`` package: no pickle, no SQL from formatting.

Both are checked on the syntax tree of every module, so a new module or a refactor is covered
without anyone remembering to add it here:

- nothing imports ``pickle`` or a relative of it (``dill``, ``cloudpickle``, ``shelve``,
  ``marshal``, ``jsonpickle``), statically or through ``__import__``/``importlib``: job data is
  JSON only, so a row in the database can never become code;
- no string handed to something that runs SQL (``text``, ``execute``, ``exec_driver_sql``,
  ``literal_column``, ``DDL``, ``psycopg.sql.SQL``...) is built by an f-string, ``%``,
  ``.format`` or ``+``, directly or through a local variable. The one exception is
  interpolating a module-level UPPER_CASE constant whose value is a plain lowercase identifier
  (pgqueue's ``LISTEN`` channel): that is fixed at import time, never input.

The scanner is tested on small snippets first, so a scan that finds nothing means something.
"""

from __future__ import annotations

import ast
import importlib
import re
from dataclasses import dataclass
from pathlib import Path

import pytest

import pgqueue
from pgqueue.config import NAME_PATTERN, TASK_NAME_PATTERN

PACKAGE_DIR = Path(pgqueue.__file__).parent
PICKLE_LIKE = frozenset(
    {"pickle", "cPickle", "_pickle", "dill", "cloudpickle", "shelve", "marshal", "jsonpickle"}
)
# Callables whose first argument is SQL text (or a fragment of it).
SQL_SINKS = frozenset(
    {
        "text",
        "execute",
        "executemany",
        "exec_driver_sql",
        "literal_column",
        "DDL",
        "SQL",
        "Composed",
        "TextClause",
        "prepare",
        "copy",
    }
)
SAFE_CONSTANT = re.compile(r"[a-z_][a-z0-9_]*")


@dataclass(frozen=True)
class Finding:
    where: str
    line: int
    what: str


def _modules() -> list[tuple[str, Path]]:
    result = []
    for path in sorted(PACKAGE_DIR.rglob("*.py")):
        parts = path.relative_to(PACKAGE_DIR.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        result.append((name, path))
    return result


# --- pickle --------------------------------------------------------------------------------------


def pickle_imports(source: str, where: str) -> list[Finding]:
    findings = []
    for node in ast.walk(ast.parse(source)):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            names = [node.module]
        elif isinstance(node, ast.Call) and _call_name(node) in {"__import__", "import_module"}:
            names = [
                a.value
                for a in node.args[:1]
                if isinstance(a, ast.Constant) and isinstance(a.value, str)
            ]
        for name in names:
            if name.split(".")[0] in PICKLE_LIKE:
                findings.append(Finding(where, node.lineno, f"imports {name}"))
    return findings


# --- SQL built by formatting ------------------------------------------------------------------


def _call_name(node: ast.Call) -> str | None:
    if isinstance(node.func, ast.Name):
        return node.func.id
    if isinstance(node.func, ast.Attribute):
        return node.func.attr
    return None


class _SqlScanner(ast.NodeVisitor):
    def __init__(self, where: str, module: str | None) -> None:
        self.where = where
        self.module = module
        self.findings: list[Finding] = []
        # Local names assigned a formatted string, per function scope (one level of data flow).
        self.scopes: list[dict[str, ast.expr]] = [{}]

    def visit_FunctionDef(self, node: ast.FunctionDef | ast.AsyncFunctionDef) -> None:
        self.scopes.append({})
        self.generic_visit(node)
        self.scopes.pop()

    visit_AsyncFunctionDef = visit_FunctionDef  # type: ignore[assignment]

    def visit_Assign(self, node: ast.Assign) -> None:
        for target in node.targets:
            if isinstance(target, ast.Name):
                self.scopes[-1][target.id] = node.value
        self.generic_visit(node)

    def visit_AnnAssign(self, node: ast.AnnAssign) -> None:
        if isinstance(node.target, ast.Name) and node.value is not None:
            self.scopes[-1][node.target.id] = node.value
        self.generic_visit(node)

    def visit_Call(self, node: ast.Call) -> None:
        if _call_name(node) in SQL_SINKS:
            candidates = list(node.args[:1]) + [
                k.value for k in node.keywords if k.arg in {"statement", "sql", "query", "text"}
            ]
            for argument in candidates:
                problem = self._formatted(argument)
                if problem:
                    self.findings.append(
                        Finding(self.where, node.lineno, f"{_call_name(node)}() gets {problem}")
                    )
        self.generic_visit(node)

    def _formatted(self, node: ast.expr, depth: int = 0) -> str | None:
        """Why ``node`` is a string built at run time, or None if it is not."""
        if isinstance(node, ast.Name) and depth == 0:
            for scope in reversed(self.scopes):
                if node.id in scope:
                    inner = self._formatted(scope[node.id], depth + 1)
                    return f"{inner} (via {node.id})" if inner else None
            return None
        if isinstance(node, ast.JoinedStr):
            for part in node.values:
                if isinstance(part, ast.FormattedValue) and not self._constant(part.value):
                    return f"an f-string interpolating {ast.unparse(part.value)}"
            return None
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mod | ast.Add):
            if _stringish(node.left) or _stringish(node.right):
                kind = "%-formatting" if isinstance(node.op, ast.Mod) else "concatenation"
                return f"{kind}: {ast.unparse(node)[:80]}"
            return None
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr in {"format", "format_map", "join", "replace"}
            and _stringish(node.func.value)
        ):
            return f".{node.func.attr}(): {ast.unparse(node)[:80]}"
        return None

    def _constant(self, node: ast.expr) -> bool:
        """A module-level UPPER_CASE constant holding a plain lowercase identifier."""
        if not isinstance(node, ast.Name) or not node.id.isupper() or self.module is None:
            return False
        value = getattr(importlib.import_module(self.module), node.id, None)
        return isinstance(value, str) and SAFE_CONSTANT.fullmatch(value) is not None


def _stringish(node: ast.expr) -> bool:
    return (isinstance(node, ast.Constant) and isinstance(node.value, str)) or isinstance(
        node, ast.JoinedStr
    )


def formatted_sql(source: str, where: str, module: str | None = None) -> list[Finding]:
    scanner = _SqlScanner(where, module)
    scanner.visit(ast.parse(source))
    return scanner.findings


# --- the scanners work -------------------------------------------------------------------------


@pytest.mark.parametrize(
    "snippet",
    [
        "import pickle",
        "import pickle as p",
        "from pickle import loads",
        "import dill",
        "from cloudpickle import dumps",
        "import shelve",
        "import marshal",
        "__import__('pickle')",
        "importlib.import_module('pickle')",
        "def f():\n    import _pickle",
    ],
)
def test_pickle_scanner_flags(snippet: str) -> None:
    assert len(pickle_imports(snippet, "snippet")) == 1


@pytest.mark.parametrize(
    "snippet",
    [
        "conn.execute(text(f'SELECT * FROM {table}'))",
        "session.execute(text('SELECT * FROM ' + table))",
        "conn.execute('DELETE FROM jobs WHERE id = %s' % job_id)",
        "conn.exec_driver_sql('DROP TABLE {}'.format(name))",
        "literal_column(f\"interval '{seconds} seconds'\")",
        "cursor.execute(f'LISTEN {channel}')",
        "def f(name):\n    sql = f'NOTIFY {name}'\n    cur.execute(sql)",
        "def f(name):\n    sql = 'SELECT ' + name\n    conn.execute(text(sql))",
        "conn.execute(statement=f'SELECT {x}')",
        "op.execute(f'ALTER TABLE {t} OWNER TO {owner}')",
        "psycopg.sql.SQL(f'LISTEN {channel}')",
    ],
)
def test_sql_scanner_flags(snippet: str) -> None:
    assert len(formatted_sql(snippet, "snippet")) == 1, snippet


@pytest.mark.parametrize(
    "snippet",
    [
        "conn.execute(text('SELECT 1'))",
        "conn.execute(select(Job).where(Job.id == bindparam('id')))",
        "conn.execute(text('SELECT :x'), {'x': value})",
        "op.execute(NOTIFY_FUNCTION)",
        "log.info(f'job {job_id} done')",  # not SQL
        "conn.execute(sql.SQL('LISTEN {}').format(sql.Identifier(channel)))",
        # a module constant holding a plain identifier (resolved by importing the module)
        "connection.execute(f'LISTEN {NOTIFY_CHANNEL}')",
    ],
)
def test_sql_scanner_passes(snippet: str) -> None:
    assert formatted_sql(snippet, "snippet", module="pgqueue.sql.common") == [], snippet


def test_constant_exception_needs_an_identifier_value() -> None:
    """An UPPER_CASE name only passes when it resolves to a safe identifier."""
    assert formatted_sql("conn.execute(f'SET x = {NAME_PATTERN}')", "s", module="pgqueue.config")
    assert formatted_sql("conn.execute(f'LISTEN {NOT_DEFINED}')", "s", module="pgqueue.sql.common")


# --- the package ---------------------------------------------------------------------------


def test_scan_covers_the_whole_package() -> None:
    names = {name for name, _ in _modules()}
    assert {
        "pgqueue.sql.claim",
        "pgqueue.worker.notifier",
        "pgqueue.cli",
        "pgqueue.embedded",
    } <= names
    assert any(name.startswith("pgqueue.migrations.versions.") for name in names)


def test_no_pickle_anywhere_in_pgqueue() -> None:
    findings = [f for name, path in _modules() for f in pickle_imports(path.read_text(), name)]
    assert findings == []


def test_no_sql_built_by_string_formatting_in_pgqueue() -> None:
    findings = []
    for name, path in _modules():
        importable = None if ".migrations.versions." in name else name
        findings.extend(formatted_sql(path.read_text(), name, importable))
    assert findings == []


@pytest.mark.parametrize("pattern", [NAME_PATTERN, TASK_NAME_PATTERN])
def test_identifier_patterns_exclude_every_sql_metacharacter(pattern: re.Pattern[str]) -> None:
    for char in "'\"$%\\;`/*()[]{}=, \t\r\n\x00\u2028é":
        assert pattern.fullmatch(f"a{char}b") is None, repr(char)
    assert pattern.fullmatch("a" * 63) and not pattern.fullmatch("a" * 64)
