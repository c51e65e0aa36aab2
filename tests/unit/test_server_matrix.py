"""The server matrix's list (``tests/server_matrix.py``) names real integration test files, and
the contributing guide lists exactly those files: a file added to one and not the other would
run on one server while the guide says every server, or the reverse."""

from __future__ import annotations

import re
from pathlib import Path

from server_matrix import ONE_SERVER, SERVER_MATRIX

TESTS = Path(__file__).resolve().parent.parent
GUIDE = TESTS.parent / "docs" / "contributing.md"


def test_every_file_in_the_matrix_is_an_integration_test_file() -> None:
    for relative in SERVER_MATRIX:
        assert relative.startswith("integration/test_"), relative
        assert (TESTS / relative).is_file(), f"{relative} does not exist"


def test_the_contributing_guide_lists_exactly_the_matrix() -> None:
    listed = re.findall(r"^\| `tests/(\S+\.py)` \|", GUIDE.read_text(), flags=re.MULTILINE)
    assert sorted(listed) == sorted(SERVER_MATRIX)


def test_every_test_run_once_is_a_test_of_a_matrix_file() -> None:
    for test in ONE_SERVER:
        relative, name = test.split("::")
        assert relative in SERVER_MATRIX, test
        assert f"\ndef {name}(" in (TESTS / relative).read_text(), f"{test} does not exist"
