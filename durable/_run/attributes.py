"""Attributes: key/value pairs on a workflow run, to find it again (a customer, an amount,
a region, a due date).

They are set when the run is recorded (`attributes=` on a start or an enqueue, or a
`with durable.workflow_attributes(...):` block around the starts) and from the workflow's
own code (`durable.set_attributes`), and read back by filters (durable.RunFilter: equality,
and ranges on numbers and times). They live in the workflows row (`attributes`, jsonb,
migration 0033): a call from workflow code merges its pairs into it and journals the call
in the same statement, so a replay or a recovery finds the call and writes nothing again.

A value is a string, a number, a bool, None or an aware datetime (stored as its UTC ISO
text, which a time range compares as a time). Keys are non-empty text of at most 100
characters; a run holds at most 100 keys of at most 2,000 characters of values each.
"""

from __future__ import annotations

import datetime as dt
import json
import math
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

from durable._run.context import current_run
from durable.errors import ConfigurationError

#: What an attribute holds (a datetime is stored as its UTC ISO text).
AttributeValue = str | int | float | bool | dt.datetime | None

MAX_KEYS = 100
MAX_KEY_CHARS = 100
MAX_VALUE_CHARS = 2_000

# (attributes as JSON text, the run whose code entered the block, or None outside any run)
_scope: ContextVar[tuple[dict[str, Any], object | None] | None] = ContextVar(
    "durable_workflow_attributes", default=None
)


def stored_value(key: str, value: object) -> str | int | float | bool | None:
    """`value` as the attributes column holds it; ConfigurationError naming the key."""
    if isinstance(value, dt.datetime):
        if value.tzinfo is None or value.utcoffset() is None:
            raise ConfigurationError(
                f"attribute {key!r}: {value!r} has no time zone: give an aware datetime "
                "(e.g. datetime.now(timezone.utc))"
            )
        return value.astimezone(dt.UTC).isoformat()
    if isinstance(value, float) and not math.isfinite(value):
        raise ConfigurationError(f"attribute {key!r}: {value!r} is not a finite number")
    if isinstance(value, str):
        if len(value) > MAX_VALUE_CHARS or "\x00" in value:
            raise ConfigurationError(
                f"attribute {key!r}: give text of at most {MAX_VALUE_CHARS} characters, without NUL"
            )
        return value
    if value is None or isinstance(value, bool | int | float):
        return value
    raise ConfigurationError(
        f"attribute {key!r}: {type(value).__name__} is not an attribute value: give a "
        "string, a number, a bool, None or an aware datetime"
    )


def check_key(key: object) -> str:
    if not isinstance(key, str) or not key or len(key) > MAX_KEY_CHARS or "\x00" in key:
        raise ConfigurationError(
            f"attribute key {key!r}: give non-empty text of at most {MAX_KEY_CHARS} characters"
        )
    return key


def check_attributes(attributes: object) -> dict[str, Any]:
    """The attributes of a start or a set_attributes call, as stored (checked)."""
    if not isinstance(attributes, Mapping):
        raise ConfigurationError(
            f"attributes={attributes!r}: give a dict of attributes, e.g. "
            '{"customer": "c-1", "amount": 120}'
        )
    if len(attributes) > MAX_KEYS:
        raise ConfigurationError(f"attributes: give at most {MAX_KEYS} keys")
    return {check_key(k): stored_value(k, v) for k, v in attributes.items()}


def encode(attributes: Mapping[str, Any]) -> str:
    return json.dumps(attributes, sort_keys=True, separators=(",", ":"))


@contextmanager
def workflow_attributes(attributes: Mapping[str, AttributeValue]) -> Iterator[None]:
    """Give the workflows started inside this block (engine.start, submit, enqueue,
    durable.start_child, ... and their `_async` twins) these attributes. Inside a
    workflow's code it applies to the children that code starts. A block inside another
    adds to (and overrides keys of) the outer one's."""
    checked = check_attributes(attributes)
    run = current_run.get()
    outer = _scope.get()
    if outer is not None and outer[1] is run:
        checked = {**outer[0], **checked}
    token = _scope.set((checked, run))
    try:
        yield
    finally:
        _scope.reset(token)


def pop_attributes(kwargs: dict[str, Any]) -> dict[str, Any] | None:
    """A start's own `attributes=`, popped from the keyword arguments meant for the
    workflow (as `workflow_id=` is), and checked."""
    value = kwargs.pop("attributes", None)
    return None if value is None else check_attributes(value)


@contextmanager
def call_attributes(attributes: Mapping[str, Any] | None) -> Iterator[None]:
    """workflow_attributes(attributes) around one start, or nothing when it gave none."""
    if attributes is None:
        yield
        return
    with workflow_attributes(attributes):
        yield


def attributes_for() -> str:
    """The attributes a workflow is recorded with (JSON text): the block's (or call's)
    when the starting code is in one, else none."""
    scoped = _scope.get()
    if scoped is not None and scoped[1] is current_run.get():
        return encode(scoped[0])
    return "{}"


def shown(attributes: Mapping[str, Any]) -> str:
    """`key=value` pairs, one line (the CLI's list)."""
    return " ".join(
        f"{k}={json.dumps(v) if not isinstance(v, str) else v}"
        for k, v in sorted(attributes.items())
    )
