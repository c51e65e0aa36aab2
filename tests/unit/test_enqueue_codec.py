"""The enqueue's compiled checks against the reference they stand in for: the JSON encoder's
text against Python's ``json`` (reads back as exactly the value given, and as Python's own
text does; the same refusals; only a float's exponent may be spelled ``e-7`` for ``e-07``), and the argument check compiled from
a signature against ``Signature.bind`` (never accepts what bind refuses)."""

from __future__ import annotations

import collections
import datetime as dt
import enum
import inspect
import json
import math
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from support.examples import examples
from support.same_values import same

from pgqueue import codec, validation
from pgqueue.errors import PayloadTooLarge, SerializationError

# What ``codec`` accepts: JSON's own types, exact, floats finite, text valid Unicode.
_text = st.text(st.characters(exclude_categories=("Cs",)), max_size=20)
_scalars = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.integers(min_value=-(2**200), max_value=2**200)
    | st.floats(allow_nan=False, allow_infinity=False)
    | _text
)
_values = st.recursive(
    _scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(_text, inner, max_size=4),
    max_leaves=12,
)


def _reference(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, allow_nan=False, separators=(",", ":"))


@settings(max_examples=examples(300), deadline=None)
@given(_values, st.dictionaries(_text, _values, max_size=3))
def test_encoded_arguments_read_back_as_exactly_what_was_given(
    value: Any, kwargs: dict[str, Any]
) -> None:
    args_text, kwargs_text = codec.encode_args([value], kwargs, max_bytes=10**7, max_depth=50)
    assert same(json.loads(args_text), [value])
    assert same(json.loads(kwargs_text), kwargs)
    # Python's own text reads back the same: the two differ in float spelling at most.
    assert _reference(json.loads(args_text)) == _reference([value])
    result = codec.encode_result(value, max_bytes=10**7, max_depth=50)
    assert same(json.loads(result), value)
    # The size limit counts the text's UTF-8 bytes, as stored.
    size = len(args_text.encode()) + len(kwargs_text.encode())
    with pytest.raises(PayloadTooLarge):
        codec.encode_args([value], kwargs, max_bytes=size - 1, max_depth=50)


@pytest.mark.parametrize(
    "value",
    [1e16, 1e-07, 5e-324, -0.0, 0.1, 1.7976931348623157e308, 2**63, 2**64, -(2**64) - 1, 10**400],
)
def test_edge_numbers_read_back_exactly(value: Any) -> None:
    args_text, kwargs_text = codec.encode_args([value], {"v": value}, max_bytes=10**6, max_depth=5)
    assert same(json.loads(args_text), [value])
    assert same(json.loads(kwargs_text), {"v": value})


class _Str(str):
    pass


class _Int(enum.IntEnum):
    ONE = 1


@pytest.mark.parametrize(
    "bad",
    [
        math.nan,
        math.inf,
        -math.inf,
        (1, 2),
        {1: "int key"},
        {_Str("k"): 1},
        _Str("subclass"),
        _Int.ONE,
        collections.OrderedDict(a=1),
        dt.datetime(2026, 1, 1, tzinfo=dt.UTC),
        dt.date(2026, 1, 1),
        "lone \ud800 surrogate",
        b"bytes",
        {1, 2},
        10**5000,
    ],
    ids=lambda v: type(v).__name__,
)
def test_what_json_cannot_carry_exactly_is_refused_flat_and_nested(bad: Any) -> None:
    for args, kwargs in (([bad], {}), ([], {"k": bad}), ([[bad]], {}), ([], {"k": {"n": bad}})):
        with pytest.raises(SerializationError):
            codec.encode_args(args, kwargs, max_bytes=10**6, max_depth=10)
    with pytest.raises(SerializationError):
        codec.encode_result([bad], max_bytes=10**6, max_depth=10)


def test_non_str_keyword_names_are_refused() -> None:
    with pytest.raises(SerializationError):
        codec.encode_args([], {1: "x"}, max_bytes=10**6, max_depth=10)  # type: ignore[dict-item]


# -- the argument check ----------------------------------------------------------------------

_KINDS = (
    inspect.Parameter.POSITIONAL_ONLY,
    inspect.Parameter.POSITIONAL_OR_KEYWORD,
    inspect.Parameter.VAR_POSITIONAL,
    inspect.Parameter.KEYWORD_ONLY,
    inspect.Parameter.VAR_KEYWORD,
)
_NAMES = ("a", "b", "c", "d", "e", "f", "g", "h")


@st.composite
def _signatures(draw: Any) -> inspect.Signature:
    params = []
    names = iter(_NAMES)
    defaulted = False
    for kind in _KINDS:
        single = kind in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)
        for _ in range(draw(st.integers(0, 1 if single else 2))):
            name = next(names)
            default: Any = inspect.Parameter.empty
            if not single:
                # Positional parameters with a default are followed by defaulted ones only.
                positional = kind in _KINDS[:2]
                if draw(st.booleans()) or (positional and defaulted):
                    default = None
                    defaulted = defaulted or positional
            params.append(inspect.Parameter(name, kind, default=default))
    return inspect.Signature(params)


def _binds(signature: inspect.Signature, context_first: bool, n: int, keys: list[str]) -> bool:
    args = (None,) * (n + context_first)
    try:
        signature.bind(*args, **dict.fromkeys(keys))
    except TypeError:
        return False
    return True


@settings(max_examples=examples(600), deadline=None)
@given(
    _signatures(),
    st.booleans(),
    st.integers(0, 4),
    st.lists(st.sampled_from((*_NAMES, "zz")), unique=True, max_size=4),
)
def test_compiled_argument_check_never_accepts_what_bind_refuses(
    signature: inspect.Signature, context_first: bool, positional: int, keys: list[str]
) -> None:
    check = validation.ArgumentCheck(signature, context_first=context_first)
    positional_only = {
        p.name for p in signature.parameters.values() if p.kind is inspect.Parameter.POSITIONAL_ONLY
    }
    truth = _binds(signature, context_first, positional, keys)
    if check.binds(positional, frozenset(keys)):
        assert truth, (signature, context_first, positional, keys)
    elif truth and not context_first and not positional_only & set(keys):
        # Without a context, the rules decide every shape themselves (but a keyword named like
        # a positional-only parameter): bind runs only for the message of a refusal.
        pytest.fail(f"{signature} {positional} {keys}: left to bind though it binds")
