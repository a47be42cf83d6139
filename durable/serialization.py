"""How values are stored: a small Serializer protocol and the JSON default.

Workflow inputs, step outputs and errors are stored as text. JSON is the default because
a journal must stay readable by people and by other languages long after the code that
wrote it changed; pickle ties the journal to one code version and executes code on load,
so it is available only as an explicit opt-in (`PickleSerializer`).
"""

from __future__ import annotations

import base64
import dataclasses
import datetime as dt
import decimal
import functools
import inspect
import json
import pickle
import types
import typing
import uuid
import zoneinfo
from typing import Any, Protocol, runtime_checkable

from durable.errors import SerializationError

_orjson: Any
try:  # the optional extra durable-pg[fast]
    import orjson as _orjson
except ImportError:  # pragma: no cover - depends on the environment
    _orjson = None

__all__ = ["JSONSerializer", "PickleSerializer", "Serializer"]

_TAG = "__durable__"
# A user's dict key that starts with the tag is stored with this prefix added, so no user
# value can ever look like a tagged value (and a tagged value is never a user dict).
_ESC = _TAG + "~"


@runtime_checkable
class Serializer(Protocol):
    """Turns values into text and back. Implementations must round-trip their own output."""

    def dumps(self, value: Any) -> str:
        """Encode a value; raise TypeError or ValueError if it cannot be encoded."""
        ...

    def loads(self, data: str) -> Any:
        """Decode text produced by `dumps`."""
        ...


def _encode(value: Any) -> Any:
    # Called by json for anything it does not know. Tagged values round-trip; dataclasses
    # and pydantic models are stored as plain dicts because rebuilding an arbitrary class
    # from the journal would mean importing and calling code named by stored data.
    if isinstance(value, dt.datetime):
        return {_TAG: "datetime", "v": _datetime_text(value)}
    if isinstance(value, dt.date):
        return {_TAG: "date", "v": value.isoformat()}
    if isinstance(value, dt.time):
        return {_TAG: "time", "v": value.isoformat()}
    if isinstance(value, dt.timedelta):
        return {_TAG: "timedelta", "v": _timedelta_seconds(value)}
    if isinstance(value, decimal.Decimal):
        if value.is_snan():
            raise _Refused(
                f"{value!r} is a signaling NaN, which raises on every comparison or "
                "arithmetic: return Decimal('NaN') (or None) instead"
            )
        return {_TAG: "decimal", "v": str(value)}
    if isinstance(value, uuid.UUID):
        return {_TAG: "uuid", "v": str(value)}
    if isinstance(value, bytes):
        return {_TAG: "bytes", "v": base64.b64encode(value).decode("ascii")}
    if isinstance(value, set | frozenset):
        return sorted(value, key=repr)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return _escaped({f.name: getattr(value, f.name) for f in dataclasses.fields(value)})
    model_dump = getattr(value, "model_dump", None)
    if callable(model_dump):
        return _escaped(model_dump(mode="json"))
    raise TypeError(f"Object of type {type(value).__qualname__} is not JSON serializable")


class _Refused(ValueError):
    """A value this serializer will not store; the message says why and what to do."""


# The microseconds of the longest timedelta, and a context that holds them exactly.
_MAX_MICROSECONDS = (dt.timedelta.max.days * 86400 + 86399) * 1_000_000 + 999_999
_EXACT = decimal.Context(prec=40, Emax=100, Emin=-100)


def _timedelta_seconds(value: dt.timedelta) -> float | str:
    """A timedelta's seconds: a number when a float holds them to the microsecond (as
    journals always stored them, so older readers read them), else an exact decimal string
    (past about 100 years a float cannot hold every microsecond)."""
    seconds = value.total_seconds()
    try:
        if dt.timedelta(seconds=seconds) == value:
            return seconds
    except OverflowError:  # rounded up past timedelta.max
        pass
    micro = (value.days * 86400 + value.seconds) * 1_000_000 + value.microseconds
    whole, fraction = divmod(abs(micro), 1_000_000)
    return f"{'-' if micro < 0 else ''}{whole}.{fraction:06d}"


def _timedelta(stored: Any) -> dt.timedelta:
    if not isinstance(stored, str):
        return dt.timedelta(seconds=stored)
    micro = decimal.Decimal(stored).scaleb(6, context=_EXACT)
    if (
        not micro.is_finite()
        or micro != micro.to_integral_value()
        or abs(micro) > _MAX_MICROSECONDS
    ):
        raise ValueError("not a whole number of microseconds a timedelta can hold")
    return dt.timedelta(microseconds=int(micro))


