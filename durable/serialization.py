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
import json
import pickle
import uuid
from typing import Any, Protocol, runtime_checkable

from durable.errors import SerializationError

__all__ = ["JSONSerializer", "PickleSerializer", "Serializer"]

_TAG = "__durable__"


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
        return {_TAG: "datetime", "v": value.isoformat()}
    if isinstance(value, dt.date):
        return {_TAG: "date", "v": value.isoformat()}
    if isinstance(value, dt.time):
        return {_TAG: "time", "v": value.isoformat()}
    if isinstance(value, dt.timedelta):
        return {_TAG: "timedelta", "v": value.total_seconds()}
    if isinstance(value, decimal.Decimal):
        return {_TAG: "decimal", "v": str(value)}
    if isinstance(value, uuid.UUID):
        return {_TAG: "uuid", "v": str(value)}
    if isinstance(value, bytes):
        return {_TAG: "bytes", "v": base64.b64encode(value).decode("ascii")}
    if isinstance(value, set | frozenset):
        return sorted(value, key=repr)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: getattr(value, f.name) for f in dataclasses.fields(value)}
    model_dump = getattr(value, "model_dump", None)
    if callable(model_dump):
        return model_dump(mode="json")
    raise TypeError(f"Object of type {type(value).__qualname__} is not JSON serializable")


_DECODERS: dict[str, Any] = {
    "datetime": dt.datetime.fromisoformat,
    "date": dt.date.fromisoformat,
    "time": dt.time.fromisoformat,
    "timedelta": lambda v: dt.timedelta(seconds=v),
    "decimal": decimal.Decimal,
    "uuid": uuid.UUID,
    "bytes": lambda v: base64.b64decode(v),
}


def _decode(obj: dict[str, Any]) -> Any:
    tag = obj.get(_TAG)
    if tag is not None and len(obj) == 2 and "v" in obj:
        decoder = _DECODERS.get(tag)
        if decoder is not None:
            return decoder(obj["v"])
    return obj


class JSONSerializer:
    """JSON with round-tripping hooks for datetime, date, time, timedelta, Decimal, UUID and
    bytes; dataclasses and pydantic models are stored as dicts. Tuples come back as lists."""

    def dumps(self, value: Any) -> str:
        return json.dumps(value, default=_encode, separators=(",", ":"), allow_nan=False)

    def loads(self, data: str) -> Any:
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
    """
    from durable.errors import PayloadTooLargeError

    try:
        text = serializer.dumps(value)
    except (TypeError, ValueError, OverflowError, RecursionError) as exc:
        raise SerializationError(
            f"cannot serialize {what}: {exc}. Return JSON-compatible values (dict, list, str, "
            "int, float, bool, None, datetime, Decimal, UUID, dataclasses) or pass "
            "Engine(serializer=...)",
            what=what,
            type_name=type(value).__qualname__,
        ) from exc
    # Characters equal bytes for ASCII text, the common case; encode only when it is not.
    size = len(text) if text.isascii() else len(text.encode("utf-8"))
    if size > limit:
        raise PayloadTooLargeError(what, size, limit)
    return text
