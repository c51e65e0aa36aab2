"""MkDocs hook: writes the SQL schema reference from pgqueue's models at build time.

The page ``reference/schema.md`` holds the marker ``<!-- schema -->``; each of pgqueue's tables
replaces it with its description (the model's docstring) and its ``CREATE TABLE`` and
``CREATE INDEX`` statements as PostgreSQL receives them. The models are reached through the
public ``pgqueue.Job``, whose MetaData holds every pgqueue table.
"""

from __future__ import annotations

import inspect
from typing import Any

from sqlalchemy.dialects import postgresql
from sqlalchemy.schema import CreateIndex, CreateTable

MARKER = "<!-- schema -->"


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


def on_page_markdown(markdown: str, page: Any, **kwargs: Any) -> str:
    if MARKER in markdown:
        return markdown.replace(MARKER, schema_markdown())
    return markdown