def _datetime_text(value: dt.datetime) -> str:
    """ISO 8601 with the offset; a datetime in an IANA zone (zoneinfo) also names its zone,
    as RFC 9557 writes it (`2026-10-25T02:30:00+01:00[Europe/Berlin]`), so it reads back
    in its zone: the same instant, the same wall clock, the same `fold`."""
    text = value.isoformat()
    zone = value.tzinfo
    if isinstance(zone, zoneinfo.ZoneInfo) and zone.key is not None:
        text += f"[{zone.key}]"
    return text


def _datetime(stored: str) -> dt.datetime:
    """A datetime written by `_datetime_text` (or plain ISO 8601, as journals always held).

    The offset fixes the instant; the zone gives back the wall clock, with the `fold` whose
    offset is the stored one (the second 02:30 of a night the clocks go back is fold=1). A
    zone this machine does not know, or whose rules no longer give that offset, reads back
    as the same instant at the stored offset, or in the zone."""
    if not stored.endswith("]"):
        return dt.datetime.fromisoformat(stored)
    text, _, key = stored[:-1].partition("[")
    parsed = dt.datetime.fromisoformat(text)
    offset = parsed.utcoffset()
    if offset is None:
        raise ValueError("a zone without an offset")
    try:
        zone = zoneinfo.ZoneInfo(key)
    except (zoneinfo.ZoneInfoNotFoundError, ValueError, OSError):
        # Not a zone's name here (a zone loaded from a file keeps the key it was given: a
        # path, say): the same instant at the stored offset.
        return parsed
    for fold in (0, 1):
        local = parsed.replace(tzinfo=zone, fold=fold)
        if local.utcoffset() == offset:
            return local
    return parsed.astimezone(zone)


_DECODERS: dict[str, Any] = {
    "datetime": _datetime,
    "date": dt.date.fromisoformat,
    "time": dt.time.fromisoformat,
    "timedelta": _timedelta,
    "decimal": decimal.Decimal,
    "uuid": uuid.UUID,
    "bytes": lambda v: base64.b64decode(v, validate=True),
}


def _escaped(value: Any) -> Any:
    """`value` with every dict key that starts with the tag escaped (see _ESC)."""
    if isinstance(value, dict):
        return {
            (_ESC + k if isinstance(k, str) and k.startswith(_TAG) else k): _escaped(v)
            for k, v in value.items()
        }
    if isinstance(value, list | tuple):
        return [_escaped(v) for v in value]
    return value


def _decode(obj: dict[str, Any]) -> Any:
    if _TAG in obj:
        tag = obj[_TAG]
        decoder = _DECODERS.get(tag) if isinstance(tag, str) else None
        if decoder is None or len(obj) != 2 or "v" not in obj:
            return obj  # not written by this serializer (an old journal's user dict)
        try:
            return decoder(obj["v"])
        except Exception as exc:  # decimal, uuid and base64 each fail their own way
            raise ValueError(f"a stored {tag} value is corrupt: {obj['v']!r:.80}") from exc
    if any(k.startswith(_ESC) for k in obj):
        return {(k[len(_ESC) :] if k.startswith(_ESC) else k): v for k, v in obj.items()}
    return obj


class JSONSerializer:
    """JSON with round-tripping hooks for datetime (a zoneinfo one keeps its zone and fold),
    date, time, timedelta (to the microsecond), Decimal (NaN and Infinity too; a signaling
    NaN is refused), UUID and bytes; dataclasses and pydantic models are stored as dicts.
    Tuples come back as lists."""

    def dumps(self, value: Any) -> str:
        text = json.dumps(value, default=_encode, separators=(",", ":"), allow_nan=False)
        if _TAG in text:
            # A tag, or a user's key or string that contains it: escape the user's keys
            # (rare, so the common case pays one substring search).
            text = json.dumps(
                _escaped(value), default=_encode, separators=(",", ":"), allow_nan=False
            )
        return text

    def loads(self, data: str) -> Any:
        if _TAG not in data:
            return json.loads(data)
        return json.loads(data, object_hook=_decode)


