"""MkDocs hook: writes the pages that must follow the source at build time.

The page ``reference/schema.md`` holds the marker ``<!-- schema -->``; each of pgqueue's tables
replaces it with its description (the model's docstring) and its ``CREATE TABLE`` and
``CREATE INDEX`` statements as PostgreSQL receives them. The models are reached through the
public ``pgqueue.Job``, whose MetaData holds every pgqueue table.

The page ``explanation/architecture.md`` holds the marker ``<!-- import-graph -->``: the table
of which module imports which, read from the source by the layer test's own ``analyse``
(``tests/unit/test_import_layers.py``), so the page can never disagree with the test.
"""

from __future__ import annotations

import importlib.util
import inspect
import sys
from pathlib import Path
from typing import Any

from sqlalchemy.dialects import postgresql
from sqlalchemy.schema import CreateIndex, CreateTable

MARKER = "<!-- schema -->"
IMPORT_GRAPH_MARKER = "<!-- import-graph -->"
LAYER_TEST = Path(__file__).resolve().parents[1] / "tests" / "unit" / "test_import_layers.py"


def schema_markdown() -> str:
    import pgqueue

    dialect = postgresql.dialect()  # type: ignore[no-untyped-call]
    docs = {
        mapper.local_table.name: inspect.getdoc(mapper.class_) or ""
        for mapper in pgqueue.Job.registry.mappers
        if mapper.local_table is not None
    }
    parts = []
    for table in pgqueue.Job.metadata.sorted_tables:
        statements = [str(CreateTable(table).compile(dialect=dialect)).strip() + ";"]
        statements += [
            str(CreateIndex(index).compile(dialect=dialect)).strip() + ";"
            for index in sorted(table.indexes, key=lambda index: index.name or "")
        ]
        description = docs.get(table.name, "").replace("``", "`")
        parts.append(
            f"## `{table.name}`\n\n{description}\n\n```sql\n" + "\n\n".join(statements) + "\n```\n"
        )
    return "\n".join(parts)


def import_graph_markdown() -> str:
    spec = importlib.util.spec_from_file_location("pgqueue_layer_test", LAYER_TEST)
    assert spec is not None and spec.loader is not None
    layer_test = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = layer_test  # its dataclasses look their module up there
    spec.loader.exec_module(layer_test)
    graph, _ = layer_test.analyse()

    def short(name: str) -> str:
        return name.removeprefix("pgqueue.") if name != "pgqueue" else "pgqueue"

    rows = ["| Module | Imports from pgqueue |", "| --- | --- |"]
    for module in sorted(graph):
        imports = ", ".join(short(target) for target in sorted(graph[module])) or "nothing"
        rows.append(f"| `{short(module)}` | {imports} |")
    return "\n".join(rows) + "\n"


def on_page_markdown(markdown: str, page: Any, **kwargs: Any) -> str:
    if MARKER in markdown:
        markdown = markdown.replace(MARKER, schema_markdown())
    if IMPORT_GRAPH_MARKER in markdown:
        markdown = markdown.replace(IMPORT_GRAPH_MARKER, import_graph_markdown())
    return markdown
