"""JSON encoding and decoding of job data: the arguments an enqueue stores, the result (or
step value, or signal payload) a handler returns, and the stored text read back, by the worker
and for display.

Arguments are stored as PostgreSQL ``json`` (text kept verbatim), so anything accepted here comes
back from the worker exactly as given. Only JSON's own types are accepted: ``dict`` with ``str``
keys, ``list``, ``str``, ``int``, finite ``float``, ``bool`` and ``None``. Tuples, sets, bytes,
dates and objects are refused rather than silently converted, so a job never runs with arguments
that differ from what the caller passed. Subclasses of the JSON types (``IntEnum``, ``StrEnum``,
``OrderedDict``, ``defaultdict``...) are refused too: JSON would store them as the plain base
type, and the handler would receive something other than what was enqueued.

Error messages quote offending values through ``errors.short_repr``, so a hostile value (a
megabyte string key, say) cannot blow up the message that ends in a job's recorded error.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from typing import Any, Final

import orjson

from pgqueue.errors import PayloadTooLarge, SerializationError, short_repr


def encode_args(
    args: Sequence[Any], kwargs: Mapping[str, Any], *, max_bytes: int, max_depth: int
) -> tuple[str, str]:
    """JSON text of positional and keyword arguments, checked for type, depth and size."""
    fast = _encode_flat_args(args, kwargs, max_bytes)
    if fast is not None:
        return fast
    for index, item in enumerate(args):
        _check_json(item, f"args[{index}]", max_depth)
    for key, item in kwargs.items():
        # Keyword names are JSON object keys too (enqueue_many takes any Mapping).
        if type(key) is not str:
            raise SerializationError(f"kwargs has a {type(key).__name__} key {short_repr(key)}")
        _check_text(key, "kwargs key")
        _check_json(item, f"kwargs[{short_repr(key)}]", max_depth)
    args_data = _encode_checked(list(args))
    kwargs_data = _encode_checked(dict(kwargs))
    size = len(args_data) + len(kwargs_data)
    if size > max_bytes:
        raise PayloadTooLarge(f"task arguments are {size} bytes encoded; the limit is {max_bytes}")
    return args_data.decode(), kwargs_data.decode()


_FLAT: Final = frozenset({type(None), bool, int, str})
_isfinite: Final = math.isfinite


def _encode_flat_args(
    args: Sequence[Any], kwargs: Mapping[str, Any], max_bytes: int
) -> tuple[str, str] | None:
    """The common case, cheaply: arguments that are all plain scalars (exact types) encoded
    without the walk. None when anything needs the full checks (containers, a non-finite
    float, an int beyond 64 bits, a lone surrogate, too large): the caller then runs them, and
    they raise with the precise message."""
    flat = _FLAT
    for item in args:
        kind = type(item)
        if kind not in flat and (kind is not float or not _isfinite(item)):
            return None
    for key, item in kwargs.items():
        kind = type(item)
        if type(key) is not str or (
            kind not in flat and (kind is not float or not _isfinite(item))
        ):
            return None
    try:
        # orjson takes a tuple as an array and only a dict as an object: any other sequence or
        # mapping is copied into one first.
        args_data = (
            _ORJSON(args if type(args) is tuple or type(args) is list else list(args))
            if args
            else b"[]"
        )
        kwargs_data = _ORJSON(kwargs if type(kwargs) is dict else dict(kwargs)) if kwargs else b"{}"
    except TypeError:  # an int beyond 64 bits, a lone surrogate
        return None
    if len(args_data) + len(kwargs_data) > max_bytes:
        return None
    # No arguments of a kind is the usual case: its text is a constant, decoded for free.
    return (
        args_data.decode() if args else "[]",
        kwargs_data.decode() if kwargs else "{}",
    )


def encode_result(value: Any, *, max_bytes: int, max_depth: int, what: str = "") -> str:
    """JSON text of a handler's return value, or of what ``what`` names (same rules as args)."""
    _check_json(value, what or "result", max_depth)
    data = _encode_checked(value)
    if len(data) > max_bytes:
        raise PayloadTooLarge(f"{what or 'task result'} is larger than {max_bytes} bytes encoded")
    return data.decode()


