"""The layers of ``pgqueue`` hold: no import cycle among its modules, no private name imported
from another of its modules, the statements of ``pgqueue.sql`` imported and run by the data
layer (``pgqueue.data``) only, and no module much over 500 lines.

The graph is read from the source with ``ast``, so it holds every import: module level, under
``TYPE_CHECKING`` and inside functions alike. A package's ``__init__`` counts as the package's
module; the implicit import of parent packages is not an edge (Python runs a package's
``__init__`` before any of its submodules, whoever imports them). Private means a name with one
leading underscore: ``from pgqueue.x import _y``, ``x._y`` on an imported pgqueue module, or a
private module (``pgqueue.a._b``) imported from outside its own package ``pgqueue.a``.

The data layer's rules and the size limit each have an allowlist of today's exceptions, meant to
shrink: an entry that no longer breaks its rule fails the check too, so the lists stay current.

Run ``python tests/unit/test_import_layers.py`` to print what breaks these rules, one line each
(cycles, private imports, statements imported or run outside the data layer, long modules, and
allowlist entries that no longer break their rule): nothing when every check passes, and then
it exits 0.
"""

from __future__ import annotations

import ast
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import pytest

PACKAGE_ROOT = Path(__file__).resolve().parents[2] / "pgqueue"


@dataclass(frozen=True, slots=True)
class PrivateUse:
    """One use of another pgqueue module's private name."""

    importer: str
    line: int
    name: str

    def __str__(self) -> str:
        return f"{self.importer}:{self.line} uses {self.name}"