class PickleSerializer:
    """Pickle, base64-encoded. Opt-in only: loading a journal then runs code named by stored
    data, and journals stop being readable once classes move. Use only with trusted data."""

    def dumps(self, value: Any) -> str:
        return base64.b64encode(pickle.dumps(value)).decode("ascii")

    def loads(self, data: str) -> Any:
        return pickle.loads(base64.b64decode(data))


def dumps_checked(serializer: Serializer, value: Any, what: str, limit: int) -> str:
    """Serialize `value` for `what` (e.g. "output of step 'x'"), raising typed errors.

    This runs before any write, so a value that cannot be stored never reaches the journal.
    Whatever the encoding raises (the value's own code too: a model_dump, a __repr__) is
    a SerializationError saying what is wrong."""
    from durable.errors import PayloadTooLargeError

    try:
        text = serializer.dumps(value)
    except SerializationError:
        raise  # a serializer of the user's that says what is wrong itself
    except Exception as exc:
        raise SerializationError(
            f"cannot serialize {what}: {_why(exc)}", what=what, type_name=_kind(value)
        ) from exc
    if type(serializer) in (JSONSerializer, PickleSerializer):
        pass  # ASCII without NUL, always: nothing more to check
    elif not isinstance(text, str):
        raise SerializationError(
            f"cannot store {what}: the serializer returned a {_kind(text)}, not a str",
            what=what,
            type_name=_kind(value),
        )
    elif not text.isascii() or "\x00" in text:
        _check_storable(text, what, _kind(value))
    # Characters equal bytes for ASCII text, the common case; encode only when it is not.
    size = len(text) if text.isascii() else len(text.encode("utf-8"))
    if size > limit:
        raise PayloadTooLargeError(what, size, limit)
    return text


def keep_checked(
    serializer: Serializer, value: Any, what: str, limit: int, annotation: Any
) -> tuple[str, Any]:
    """dumps_checked and faithful in one: `value` as stored, and as a replay will see it.

    For the default JSON serializer, a value JSON keeps exactly (see _exact_json) goes a
    short way that writes the very same text: the one walk that proves it exact, then one
    encoding in C (orjson when installed, for what it writes byte for byte as json does;
    else json's own C encoder, built once), with no search for the tag, no decode, no
    second walk. Anything else, and every other serializer, goes the general way."""
    if type(serializer) is JSONSerializer and _plain(annotation):
        text = _exact_text(value)
        if text is not None:
            if len(text) > limit:  # ASCII: characters are bytes
                from durable.errors import PayloadTooLargeError

                raise PayloadTooLargeError(what, len(text), limit)
            return text, value
    text = dumps_checked(serializer, value, what, limit)
    return text, faithful(serializer, value, text, annotation, what)


def _no_default(value: Any) -> Any:
    raise TypeError(f"Object of type {type(value).__qualname__} is not JSON serializable")


# json.dumps(value, separators=(",", ":"), allow_nan=False) for a value _exact_json
# accepts (no cycle, so no markers; nothing for `default`), without building a
# JSONEncoder per call. None where json has no C speedups.
_c_make_encoder = getattr(json.encoder, "c_make_encoder", None)
_C_ENCODE = (
    _c_make_encoder(
        None, _no_default, json.encoder.encode_basestring_ascii, None, ":", ",", False, False, False
    )
    if _c_make_encoder is not None
    else None
)


def _exact_text(value: Any) -> str | None:
    """JSONSerializer().dumps(value) when JSON keeps `value` exactly; else None."""
    kind = _exactness(value)
    if kind is _INEXACT:
        return None
    if _orjson is not None and kind is _EXACT_NO_FLOAT:
        # orjson writes floats, non-ASCII text and DEL its own way: used only where its
        # bytes are json's (no float; ASCII without DEL, which json escapes as \u007f).
        try:
            raw: bytes = _orjson.dumps(value)
        except Exception:  # an int past 64 bits, nesting past its limit: json's way
            pass
        else:
            if raw.isascii() and b"\x7f" not in raw:
                return raw.decode()
    try:
        if _C_ENCODE is None:
            return json.dumps(value, separators=(",", ":"), allow_nan=False)
        return "".join(_C_ENCODE(value, 0))
    except Exception:  # an int too long for text, nesting too deep: the general way says
        return None


