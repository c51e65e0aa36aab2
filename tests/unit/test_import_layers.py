"""The layers of ``pgqueue`` hold: no import cycle among its modules and no private name
imported from another of its modules.

The graph is read from the source with ``ast``, so it holds every import: module level, under
``TYPE_CHECKING`` and inside functions alike. A package's ``__init__`` counts as the package's
module; the implicit import of parent packages is not an edge (Python runs a package's
``__init__`` before any of its submodules, whoever imports them). Private means a name with one
leading underscore: ``from pgqueue.x import _y``, ``x._y`` on an imported pgqueue module, or a
private module (``pgqueue.a._b``) imported from outside its own package ``pgqueue.a``.

Run ``python tests/unit/test_import_layers.py`` to print the graph's cycles and private imports.
"""

from __future__ import annotations

import ast
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

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


# -- the checks on pgqueue --------------------------------------------------------------------


def test_no_import_cycle_among_pgqueue_modules() -> None:
    graph, _ = analyse()
    remaining = cycles(graph)
    assert remaining == [], "import cycles: " + "; ".join(
        " <-> ".join(c) + " via " + ", ".join(sorted(f"{a}->{b}" for a, b in cycle_edges(graph)))
        for c in remaining
    )


def test_no_pgqueue_module_imports_a_private_name_of_another() -> None:
    _, private = analyse()
    assert [str(use) for use in private] == []


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


if __name__ == "__main__":
    found_graph, found_private = analyse()
    for component in cycles(found_graph):
        print("cycle:", " <-> ".join(component))
    for a, b in sorted(cycle_edges(found_graph)):
        print(f"  edge in a cycle: {a} -> {b}")
    for use in found_private:
        print("private:", use)
    sys.exit(1 if cycles(found_graph) or found_private else 0)
