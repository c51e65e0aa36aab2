"""The search filters' values and checks (``pgqueue.job_search``, ``admin_values.list_arguments``):
a bad path, value, window, error text, scan or id is a ValidationError naming the problem, and
a good ``JsonMatch`` carries the column, the keys and the JSON text its statement binds."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest

from pgqueue.admin import JsonMatch, list_arguments
from pgqueue.errors import ValidationError

NOW = dt.datetime(2026, 11, 30, tzinfo=dt.UTC)


def test_a_match_splits_its_path_and_encodes_its_value() -> None:
    match = JsonMatch("kwargs.user.0", {"b": [1.5, None, True], "a": "é"}, contains=True)
    assert (match.column, match.keys) == ("kwargs", ("user", "0"))
    assert match.encoded == '{"b":[1.5,null,true],"a":"é"}'
    assert JsonMatch("result", 3).keys == ()
    assert JsonMatch.parse(' args.0 = "a=b" ').value == "a=b"
    assert JsonMatch.parse("args.0=[1]", contains=True).describe() == "args.0 contains [1]"


@pytest.mark.parametrize(
    ("path", "value", "problem"),
    [
        ("", 1, "path must be 1 to 1000 characters"),
        ("args\x00", 1, "without NUL"),
        ("errors.0", 1, "must start with args, kwargs, result"),
        ("kwargs.", 1, "has an empty key"),
        ("kwargs." + ".".join("k" * 33), 1, "deeper than 32 keys"),
        ("args.0", float("nan"), "must be finite"),
        ("args.0", {1: "x"}, "has a key that is not a str"),
        ("args.0", {"a\x00": 1}, "has a key that is not a str without NUL"),
        ("args.0", ["a\x00"], "holds a NUL character"),
        ("args.0", {1, 2}, "must be JSON"),
        ("args.0", (1, 2), "must be JSON"),
        ("args.0", "x" * 10_001, "at most 10000"),
    ],
)
def test_a_bad_match_names_its_problem(path: str, value: Any, problem: str) -> None:
    with pytest.raises(ValidationError, match=problem):
        JsonMatch(path, value)


def test_a_deeply_nested_value_is_refused() -> None:
    value: Any = 1
    for _ in range(40):
        value = [value]
    with pytest.raises(ValidationError, match="nests deeper than 32"):
        JsonMatch("args", value)
    with pytest.raises(ValidationError, match="is not JSON"):
        JsonMatch.parse("args=" + "[" * 100_000)


def _arguments(**given: Any) -> Any:
    defaults: dict[str, Any] = dict(
        queue=None, state=None, task_name=None, before=None, after=None, limit=50
    )
    return list_arguments(**{**defaults, **given})


@pytest.mark.parametrize(
    ("given", "problem"),
    [
        ({"error_contains": "boom"}, "needs a window"),
        ({"json_match": JsonMatch("args", [])}, "needs a window"),
        ({"since": NOW, "json_match": "args.0=1"}, "must be a JsonMatch"),
        ({"since": dt.datetime(2026, 1, 1)}, "since must be a timezone-aware datetime"),
        ({"until": "2026-01-01"}, "until must be a timezone-aware datetime"),
        ({"since": NOW, "until": NOW}, "must be before until"),
        ({"since": NOW, "time_column": "run_at"}, "time_column must be one of"),
        ({"since": NOW, "error_contains": ""}, "error_contains must be 1 to 1000"),
        ({"since": NOW, "scan": 0}, "scan must be an int from 1 to 1000000"),
        ({"since": NOW, "scan": 1_000_001}, "scan must be an int"),
        ({"since": NOW, "scan": True}, "scan must be an int"),
        ({"job_id": 0}, "job id must be a positive int"),
        ({"job_id": 2**63}, "at most"),
        ({"job_id": 3, "after": 2}, "names one job"),
    ],
)
def test_bad_search_arguments_are_refused(given: dict[str, Any], problem: str) -> None:
    with pytest.raises(ValidationError, match=problem):
        _arguments(**given)


def test_what_makes_a_listing_a_search() -> None:
    assert not _arguments(queue="q").searching
    assert not _arguments(job_id=5).searching
    assert _arguments(until=NOW).searching
    assert _arguments(job_id=5, error_contains="x").error_contains == "x"  # no window needed