def _check_storable(text: str, what: str, type_name: str) -> None:
    """Raise SerializationError if PostgreSQL cannot store `text` (a custom serializer's):
    a NUL character, or a lone surrogate (not UTF-8)."""
    if "\x00" in text:
        raise SerializationError(
            f"cannot store {what}: the serializer's text holds a NUL character (at "
            f"{text.index(chr(0))}), which PostgreSQL cannot store in text: have it escape "
            "such characters (JSONSerializer does)",
            what=what,
            type_name=type_name,
        )
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise SerializationError(
            f"cannot store {what}: the serializer's text holds a lone surrogate "
            f"({text[exc.start : exc.end]!r} at {exc.start}), which is not UTF-8: have it "
            "escape such characters (JSONSerializer does)",
            what=what,
            type_name=type_name,
        ) from None


def _why(exc: Exception) -> str:
    """What is wrong with a value whose encoding raised `exc`, and the fix."""
    if isinstance(exc, _Refused):
        return str(exc)
    if isinstance(exc, RecursionError):
        return (
            "it is nested too deeply (or contains itself through a model's dump): return a "
            "flatter value"
        )
    if isinstance(exc, ValueError) and str(exc) == "Circular reference detected":
        return "it contains itself (a circular reference): return a copy without the loop"
    if isinstance(exc, ValueError) and str(exc).startswith("Out of range float values"):
        return (
            "it holds a float NaN or infinity, which JSON cannot hold: return None, or a "
            "Decimal (Decimal('NaN') and Decimal('Infinity') are kept)"
        )
    if isinstance(exc, ValueError) and str(exc).startswith("Exceeds the limit"):
        return f"it holds an int too long to write as text ({exc}): return it as a str"
    if isinstance(exc, TypeError | ValueError | OverflowError):
        return (
            f"{exc}. Return JSON-compatible values (dict, list, str, int, float, bool, None, "
            "datetime, Decimal, UUID, dataclasses) or pass Engine(serializer=...)"
        )
    return f"{type(exc).__name__}: {_text(exc)} (raised while it was encoded)"


def _text(exc: BaseException) -> str:
    try:
        return str(exc)
    except Exception:  # a __str__ that raises must not hide the error it describes
        return "<its str() raised>"


_SCALARS = frozenset({str, int, float, bool, type(None)})


_PLAIN_TYPES = frozenset(
    {
        str,
        int,
        float,
        bool,
        type(None),
        object,
        dt.datetime,
        dt.date,
        dt.time,
        dt.timedelta,
        decimal.Decimal,
        uuid.UUID,
        bytes,
    }
)


def _plain(annotation: Any) -> bool:
    """Whether the JSON form already decodes as `annotation` (no rebuilding needed): the
    scalars and tagged types, and lists, str-keyed dicts and unions of them."""
    try:
        return _plain_cached(annotation)
    except TypeError:  # unhashable (Annotated[..., {"a": 1}]): no memo
        return _plain_of(annotation)


def _plain_of(annotation: Any) -> bool:
    try:
        known = annotation in _PLAIN_TYPES
    except TypeError:
        known = False
    if annotation is None or annotation is Any or known:
        return True
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if annotation in (list, dict) or origin is list:
        return all(_plain(a) for a in args)
    if origin is dict:
        return (not args or args[0] is str) and all(_plain(a) for a in args[1:])
    if origin in (typing.Union, types.UnionType):
        return all(_plain(a) for a in args)
    return False


_plain_cached = functools.lru_cache(maxsize=1024)(_plain_of)


def _type_adapter(annotation: Any) -> Any:
    """pydantic's TypeAdapter for `annotation`, or None (no pydantic, or nothing to do:
    then pydantic is not even imported).

    A memo of pure values (an annotation's validator), not state: safe to share."""
    try:
        return _type_adapter_cached(annotation)
    except TypeError:  # unhashable (Annotated[..., {"a": 1}]): no memo
        return _type_adapter_of(annotation)


def _type_adapter_of(annotation: Any) -> Any:
    if annotation is inspect.Parameter.empty or _plain(annotation):
        return None
    try:
        import pydantic
    except ImportError:
        return None
    try:
        return pydantic.TypeAdapter(annotation)
    except Exception:  # not a type pydantic understands: no typed decoding
        return None


_type_adapter_cached = functools.lru_cache(maxsize=1024)(_type_adapter_of)


def _hints(fn: Any) -> dict[str, Any]:
    try:
        return dict(inspect.get_annotations(fn, eval_str=True))
    except Exception:  # names defined where the annotation cannot see them
        return {}


