"""Each list of public names is written once.

A module's public names are the ones it defines without a leading underscore; a package that
re-exports a name imports it as ``from m import X as X``, which mypy and ruff read as a
re-export. ``__all__`` is written only where something reads it: the modules users import with
``*`` or whose members the API reference lists (``EXPORTING``), and there it is derived when the
names are listed elsewhere already.

``pgqueue`` imports its names on first use (PEP 562): type checkers read its ``TYPE_CHECKING``
imports, ``__getattr__`` its table of modules, and ``__all__`` is derived from that table. The
test holds the imports and the table to the same names from the same modules.
"""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pgqueue

PACKAGE_DIR = Path(pgqueue.__file__).parent

# The modules that define ``__all__``, and what reads it there.
EXPORTING = {
    "pgqueue": "``from pgqueue import *`` and ``dir(pgqueue)``",
    "pgqueue.admin": "``from pgqueue.admin import *``",
    "pgqueue.admin_values": "the names ``pgqueue.admin`` re-exports",
    "pgqueue.admin_records": "the names ``pgqueue.admin`` re-exports",
    "pgqueue.contrib.flask": "the API reference lists its members",
    "pgqueue.testing": "the API reference lists its members",
}


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE_DIR.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _defines_all(tree: ast.Module) -> bool:
    return any(
        isinstance(node, ast.Assign | ast.AugAssign | ast.AnnAssign)
        and any(
            isinstance(target, ast.Name) and target.id == "__all__"
            for target in (node.targets if isinstance(node, ast.Assign) else [node.target])
        )
        for node in tree.body
    )


def test_only_the_exporting_modules_define_all() -> None:
    found = {
        _module_name(path)
        for path in sorted(PACKAGE_DIR.rglob("*.py"))
        if _defines_all(ast.parse(path.read_text(encoding="utf-8")))
    }
    assert found == EXPORTING.keys(), (
        "__all__ outside the exporting modules: re-export with `from m import X as X`"
    )


def _lazy_names() -> tuple[dict[str, str], dict[str, str]]:
    """``pgqueue/__init__.py``'s type-checking imports and its table: name -> module."""
    tree = ast.parse((PACKAGE_DIR / "__init__.py").read_text(encoding="utf-8"))
    imported: dict[str, str] = {}
    table: dict[str, str] = {}
    for node in tree.body:
        if isinstance(node, ast.If):
            for statement in node.body:
                assert isinstance(statement, ast.ImportFrom) and statement.module
                for alias in statement.names:
                    assert alias.asname == alias.name, f"write `{alias.name} as {alias.name}`"
                    imported[alias.name] = (
                        f"{statement.module}.{alias.name}"
                        if statement.module == "pgqueue"
                        else statement.module
                    )
        elif isinstance(node, ast.Assign) and isinstance(node.value, ast.Dict):
            for key, value in zip(node.value.keys, node.value.values, strict=True):
                assert isinstance(key, ast.Constant) and isinstance(value, ast.Constant)
                table[key.value] = value.value
    return imported, table


def test_the_lazy_names_are_the_typed_names() -> None:
    imported, table = _lazy_names()
    assert imported.pop("backoff") == "pgqueue.backoff"  # a module, imported by its own name
    assert table == imported


def test_every_exported_name_is_the_object_of_its_module() -> None:
    imported, _ = _lazy_names()
    assert sorted(pgqueue.__all__) == sorted([*imported, "__version__"])
    assert dir(pgqueue) == sorted(pgqueue.__all__)
    for name, module in imported.items():
        home = importlib.import_module(module)
        expected = home if module.endswith("." + name) else getattr(home, name)
        assert getattr(pgqueue, name) is expected, name