def module_name(path: Path, root: Path) -> str:
    """``pgqueue/worker/engine.py`` -> ``pgqueue.worker.engine``; a package's ``__init__.py``
    -> the package."""
    parts = list(path.relative_to(root.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def modules(root: Path = PACKAGE_ROOT) -> dict[str, tuple[Path, bool]]:
    """Every module under ``root``: name -> (path, is a package)."""
    found: dict[str, tuple[Path, bool]] = {}
    for path in sorted(root.rglob("*.py")):
        found[module_name(path, root)] = (path, path.name == "__init__.py")
    return found


def _absolute(node: ast.ImportFrom, importer: str, is_package: bool) -> str:
    if node.level == 0:
        return node.module or ""
    base = importer.split(".")
    # A package's own module is its __init__: level 1 is the package itself.
    drop = node.level - 1 if is_package else node.level
    base = base[: len(base) - drop] if drop else base
    return ".".join([*base, node.module] if node.module else base)


def _private_part(target: str, importer: str) -> str | None:
    """The private component of module ``target`` that ``importer`` may not reach, if any."""
    parts = target.split(".")
    for index, part in enumerate(parts):
        if _is_private(part):
            owner = ".".join(parts[:index])
            if importer != owner and not importer.startswith(owner + "."):
                return ".".join(parts[: index + 1])
    return None


def _is_private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _imports(
    tree: ast.Module, importer: str, is_package: bool, known: dict[str, tuple[Path, bool]]
) -> Iterator[tuple[str, int, str | None]]:
    """``(imported module, line, name bound to that module or None)`` for every import."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name in known:
                    yield alias.name, node.lineno, alias.asname
        elif isinstance(node, ast.ImportFrom):
            source = _absolute(node, importer, is_package)
            if source not in known:
                continue
            for alias in node.names:
                submodule = f"{source}.{alias.name}"
                if submodule in known:
                    yield submodule, node.lineno, alias.asname or alias.name
                else:
                    yield source, node.lineno, None


def analyse(root: Path = PACKAGE_ROOT) -> tuple[dict[str, set[str]], list[PrivateUse]]:
    """The import graph of the modules under ``root`` and the private names they import."""
    known = modules(root)
    graph: dict[str, set[str]] = {name: set() for name in known}
    private: list[PrivateUse] = []
    for importer, (path, is_package) in known.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        bound: dict[str, str] = {}
        for target, line, alias in _imports(tree, importer, is_package, known):
            if target != importer:
                graph[importer].add(target)
            hidden = _private_part(target, importer)
            if hidden is not None:
                private.append(PrivateUse(importer, line, hidden))
            if alias is not None:
                bound[alias] = target
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                source = _absolute(node, importer, is_package)
                if source in known and source != importer:
                    private.extend(
                        PrivateUse(importer, node.lineno, f"{source}.{alias.name}")
                        for alias in node.names
                        if _is_private(alias.name) and f"{source}.{alias.name}" not in known
                    )
            elif (
                isinstance(node, ast.Attribute)
                and isinstance(node.value, ast.Name)
                and node.value.id in bound
                and bound[node.value.id] != importer
                and _is_private(node.attr)
            ):
                private.append(
                    PrivateUse(importer, node.lineno, f"{bound[node.value.id]}.{node.attr}")
                )
    return graph, sorted(set(private), key=lambda use: (use.importer, use.line, use.name))


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph.get(node, ())):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component: list[str] = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return sorted(found)


def cycle_edges(graph: dict[str, set[str]]) -> set[tuple[str, str]]:
    """The edges that lie inside a cycle."""
    edges: set[tuple[str, str]] = set()
    for component in cycles(graph):
        members = set(component)
        edges.update((a, b) for a in component for b in graph[a] if b in members)
    return edges


# -- the data layer and module size -------------------------------------------------------------

# The statements every module may import: connection management (LISTEN and what its listener
# hears, DISCARD, CREATE DATABASE, the settings a transaction begins with behind a pooler, the
# embedded server's check of its data directory), which belongs to whoever owns the connection
# rather than to the data layer.
SERVER_STATEMENTS = "pgqueue.sql.server"

# Modules outside ``pgqueue.data`` that still import ``pgqueue.sql``; each should move its data
# part into ``pgqueue.data`` and leave this list.
SQL_IMPORT_ALLOWLIST = frozenset[str]()

# The executors themselves: they implement ``rows`` (and call it on each other) rather than
# run statements of their own.
EXECUTOR_MODULES = frozenset({"pgqueue.db", "pgqueue.driver"})

# Modules outside ``pgqueue.data`` that still run statements through an executor's ``rows``.
ROWS_CALL_ALLOWLIST = frozenset[str]()

ROWS_METHODS = frozenset({"rows", "timed_rows"})

MAX_LINES = 550

# Modules over ``MAX_LINES`` today; each should be split and leave this list.
LONG_MODULE_ALLOWLIST = frozenset[str]()


def _outside(module: str, packages: tuple[str, ...]) -> bool:
    return not any(module == p or module.startswith(p + ".") for p in packages)


def sql_importers(root: Path = PACKAGE_ROOT) -> dict[str, set[str]]:
    """Modules outside the data and statement layers that import a statement module other than
    the server's: importer -> the statement modules it imports."""
    top = root.name
    layers = (f"{top}.data", f"{top}.sql")
    graph, _ = analyse(root)
    found: dict[str, set[str]] = {}
    for importer, targets in graph.items():
        if not _outside(importer, layers):
            continue
        statements = {
            t for t in targets if not _outside(t, (f"{top}.sql",)) and t != f"{top}.sql.server"
        }
        if statements:
            found[importer] = statements
    return found


def rows_callers(root: Path = PACKAGE_ROOT) -> dict[str, list[int]]:
    """Modules outside the data and statement layers that call a method named ``rows`` or
    ``timed_rows`` (an executor's): module -> the lines of those calls."""
    top = root.name
    layers = (f"{top}.data", f"{top}.sql")
    found: dict[str, list[int]] = {}
    for name, (path, _) in modules(root).items():
        if not _outside(name, layers):
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        lines = sorted(
            node.lineno
            for node in ast.walk(tree)
            if isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr in ROWS_METHODS
        )
        if lines:
            found[name] = lines
    return found


def long_modules(root: Path = PACKAGE_ROOT, limit: int = MAX_LINES) -> dict[str, int]:
    """Modules over ``limit`` lines, migration revisions aside: module -> its line count."""
    found: dict[str, int] = {}
    for name, (path, _) in modules(root).items():
        if ".migrations.versions." in f"{name}.":
            continue
        count = len(path.read_text(encoding="utf-8").splitlines())
        if count > limit:
            found[name] = count
    return found


# -- the checks on pgqueue --------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Breaches:
    """What breaks each rule in pgqueue (allowlisted exceptions left out), and the allowlist
    entries that no longer break their rule."""

    cycles: list[list[str]]
    cycle_edges: list[tuple[str, str]]
    private: list[PrivateUse]
    sql_importers: dict[str, list[str]]
    rows_callers: dict[str, list[int]]
    long_modules: dict[str, int]
    stale: dict[str, list[str]]

    def lines(self) -> list[str]:
        """One line per breach; none when every check passes."""
        out = [f"cycle: {' <-> '.join(c)}" for c in self.cycles]
        out += [f"  edge in a cycle: {a} -> {b}" for a, b in self.cycle_edges]
        out += [f"private: {use}" for use in self.private]
        out += [
            f"imports pgqueue.sql outside pgqueue.data: {m} -> {', '.join(s)}"
            for m, s in sorted(self.sql_importers.items())
        ]
        out += [
            f"calls rows() outside pgqueue.data: {m} at lines {lines}"
            for m, lines in sorted(self.rows_callers.items())
        ]
        out += [f"over {MAX_LINES} lines: {m} ({n})" for m, n in sorted(self.long_modules.items())]
        out += [
            f"listed in {allowlist} but no longer breaks its rule: {m}"
            for allowlist, names in self.stale.items()
            for m in names
        ]
        return out


@cache
def breaches(root: Path = PACKAGE_ROOT) -> Breaches:
    """What breaks the rules among the modules under ``root`` (read once per process)."""
    graph, private = analyse(root)
    importers = sql_importers(root)
    callers = {m: lines for m, lines in rows_callers(root).items() if m not in EXECUTOR_MODULES}
    long = long_modules(root)
    stale = {
        name: sorted(allowlist - found.keys())
        for name, allowlist, found in (
            ("SQL_IMPORT_ALLOWLIST", SQL_IMPORT_ALLOWLIST, importers),
            ("ROWS_CALL_ALLOWLIST", ROWS_CALL_ALLOWLIST, callers),
            ("LONG_MODULE_ALLOWLIST", LONG_MODULE_ALLOWLIST, long),
        )
        if allowlist - found.keys()
    }
    return Breaches(
        cycles=cycles(graph),
        cycle_edges=sorted(cycle_edges(graph)),
        private=private,
        sql_importers={m: sorted(s) for m, s in importers.items() if m not in SQL_IMPORT_ALLOWLIST},
        rows_callers={m: v for m, v in callers.items() if m not in ROWS_CALL_ALLOWLIST},
        long_modules={m: n for m, n in long.items() if m not in LONG_MODULE_ALLOWLIST},
        stale=stale,
    )


@pytest.mark.slow
def test_no_import_cycle_among_pgqueue_modules() -> None:
    found = breaches()
    assert found.cycles == [], "import cycles: " + "; ".join(
        " <-> ".join(c) + " via " + ", ".join(f"{a}->{b}" for a, b in found.cycle_edges)
        for c in found.cycles
    )


def test_no_pgqueue_module_imports_a_private_name_of_another() -> None:
    assert [str(use) for use in breaches().private] == []


def test_only_the_data_layer_imports_the_statements() -> None:
    found = breaches()
    assert found.sql_importers == {}, (
        "import pgqueue.sql outside pgqueue.data (move the data part there)"
    )
    assert "SQL_IMPORT_ALLOWLIST" not in found.stale, "no longer import it: unlist them"


def test_only_the_data_layer_runs_statements_through_an_executor() -> None:
    found = breaches()
    assert found.rows_callers == {}, (
        "call an executor's rows() outside pgqueue.data (move it there)"
    )
    assert "ROWS_CALL_ALLOWLIST" not in found.stale, "no longer call it: unlist them"


def test_no_module_is_much_over_500_lines() -> None:
    found = breaches()
    assert found.long_modules == {}, f"modules over {MAX_LINES} lines (split them)"
    assert "LONG_MODULE_ALLOWLIST" not in found.stale, "short enough now: unlist them"


# -- the checker itself, on small made-up packages --------------------------------------------


def _package(tmp_path: Path, files: dict[str, str]) -> Path:
    root = tmp_path / "pkg"
    for name, source in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(source, encoding="utf-8")
    return root


def test_cycles_hidden_under_type_checking_and_in_functions_are_found(tmp_path: Path) -> None:
    root = _package(
        tmp_path,
        {
            "__init__.py": "",
            "a.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg.b import B\n",
            "b.py": "def f():\n    from pkg import c\n",
            "c.py": "from . import a\n",
            "d.py": "import pkg.a\n",
        },
    )
    graph, _ = analyse(root)
    assert cycles(graph) == [["pkg.a", "pkg.b", "pkg.c"]]
    assert cycle_edges(graph) == {("pkg.a", "pkg.b"), ("pkg.b", "pkg.c"), ("pkg.c", "pkg.a")}


def test_a_layered_package_has_no_cycle(tmp_path: Path) -> None:
    root = _package(
        tmp_path,
        {
            "__init__.py": "from pkg.top import Top\n",
            "top.py": "from pkg.low import f\n",
            "low.py": "import json\n",
        },
    )
    graph, private = analyse(root)
    assert cycles(graph) == []
    assert graph["pkg"] == {"pkg.top"}
    assert private == []


def test_private_names_and_private_modules_from_elsewhere_are_reported(tmp_path: Path) -> None:
    root = _package(
        tmp_path,
        {
            "__init__.py": "",
            "low.py": "_KEY = 1\ndef _helper(): ...\n__all__ = []\n",
            "user.py": (
                "from pkg.low import _KEY, __all__\nfrom pkg import low\nlow._helper()\n"
                "from pkg.sub._impl import Thing\n"
            ),
            "sub/__init__.py": "from pkg.sub._impl import Thing\n",
            "sub/_impl.py": "class Thing: ...\n",
        },
    )
    _, private = analyse(root)
    assert [str(use) for use in private] == [
        "pkg.user:1 uses pkg.low._KEY",
        "pkg.user:3 uses pkg.low._helper",
        "pkg.user:4 uses pkg.sub._impl",
    ]


def test_statement_imports_and_rows_calls_outside_the_data_layer_are_found(
    tmp_path: Path,
) -> None:
    root = _package(
        tmp_path,
        {
            "__init__.py": "",
            "sql/__init__.py": "",
            "sql/claim.py": "",
            "sql/server.py": "",
            "data/__init__.py": "",
            "data/claim.py": "from pkg.sql import claim\ndef f(ex):\n    return ex.rows(1)\n",
            "api.py": "from pkg.data import claim\nfrom pkg.sql.server import listen\n",
            "sneaky.py": (
                "def f(ex):\n    from pkg.sql import claim\n    return ex.timed_rows(claim.x)\n"
            ),
        },
    )
    assert sql_importers(root) == {"pkg.sneaky": {"pkg.sql.claim"}}
    assert rows_callers(root) == {"pkg.sneaky": [3]}


def test_long_modules_are_found_migration_revisions_aside(tmp_path: Path) -> None:
    long_text = "x = 1\n" * 12
    root = _package(
        tmp_path,
        {
            "__init__.py": "",
            "short.py": "x = 1\n",
            "long.py": long_text,
            "migrations/__init__.py": "",
            "migrations/versions/pkg_0001.py": long_text,
        },
    )
    assert long_modules(root, limit=10) == {"pkg.long": 12}


if __name__ == "__main__":
    found_lines = breaches().lines()
    for found_line in found_lines:
        print(found_line)
    sys.exit(1 if found_lines else 0)
