"""``pgqueue jobs``' search options refuse a bad value in one line, exit code 2, before the
command connects: the database URL given here points at no server, so any other answer would
be a connection error."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from pgqueue.cli import main

NOWHERE = "postgresql+psycopg://nobody@127.0.0.1:1/none"


@pytest.mark.parametrize(
    ("options", "problem"),
    [
        (["--error-contains", "boom"], "needs a window"),
        (["--json-equals", "kwargs.user=1"], "needs a window"),
        (["--since", "1d", "--json-equals", "kwargs.user"], "PATH=JSON"),
        (["--since", "1d", "--json-equals", "kwargs.user=abc"], "is not JSON"),
        (["--since", "1d", "--json-equals", "user.id=1"], "must start with args, kwargs, result"),
        (["--since", "1d", "--json-equals", "kwargs..id=1"], "has an empty key"),
        (["--since", "1d", "--json-contains", 'args="a\\u0000b"'], "holds a NUL character"),
        (["--since", "1d", "--json-equals", "args.0=1", "--json-contains", "args=[1]"], "not both"),
        (["--since", "yesterday"], "is not a time"),
        (["--since", "1h", "--until", "2h"], "must be before until"),
        (["--since", "99999d"], "over 3650 days"),
        (["--since", "1d", "--error-contains", "a\x00b"], "without NUL"),
        (["--since", "1d", "--scan", "0"], "scan must be an int from 1"),
        (["--id", "0"], "job id must be a positive int"),
        (["--id", "5", "--before", "9"], "names one job"),
    ],
)
def test_a_bad_search_option_is_one_line_before_connecting(
    options: list[str], problem: str
) -> None:
    result = CliRunner().invoke(main, ["jobs", "--database-url", NOWHERE, *options])
    assert result.exit_code == 2, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.output
    assert problem in lines[0], lines[0]
