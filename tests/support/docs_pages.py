"""The documentation's pages and the code blocks in them, as the docs tests read them.

A fenced block is a run of lines between an opening fence (```lang, possibly indented, as in a
list item) and its closing fence. A page marks a block that cannot run on its own with an HTML
comment on the line right before its fence: ``<!-- not run: <why> -->``.
"""

from __future__ import annotations

import re
import textwrap
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
# The pages whose Python blocks the tests run: the README's example, the tutorial and every
# how-to guide.
RUN_PAGES = [ROOT / "README.md", DOCS / "tutorial.md", *sorted((DOCS / "how-to").glob("*.md"))]

_FENCE = re.compile(r"^(?P<indent>[ \t]*)(?P<fence>`{3,}|~{3,})(?P<info>[^`]*)$")
_NOT_RUN = re.compile(r"^\s*<!--\s*not run:\s*(?P<why>.+?)\s*-->\s*$")


@dataclass(frozen=True)
class CodeBlock:
    """One fenced block of a page."""

    page: Path
    line: int  # 1-based line of the opening fence
    language: str
    code: str
    not_run: str | None  # the reason given by a ``<!-- not run: ... -->`` comment, if any


def code_blocks(page: Path) -> list[CodeBlock]:
    """The fenced blocks of ``page``, in order."""
    lines = page.read_text(encoding="utf-8").splitlines()
    blocks: list[CodeBlock] = []
    i = 0
    while i < len(lines):
        opening = _FENCE.match(lines[i])
        if opening is None:
            i += 1
            continue
        fence, indent = opening["fence"], opening["indent"]
        language = opening["info"].strip().split(" ")[0] if opening["info"].strip() else ""
        body: list[str] = []
        j = i + 1
        while j < len(lines) and lines[j].strip() != fence:
            body.append(lines[j])
            j += 1
        previous = lines[i - 1] if i > 0 else ""
        marker = _NOT_RUN.match(previous)
        code = textwrap.dedent("\n".join(line.removeprefix(indent) for line in body))
        blocks.append(
            CodeBlock(page, i + 1, language, code + "\n", marker["why"] if marker else None)
        )
        i = j + 1
    return blocks


def python_blocks(page: Path) -> list[CodeBlock]:
    return [block for block in code_blocks(page) if block.language in ("python", "py")]