# orjson writes what ``json.dumps(ensure_ascii=False, separators=(",", ":"))`` writes for the
# values ``_check_json`` lets through, several times faster (same float text: the shortest that
# reads back as the same float). It would also accept what JSON must not carry here (NaN as
# null, tuples, subclasses, dates): only values already checked reach it.
_ORJSON: Final = orjson.dumps


def _encode_checked(value: Any) -> bytes:
    """UTF-8 JSON of a value ``_check_json`` accepted. orjson refuses ints beyond 64 bits and
    nesting beyond its own limit; Python's encoder writes those (up to its digit limit)."""
    try:
        return _ORJSON(value)
    except TypeError:
        return _dumps(value).encode()


def _dumps(value: Any) -> str:
    try:
        return json.dumps(value, ensure_ascii=False, allow_nan=False, separators=(",", ":"))
    except ValueError as exc:
        # Python refuses to print ints over sys.get_int_max_str_digits() digits (4300 by
        # default), and could not read them back either: refuse them as input.
        raise SerializationError(f"value cannot be encoded as JSON: {exc}") from None


_DECODE: Final = json.JSONDecoder().decode
_ORJSON_LOADS: Final = orjson.loads
_ORJSON_ERROR: Final = orjson.JSONDecodeError

# orjson reads what ``json.loads`` reads, to the same values (floats too, correctly rounded
# like Python's), except where it refuses (NaN, Infinity, numbers that overflow to infinity,
# escaped lone surrogates, nesting beyond 1024: the stdlib decoder then answers) and where it
# silently differs, which these checks keep from it:
# - integers outside -2**63..2**64-1 come back as floats: text with a run of 19 digits goes to
#   the stdlib decoder (an integer that long may be out of range; long float mantissas and
#   digit strings go along, at the stdlib's speed);
# - Python refuses nesting at its recursion limit less the frames already on the stack (about
#   990 levels at the top) with RecursionError, where orjson reads up to 1024: text that could
#   nest deeper than ``_ORJSON_NESTING`` (longer than twice that, with more opening brackets)
#   goes to the stdlib decoder, so orjson reads only nesting Python reads too, for any caller
#   not already within that many frames of the limit.
# One ``bytes.translate`` pass maps digits to "0", both opening brackets to "[" and everything
# else to " ", so both checks are a substring search and a count (``find``, not ``in``: ``in``
# first tries its operand as an int, and raising and clearing that TypeError costs more than
# the search).
_SHAPE: Final = bytes(
    0x30 if 0x30 <= c <= 0x39 else 0x5B if c in (0x5B, 0x7B) else 0x20 for c in range(256)
)
_LONG_DIGITS: Final = b"0" * 19
_ORJSON_NESTING: Final = 256


def load_json(data: bytes | str) -> Any:
    """``json.loads`` for JSON read back from pgqueue's engine (the driver's loader for ``json``
    and ``jsonb``, ``load_arguments`` and ``load_stored_json``), cheaper per value: a worker
    decodes two per job (args and kwargs).

    Empty arrays and objects, which pgqueue stores verbatim as ``[]`` and ``{}``, need no
    parsing; other text goes to orjson unless it could read differently there (see above), and
    to the stdlib decoder when orjson refuses it. Bytes are UTF-8 (the server's JSON output), so
    ``json.loads``' encoding detection is skipped. Results and errors are ``json.loads``' own
    (values of the same types; ``json.JSONDecodeError``, ``RecursionError``, ``ValueError`` for
    integers beyond Python's digit limit, ``UnicodeDecodeError`` for bytes that are not UTF-8).
    """
    if data == b"[]" or data == "[]":
        return []
    if data == b"{}" or data == "{}":
        return {}
    # Shorter text holds no 19-digit run and nests at most 9 levels: no check needed.
    if len(data) >= 19:
        if isinstance(data, str):
            try:
                encoded = data.encode()
            except UnicodeEncodeError:  # a lone surrogate, which orjson refuses anyway
                return _stdlib_loads(data)
        else:
            encoded = data
        shape = encoded.translate(_SHAPE)
        if shape.find(_LONG_DIGITS) >= 0 or (
            len(shape) > 2 * _ORJSON_NESTING and shape.count(b"[") > _ORJSON_NESTING
        ):
            return _stdlib_loads(data)
        try:
            return _ORJSON_LOADS(encoded)
        except _ORJSON_ERROR:
            return _stdlib_loads(data)
    try:
        return _ORJSON_LOADS(data)
    except _ORJSON_ERROR:
        return _stdlib_loads(data)


