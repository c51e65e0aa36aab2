"""``codec.load_json`` against the reference it stands in for, ``json.loads``: the same
value of the same types for every text ``json.loads`` reads, and a ``ValueError`` (the same
one) for every text it refuses, from ``str`` and from UTF-8 ``bytes`` alike. orjson does most
of the reading, so the explicit cases are the texts where orjson alone would answer otherwise:
refusing (NaN, infinities, lone surrogates), reading integers beyond 64 bits as floats, or
reading nesting Python refuses."""

from __future__ import annotations

import contextlib
import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from support.examples import examples
from support.same_values import same

from pgqueue import codec

_surrogate = st.integers(min_value=0xD800, max_value=0xDFFF).map(chr)
_text = st.text(max_size=12) | st.text(st.characters() | _surrogate, max_size=12)
_scalars = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.integers(min_value=-(2**64) - 2, max_value=2**64 + 2)
    | st.integers(min_value=-(2**200), max_value=2**200)
    | st.floats()  # NaN and infinities, which json.dumps writes as NaN and Infinity
    | _text
)
_values = st.recursive(
    _scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(_text, inner, max_size=4),
    max_leaves=16,
)
_dump_options = st.fixed_dictionaries(
    {
        "ensure_ascii": st.booleans(),
        "sort_keys": st.booleans(),
        "indent": st.sampled_from([None, 0, 2, "\t"]),
        "separators": st.sampled_from([None, (",", ":"), (" , ", " : ")]),
    }
)
_number = st.from_regex(
    r"-?(0|[1-9][0-9]{0,24})(\.[0-9]{1,24})?([eE][+-]?[0-9]{1,4})?", fullmatch=True
) | st.integers(min_value=-(2**66), max_value=2**66).map(str)
# Pieces of JSON and of near-JSON, joined at random: mostly refused text, some read.
_tokens = st.sampled_from(
    ["[", "]", "{", "}", ",", ":", '"', "\\", "u", "null", "true", " ", "\t", "\n", "\x0c",
     "\x00", "0", "1", "-", "+", ".", "e", '"a"', '"\\u00e9"', "\\ud800", "\\udc00", "NaN",
     "Infinity", "é", "\ufeff", "12345678901234567890"]
)  # fmt: skip


def _outcome(load: Any, data: bytes | str) -> tuple[str, Any]:
    try:
        return "value", load(data)
    except (ValueError, RecursionError) as exc:
        return type(exc).__name__, str(exc)


def _reads_as_json_loads(text: str) -> None:
    """``load_json`` of ``text``, and of its UTF-8 bytes when it has any, answers as
    ``json.loads(text)`` does."""
    expected = _outcome(json.loads, text)
    inputs: list[bytes | str] = [text]
    with contextlib.suppress(UnicodeEncodeError):  # a lone surrogate has no UTF-8 form
        inputs.append(text.encode())
    for data in inputs:
        kind, got = _outcome(codec.load_json, data)
        if expected[0] == "value":
            assert kind == "value" and same(got, expected[1]), (data, got, expected)
        else:
            # Both refuse, with an error of the same type (a ValueError, RecursionError for
            # nesting). A BOM is the one message that differs: json.loads names it.
            assert kind == expected[0], (data, kind, got, expected)
            if not text.startswith("\ufeff"):
                assert got == expected[1], (data, got, expected)


@settings(max_examples=examples(300), deadline=None)
@given(_values, _dump_options)
def test_dumped_values_read_as_json_loads_reads_them(value: Any, options: dict[str, Any]) -> None:
    _reads_as_json_loads(json.dumps(value, **options))


@settings(max_examples=examples(300), deadline=None)
@given(st.lists(_number, min_size=1, max_size=3), st.booleans())
def test_number_literals_read_as_json_loads_reads_them(numbers: list[str], alone: bool) -> None:
    # Long mantissas, exponents that underflow or overflow, integers either side of 64 bits.
    _reads_as_json_loads(numbers[0] if alone else "[" + ", ".join(numbers) + "]")


@settings(max_examples=examples(300), deadline=None)
@given(st.lists(_tokens, max_size=12).map("".join))
def test_arbitrary_text_reads_or_fails_as_json_loads(text: str) -> None:
    _reads_as_json_loads(text)


@pytest.mark.parametrize(
    "text",
    [
        # orjson refuses these; json.loads reads them.
        "NaN",
        "[NaN, Infinity, -Infinity]",
        '{"padding to take the long path": -Infinity}',
        '"\\ud800"',
        '["\\udc00\\ud800", "a longer string to take the long path"]',
        "1e400",
        "-1e400",
        "1.7976931348623159e308",
        '{"overflows to infinity": 1e999999999999}',
        # orjson reads integers outside -2**63..2**64-1 as floats; json.loads as ints.
        str(2**64),
        str(-(2**63) - 1),
        "[18446744073709551616]",
        '{"big": -9223372036854775809}',
        '{"huge": ' + str(10**40) + "}",
        # Integers at the edges orjson reads exactly, and long digit runs that are no integer.
        str(2**64 - 1),
        str(-(2**63)),
        '{"n": ' + str(2**63) + "}",
        '{"phone": "12345678901234567890", "x": 0.1234567890123456789012}',
        # Same on both, kept here because they are easy to get wrong.
        "-0",
        "-0.0",
        '{"a": 1, "b": 2, "a": 3}',
        '{"x": 1E5, "y": 5e-324, "z": 2.4703282292062328e-324, "w": 1e-400}',
        '"\\u0000\\ud83d\\ude00\\u2028"',
        " \r\n\t[1] \n",
    ],
)
def test_texts_orjson_reads_differently_read_as_json_loads_reads_them(text: str) -> None:
    _reads_as_json_loads(text)


def test_integers_beyond_pythons_digit_limit_are_refused_as_json_loads_refuses_them() -> None:
    _reads_as_json_loads('{"n": ' + "9" * 5000 + "}")
    with pytest.raises(ValueError, match="digits"):
        codec.load_json("[" + "9" * 5000 + "]")


@pytest.mark.parametrize("depth", [256, 257, 300, 1000, 1024, 1025, 100_000])
def test_nesting_reads_or_fails_as_json_loads(depth: int) -> None:
    # orjson reads up to 1024 levels; Python refuses nesting near its recursion limit (1000
    # by default, less the frames already on the stack), so 1000 and 1024 must fail here.
    for text in ("[" * depth + "]" * depth, '{"a":' * depth + "1" + "}" * depth):
        _reads_as_json_loads(text)
    if depth >= 1000:
        with pytest.raises(RecursionError):
            codec.load_json("[" * depth + "]" * depth)


def test_many_shallow_brackets_read_as_json_loads_reads_them() -> None:
    _reads_as_json_loads(json.dumps([[i, {"k": [i]}] for i in range(300)]))


def test_bytes_that_are_not_utf8_are_refused() -> None:
    for data in (b"\xff", b'"\xed\xa0\x80"', b'["a long enough value", "\xff"]'):
        with pytest.raises(UnicodeDecodeError):
            codec.load_json(data)