@functools.lru_cache(maxsize=4096)
def return_type(fn: Any) -> Any:
    """The return annotation of `fn`, resolved; None when it has none (or it cannot be
    resolved)."""
    return _hints(fn).get("return")


@functools.lru_cache(maxsize=4096)
def parameter_types(fn: Any) -> tuple[inspect.Signature | None, dict[str, Any]]:
    """`fn`'s signature and resolved parameter annotations (for binding and decoding)."""
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):
        return None, {}
    hints = _hints(fn)
    hints.pop("return", None)
    return signature, hints


def _kind(value: Any) -> str:
    return type(value).__qualname__


def faithful(serializer: Serializer, value: Any, text: str, annotation: Any, what: str) -> Any:
    """The value a replay will see for `value` (stored as `text`), to hand out now too.

    A first run and a replay must see the same value. A value of a type JSON keeps is
    returned as is. Otherwise the stored text is decoded (and, with pydantic installed,
    rebuilt as `annotation`: a dataclass, a model, a tuple, `dict[int, ...]`, an enum);
    when the decoded value differs from `value` and no annotation rebuilds it, the call
    fails now with SerializationError instead of a replay seeing something else. The
    value's own code (its __eq__, __hash__) is not run: it may raise, or lie."""
    if type(value) in _SCALARS and (annotation is None or annotation is type(value)):
        return value
    if _plain(annotation) and type(serializer) is JSONSerializer and _exact_json(value):
        return value  # reads back equal and of the same types: no need to decode it now
    try:
        decoded = serializer.loads(text)
    except Exception as exc:
        raise SerializationError(
            f"{what} is stored as {text!r:.80} but cannot be read back: "
            f"{type(exc).__name__}: {_text(exc)}. Return a plainer value, or fix the serializer",
            what=what,
            type_name=_kind(value),
        ) from None
    if not isinstance(serializer, JSONSerializer):
        return decoded  # other serializers round-trip by their contract
    adapter = _type_adapter(annotation)
    if adapter is not None:
        clash = _key_clash(value)
        if clash is not None:
            raise SerializationError(
                f"{what} has keys that are one key in JSON ({clash}): rename one of them",
                what=what,
                type_name=_kind(value),
            )
        try:
            return adapter.validate_python(decoded)
        except Exception as exc:
            raise SerializationError(
                f"{what} is stored as JSON but does not read back as {annotation!r}: {exc}",
                what=what,
                type_name=_kind(value),
            ) from None
    if _same(decoded, value):
        return decoded
    raise SerializationError(
        f"{what} would not read back the same after a restart: a {_kind(value)} is stored "
        f"as JSON and comes back as {_describe(decoded, value)}. Return JSON values (dict "
        "with str keys, list, str, int, float, bool, None, datetime, Decimal, UUID), or "
        "annotate the function's type (e.g. -> Order, -> tuple[int, str]) and install "
        "pydantic so it is rebuilt from the journal",
        what=what,
        type_name=_kind(value),
    )


def _same(decoded: Any, value: Any) -> bool:
    """Whether `decoded` (what JSON gave back) stands for `value`: lists and dicts of
    exactly those types, keys in the same order, and equal scalars. A walk, not `==`: no
    code of the value's own runs, and a NaN Decimal is the same NaN."""
    stack = [(decoded, value)]
    while stack:
        left, right = stack.pop()
        kind = type(left)
        if kind is list:
            if type(right) is not list or len(left) != len(right):
                return False
            stack.extend(zip(left, right, strict=True))
        elif kind is dict:
            if type(right) is not dict or len(left) != len(right):
                return False
            for (lk, lv), (rk, rv) in zip(left.items(), right.items(), strict=True):
                if not _same_scalar(lk, rk):
                    return False
                stack.append((lv, rv))
        elif not _same_scalar(left, right):
            return False
    return True


def _same_scalar(decoded: Any, value: Any) -> bool:
    """A decoded scalar against the value's: by the decoded type's own equality, so a
    subclass's value (a str enum member) is its value, and no __eq__ of the value's runs."""
    kind: Any = type(decoded)
    if decoded is None or not isinstance(value, kind):
        return decoded is None and value is None
    if kind is decimal.Decimal:
        return bool(decoded.compare_total(value) == 0)  # exact form; NaN is NaN
    if kind is dt.datetime:
        return _same_datetime(decoded, value)
    try:
        return kind.__eq__(decoded, value) is True
    except Exception:
        return False


