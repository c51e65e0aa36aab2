"""Every Python block of the README, the tutorial and the how-to guides runs, as a reader would run it.

The blocks of one page run in order, in one namespace, in a fresh migrated database whose URL
is in ``$PGQUEUE_DATABASE_URL`` (where the pages tell readers to put theirs), from an empty
working directory. A block marked ``<!-- not run: ... -->`` is skipped; the reason must say why.
"""

from __future__ import annotations

import os
import sys
import types
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import Engine
from sqlalchemy.engine import URL
from support.docs_pages import DOCS, ROOT, RUN_PAGES, python_blocks

from pgqueue import PgQueue


@pytest.fixture
def reader_environment(
    database_url: URL, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[str]:
    url = database_url.render_as_string(hide_password=False)
    monkeypatch.setenv("PGQUEUE_DATABASE_URL", url)
    monkeypatch.chdir(tmp_path)
    yield url


def test_the_pages_to_run_exist() -> None:
    assert (DOCS / "tutorial.md") in RUN_PAGES
    assert len(RUN_PAGES) >= 10


def test_skipped_blocks_say_why_and_stay_few() -> None:
    skipped = [
        block for page in RUN_PAGES for block in python_blocks(page) if block.not_run is not None
    ]
    for block in skipped:
        assert len(block.not_run or "") >= 10, f"{block.page.name}:{block.line}: say why"
    assert len(skipped) <= 8, [f"{block.page.name}:{block.line}" for block in skipped]


@pytest.mark.parametrize("page", [p for p in RUN_PAGES if python_blocks(p)], ids=lambda p: p.stem)
def test_page_code_runs(page: Path, reader_environment: str) -> None:
    # A module of its own, registered as a reader's module would be (SQLAlchemy resolves a
    # model's annotations through sys.modules).
    module = types.ModuleType(f"docs_{page.stem.replace('-', '_')}")
    module.__file__ = str(Path.cwd() / f"{module.__name__}.py")
    namespace = module.__dict__
    sys.modules[module.__name__] = module
    try:
        for block in python_blocks(page):
            if block.not_run is not None:
                continue
            where = f"{page.relative_to(ROOT)}:{block.line}"
            code = compile(block.code, where, "exec")
            try:
                exec(code, namespace)
            except Exception as error:
                raise AssertionError(f"the block at {where} failed: {error!r}") from error
    finally:
        del sys.modules[module.__name__]
        for value in list(namespace.values()):
            if isinstance(value, PgQueue | Engine):
                value.dispose()
        assert os.environ["PGQUEUE_DATABASE_URL"] == reader_environment