def _stdlib_loads(data: bytes | str) -> Any:
    return _DECODE(data.decode() if isinstance(data, bytes) else data)


class UndecodableJSON(str):
    """What reading a job gives for a stored JSON value Python cannot decode, instead of raising:
    a ``str`` (``<undecodable JSON: RecursionError: ...>``) so that pages, ``tojson`` and
    ``repr`` still show the job, and a type to test for (``isinstance``), since a decoded value
    is never an instance of it."""

    __slots__ = ()


def load_stored_json(data: str) -> Any:
    """A stored JSON value read back for display (``get_job``, the dashboard, the CLI): its
    decoded value, or an ``UndecodableJSON`` saying why when Python cannot decode it."""
    try:
        return load_json(data)
    except (ValueError, RecursionError) as exc:
        return UndecodableJSON(f"<undecodable JSON: {type(exc).__name__}: {exc}>")


def load_arguments(args: str, kwargs: str) -> tuple[Any, Any]:
    """A claimed job's ``args`` and ``kwargs`` from their stored JSON text.

    Raises ``SerializationError`` saying why when Python cannot read them: the database accepts
    JSON that Python's decoder refuses (nesting deeper than the recursion limit, integers
    longer than ``sys.get_int_max_str_digits()``), written by another client or by hand.
    """
    try:
        return load_json(args), load_json(kwargs)
    except (ValueError, RecursionError) as exc:
        raise SerializationError(f"{type(exc).__name__}: {exc}") from None


# Exact types, not isinstance: a subclass would be stored as its base type (see module doc).
_SCALARS: Final = frozenset({type(None), bool, int})
_PATH_LIMIT: Final = 200


def _child(where: str, step: str) -> str:
    # Paths of deep or long-keyed structures are cut: the message must stay small.
    return where + step if len(where) < _PATH_LIMIT else where


def _check_json(value: Any, path: str, max_depth: int) -> None:
    # Iterative walk: recursion would hit Python's own limit before ours on hostile input.
    stack: list[tuple[Any, str, int]] = [(value, path, 1)]
    while stack:
        item, where, depth = stack.pop()
        kind = type(item)
        if kind in _SCALARS:
            continue
        if kind is str:
            _check_text(item, where)
            continue
        if kind is float:
            if not math.isfinite(item):
                raise SerializationError(f"{where} is {item!r}; JSON has no NaN or infinity")
            continue
        if kind is list or kind is dict:
            if depth > max_depth:
                raise SerializationError(f"{where} is nested deeper than {max_depth} levels")
            if kind is list:
                stack.extend((v, _child(where, f"[{i}]"), depth + 1) for i, v in enumerate(item))
            else:
                for key, v in item.items():
                    if type(key) is not str:
                        raise SerializationError(
                            f"{where} has a {type(key).__name__} key {short_repr(key)}; "
                            "JSON keys are plain strings"
                        )
                    _check_text(key, f"{where} key")
                    stack.append((v, _child(where, f"[{short_repr(key)}]"), depth + 1))
            continue
        raise SerializationError(
            f"{where} is a {kind.__name__}, which is not JSON "
            "(use plain dict, list, str, int, float, bool or None; not subclasses)"
        )


def _check_text(value: str, where: str) -> None:
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise SerializationError(
            f"{where} contains a lone surrogate and is not valid Unicode"
        ) from None
