"""Checks on user input that run before any SQL: names, delays, priorities, JSON payloads and
progress reports (durations and moments from ``pgqueue.durations``, re-exported here).

Arguments are stored as PostgreSQL ``json`` (text kept verbatim), so anything accepted here comes
back from the worker exactly as given. Only JSON's own types are accepted: ``dict`` with ``str``
keys, ``list``, ``str``, ``int``, finite ``float``, ``bool`` and ``None``. Tuples, sets, bytes,
dates and objects are refused rather than silently converted, so a job never runs with arguments
that differ from what the caller passed. Subclasses of the JSON types (``IntEnum``, ``StrEnum``,
``OrderedDict``, ``defaultdict``...) are refused too: JSON would store them as the plain base
type, and the handler would receive something other than what was enqueued.

Error messages quote offending values through :func:`_short`, so a hostile value (a megabyte
string key, say) cannot blow up the message that ends in a job's recorded error.
"""

from __future__ import annotations

import inspect
import json
import math
from collections.abc import Mapping, Sequence
from collections.abc import Set as AbstractSet
from typing import Any, Final

import orjson

from pgqueue.config import NAME_PATTERN, TASK_NAME_PATTERN

# Durations and moments are checked in their own module; callers reach them here too.
from pgqueue.durations import MAX_DELAY_SECONDS as MAX_DELAY_SECONDS
from pgqueue.durations import bounded_seconds as bounded_seconds
from pgqueue.durations import delay as delay
from pgqueue.durations import positive_seconds as positive_seconds
from pgqueue.durations import run_at as run_at
from pgqueue.durations import seconds as seconds
from pgqueue.errors import PayloadTooLarge, SerializationError, ValidationError, storable_text

PRIORITY_MIN = -32768
PRIORITY_MAX = 32767
MAX_ATTEMPTS_LIMIT = 1_000_000


def queue_name(value: object) -> str:
    """A queue name: letters, digits, ``_ . : -``; 1 to 63 bytes."""
    return _name("queue name", value, NAME_PATTERN)


def task_name(value: object) -> str:
    """A task name: like a queue name, plus ``< >`` (for ``<locals>`` in qualnames)."""
    return _name("task name", value, TASK_NAME_PATTERN)


def _name(what: str, value: object, pattern: Any) -> str:
    if not isinstance(value, str):
        raise ValidationError(f"{what} must be a string, got {type(value).__name__}")
    if len(value.encode("utf-8", "surrogatepass")) > 63:
        raise ValidationError(f"{what} {value[:80]!r} is longer than 63 bytes")
    if not pattern.fullmatch(value):
        raise ValidationError(
            f"{what} {value!r} has characters outside letters, digits and '_.:-'"
            + (" (and '<>')" if what == "task name" else "")
        )
    return value


def priority(value: object) -> int:
    if not isinstance(value, int) or isinstance(value, bool):
        raise ValidationError(f"priority must be an int, got {value!r}")
    if not PRIORITY_MIN <= value <= PRIORITY_MAX:
        raise ValidationError(
            f"priority must be within {PRIORITY_MIN}..{PRIORITY_MAX}, got {value}"
        )
    return value


def max_attempts(value: object) -> int:
    if (
        not isinstance(value, int)
        or isinstance(value, bool)
        or not 1 <= value <= MAX_ATTEMPTS_LIMIT
    ):
        raise ValidationError(
            f"max_attempts must be an int from 1 to {MAX_ATTEMPTS_LIMIT}, got {value!r}"
        )
    return value


def unique_key(value: object) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or not value or len(value) > 512 or "\x00" in value:
        raise ValidationError(
            f"unique_key must be a non-empty string of at most 512 characters without NUL, got {value!r}"
        )
    return value


def concurrency_key(value: object, *, what: str = "concurrency_key") -> str:
    """A concurrency key (or key prefix): a non-empty string of at most 512 characters
    without NUL."""
    if not isinstance(value, str):
        raise ValidationError(f"{what} must be a string, got {type(value).__name__}")
    if not value or len(value) > 512 or "\x00" in value:
        raise ValidationError(
            f"{what} must be a non-empty string of at most 512 characters without NUL, "
            f"got {value!r}"
        )
    return value


def limit_count(value: object, *, what: str) -> int:
    """A limit's count: a whole number of at least 1 (booleans are not numbers here)."""
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValidationError(f"{what} must be a whole number of at least 1, got {value!r}")
    if value > 2**31 - 1:
        raise ValidationError(f"{what} must be at most {2**31 - 1}, got {value!r}")
    return value


def rate_period(value: object) -> float:
    """A rate limit's window: a positive number of seconds (at most a day)."""
    if (
        not isinstance(value, int | float)
        or isinstance(value, bool)
        or not math.isfinite(value)
        or value <= 0
        or value > 86_400
    ):
        raise ValidationError(
            f"per must be a positive number of seconds of at most 86400, got {value!r}"
        )
    return float(value)


_POSITIONAL: Final = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
_EMPTY: Final = inspect.Parameter.empty


