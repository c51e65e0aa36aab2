"""The revisions shipped in ``pgqueue/migrations/versions`` (their ids and the head), read from
the files' text rather than by Alembic, which imports every revision and costs a tenth of a
second or more to import itself: every command checks the schema against the head at its start
(``pgqueue.migrations.check_schema``), and most of them never need Alembic otherwise.

A file is read as ``alembic revision`` writes it (with ``script.py.mako``): one module-level
``revision = "..."`` and one ``down_revision = "..."`` (or ``None``). Should any file not read
that way (a merge revision's tuple, say), or the lineage have other than one head, ``lineage``
answers None and its callers ask Alembic, which then decides as it always did.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from pgqueue.migrations.host import PGQUEUE_VERSIONS

# ``revision: str = "pgqueue_0001"`` (annotated or not), at the start of a line.
_REVISION: Final = re.compile(r"^revision\b[^=\n]*=\s*(?P<value>.*?)\s*$", re.MULTILINE)
_DOWN_REVISION: Final = re.compile(r"^down_revision\b[^=\n]*=\s*(?P<value>.*?)\s*$", re.MULTILINE)
_QUOTED: Final = re.compile(r"""(["'])(?P<text>[^"'\\]+)\1""")


@dataclass(frozen=True)
class Lineage:
    """pgqueue's shipped revisions: every id, and the one no other revision follows."""

    revisions: frozenset[str]
    head: str


def lineage(versions: Path = PGQUEUE_VERSIONS) -> Lineage | None:
    """The lineage of the revision files in ``versions`` (those Alembic reads: ``*.py`` but
    ``__init__*`` and editors' ``.#*``), or None when a file does not read as described above
    or there is not exactly one head. Read anew on each call: a few milliseconds."""
    revisions: set[str] = set()
    followed: set[str] = set()
    for path in versions.glob("*.py"):
        if path.name.startswith(("__init__", ".#")):
            continue
        text = path.read_text(encoding="utf-8")
        revision = _only_value(_REVISION, text)
        down_revision = _only_value(_DOWN_REVISION, text)
        if revision is None or down_revision is None or revision in revisions:
            return None
        revisions.add(revision)
        if down_revision != "None":
            followed.add(down_revision)
    heads = revisions - followed
    if len(heads) != 1 or not followed <= revisions:
        return None
    return Lineage(frozenset(revisions), heads.pop())


def _only_value(pattern: re.Pattern[str], text: str) -> str | None:
    """The one assignment's value of ``pattern`` in ``text``: a quoted id's text, or
    ``"None"``; None when there is not exactly one such assignment, or it is something else."""
    found = pattern.findall(text)
    if len(found) != 1:
        return None
    value: str = found[0]
    if value == "None":
        return value
    quoted = _QUOTED.fullmatch(value)
    return None if quoted is None else quoted.group("text")