def _same_datetime(decoded: dt.datetime, value: dt.datetime) -> bool:
    """The same instant read on the same wall clock (the same offset), or the same naive
    time. Not `==`: between two tzinfos it is False for every time in a fold or a gap
    (PEP 495), so a zone's 02:30 on the night the clocks go back would never match."""
    try:
        offset = dt.datetime.utcoffset(value)
        if offset != dt.datetime.utcoffset(decoded):
            return False
        if offset is None:
            return dt.datetime.__eq__(decoded, value) is True
        return dt.datetime.__sub__(decoded, value) == dt.timedelta(0)
    except Exception:  # a tzinfo of the value's own that raises
        return False


def _exact_json(value: Any, budget: int = 10_000) -> bool:
    """Whether JSON gives `value` back equal and of the same types: dicts with str keys
    that do not start with the tag, lists, and scalars, exactly those types (no subclass),
    no float that JSON cannot hold. A walk over the nodes, not the bytes: a step's output
    of a few large strings costs a few checks, not a decode. Gives up (False: the caller
    decodes) past `budget` nodes (so a value that contains itself is never exact)."""
    return _exactness(value, budget) is not _INEXACT


_INEXACT, _EXACT_NO_FLOAT, _EXACT_FLOAT = 0, 1, 2
_INFINITIES = (float("inf"), float("-inf"))


def _exactness(value: Any, budget: int = 10_000) -> int:
    """_exact_json's walk, telling too whether the value holds a float."""
    kind = type(value)
    if kind is str or kind is int or kind is bool or value is None:
        return _EXACT_NO_FLOAT
    floats = False
    stack = [value]
    while stack:
        budget -= 1
        if budget < 0:
            return _INEXACT
        item = stack.pop()
        kind = type(item)
        if kind is dict:
            for key in item:
                if type(key) is not str or key.startswith(_TAG):
                    return _INEXACT
            stack.extend(item.values())
        elif kind is list:
            stack.extend(item)
        elif kind is float:
            if item != item or item in _INFINITIES:
                return _INEXACT
            floats = True
        elif kind not in _SCALARS:
            return _INEXACT
    return _EXACT_FLOAT if floats else _EXACT_NO_FLOAT


def _key_clash(value: Any) -> str | None:
    """Two keys of one dict that JSON stores as one (1 and "1"), anywhere in `value`. A
    walk (a value deep enough for json is not too deep for it), running none of the keys'
    own code."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            seen: dict[str, Any] = {}
            for key in item:
                text = _key_text(key)
                if text is None:
                    continue
                if text in seen:  # distinct keys of one dict, one text: a clash
                    return f"{_shown(seen[text])} and {_shown(key)}"
                seen[text] = key
            stack.extend(item.values())
        elif isinstance(item, list | tuple | set | frozenset):
            stack.extend(item)
    return None


def _key_text(key: Any) -> str | None:
    """The text JSON stores for a dict key (None: not a key JSON stores)."""
    if isinstance(key, str):
        return str.__str__(key)  # a subclass's content, without its own __str__
    try:
        return json.dumps(key)
    except Exception:
        return None


def _shown(value: Any) -> str:
    try:
        return repr(value)[:80]
    except Exception:
        return f"a {_kind(value)}"


def _describe(decoded: Any, value: Any) -> str:
    if type(decoded) is not type(value):
        return f"a {_kind(decoded)}"
    if isinstance(decoded, list | dict):
        return f"a {_kind(decoded)} with other contents (tuples become lists, keys become str)"
    return f"a {_kind(decoded)} that is not the same ({decoded!r:.80})"


def check_faithful(serializer: Serializer, value: Any, annotation: Any, what: str) -> None:
    """Raise SerializationError now if `value` would not read back the same (see
    `faithful`); used for workflow inputs, which are checked one argument at a time."""
    if type(value) in _SCALARS:
        return
    try:
        text = serializer.dumps(value)
    except Exception:
        return  # the caller's dumps_checked reports it, by name
    faithful(serializer, value, text, annotation, what)


def rebuild(value: Any, annotation: Any) -> Any:
    """A decoded value rebuilt as `annotation` (with pydantic), or as it is."""
    adapter = _type_adapter(annotation)
    return value if adapter is None else adapter.validate_python(value)