class ArgumentCheck:
    """Whether arguments bind to a task function's signature, decided from their shape (how
    many positional ones, which keywords) by rules compiled once from the signature: an
    enqueue checks every job, and ``Signature.bind`` per job costs more than the job's JSON.

    ``binds`` says True only when ``Signature.bind`` would succeed; False means "ask it": the
    caller then binds for real, which raises with Python's own message (or accepts a shape these
    rules leave to it). ``context_first``: the function's first parameter takes a context the
    worker passes, not the caller.
    """

    __slots__ = (
        "keyword_call_ok",
        "keyword_call_required",
        "keyword_names",
        "positional",
        "required_keyword_only",
        "reserved",
        "undecided",
        "var_keyword",
        "var_positional",
    )

    def __init__(self, signature: inspect.Signature, *, context_first: bool = False) -> None:
        params = list(signature.parameters.values())
        kinds = [p.kind for p in params]
        self.var_positional = inspect.Parameter.VAR_POSITIONAL in kinds
        self.var_keyword = inspect.Parameter.VAR_KEYWORD in kinds
        self.undecided = False
        # Keywords named like the context's parameter or a positional-only one: left to bind
        # (which refuses the latter even where a ``**kwargs`` would take them in a call).
        reserved = {p.name for p in params if p.kind is inspect.Parameter.POSITIONAL_ONLY}
        if context_first:
            if params and params[0].kind in _POSITIONAL:
                reserved.add(params[0].name)
                params = params[1:]
            elif not self.var_positional or params[0].kind is not inspect.Parameter.VAR_POSITIONAL:
                self.undecided = True  # no slot for the context: bind says why
        self.reserved = frozenset(reserved)
        self.positional = tuple(p for p in params if p.kind in _POSITIONAL)
        keyword_kinds = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
        self.keyword_names = frozenset(p.name for p in params if p.kind in keyword_kinds)
        self.required_keyword_only = frozenset(
            p.name
            for p in params
            if p.kind is inspect.Parameter.KEYWORD_ONLY and p.default is _EMPTY
        )
        # Keywords only (the usual enqueue_many item, a dict): possible unless a positional-only
        # parameter needs a value; then every required parameter must be named.
        self.keyword_call_ok = not any(
            p.kind is inspect.Parameter.POSITIONAL_ONLY and p.default is _EMPTY
            for p in self.positional
        )
        self.keyword_call_required = frozenset(
            p.name for p in params if p.kind in keyword_kinds and p.default is _EMPTY
        )

    def binds(self, positional: int, keywords: AbstractSet[str]) -> bool:
        """Whether ``positional`` positional arguments and the ``keywords`` bind for sure."""
        if self.undecided or (self.reserved and not self.reserved.isdisjoint(keywords)):
            return False
        if positional == 0:
            return (
                self.keyword_call_ok
                and (self.var_keyword or keywords <= self.keyword_names)
                and self.keyword_call_required <= keywords
            )
        slots = self.positional
        if positional > len(slots) and not self.var_positional:
            return False
        for param in slots[positional:]:
            if param.default is _EMPTY and (
                param.kind is inspect.Parameter.POSITIONAL_ONLY or param.name not in keywords
            ):
                return False
        filled = {
            p.name for p in slots[:positional] if p.kind is not inspect.Parameter.POSITIONAL_ONLY
        }
        for name in keywords:
            if name in self.keyword_names:
                if name in filled:
                    return False  # given twice
            elif not self.var_keyword:
                return False
        return self.required_keyword_only <= keywords


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
            raise SerializationError(f"kwargs has a {type(key).__name__} key {_short(key)}")
        _check_text(key, "kwargs key")
        _check_json(item, f"kwargs[{_short(key)}]", max_depth)
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
_REPR_LIMIT: Final = 60
_PATH_LIMIT: Final = 200


def _short(value: Any) -> str:
    """``repr`` of a value for an error message, cut to a few dozen characters."""
    text = repr(value)
    return text if len(text) <= _REPR_LIMIT else text[: _REPR_LIMIT - 5] + "...'" + text[-1:]


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
                            f"{where} has a {type(key).__name__} key {_short(key)}; "
                            "JSON keys are plain strings"
                        )
                    _check_text(key, f"{where} key")
                    stack.append((v, _child(where, f"[{_short(key)}]"), depth + 1))
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


# Longest progress message kept, in UTF-8 bytes: it is written at every heartbeat that reports
# progress, so it stays a status line, not a log.
PROGRESS_MESSAGE_BYTES = 1000


def progress(fraction: object, message: object) -> tuple[float, str | None]:
    """``(fraction, message)`` as ``JobContext.progress`` records it, or ValidationError."""
    if (
        not isinstance(fraction, int | float)
        or isinstance(fraction, bool)
        or not 0.0 <= fraction <= 1.0  # also refuses NaN
    ):
        raise ValidationError(f"progress must be a number from 0 to 1, got {_short(fraction)}")
    if message is not None and not isinstance(message, str):
        raise ValidationError(
            f"progress message must be a string or None, got {type(message).__name__}"
        )
    text = None if message is None else storable_text(message, PROGRESS_MESSAGE_BYTES)
    return float(fraction), text
