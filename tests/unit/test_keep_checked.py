"""The short way a step's output is stored (serialization.keep_checked: the default JSON
serializer, a value JSON keeps exactly, encoded once in C, by orjson or by json's own
encoder) writes the very text the general way writes (dumps_checked, then faithful), and
hands out the same value; a value the general way refuses is refused with the same error."""

from __future__ import annotations

import datetime as dt
import enum
import uuid
from decimal import Decimal
from typing import Any

import pytest

from durable import serialization
from durable.errors import PayloadTooLargeError, SerializationError
from durable.serialization import JSONSerializer, dumps_checked, faithful, keep_checked


class Color(enum.Enum):
    RED = "red"


class Name(str):
    pass


cyclic: list[Any] = []
cyclic.append(cyclic)

VALUES: list[Any] = [
    None,
    True,
    False,
    0,
    -7,
    2**53 + 1,
    2**63 - 1,
    2**63,
    2**64,
    -(2**63) - 1,
    10**100,
    10**5000,  # past the limit of int to text: refused
    0.1,
    -0.0,
    1e-7,
    1e16,
    1.7976931348623157e308,
    5e-324,
    float("nan"),  # refused
    float("inf"),  # refused
    "",
    "plain",
    "été ünïcødé 日本語 🎉",
    '\x00\x01\x1f\x7f"\\/\n\t\b\f\r',
    "x\ud800y",  # a lone surrogate, escaped
    "__durable__",
    {"__durable__": 1},  # a tag key: escaped
    {"a__durable__": "__durable__x"},
    [],
    {},
    [1, [2, [3, [4, {"deep": [None, True, 1.5, "é"]}]]]],
    {"i": 1, "ok": True, "pad": "x" * 200},
    {"nested": {"list": [1, 2.5, "three", None, {"k": False}]}},
    (1, 2),  # a tuple comes back a list: refused
    {1: "a"},  # an int key comes back a str: refused
    {"t": (1,)},
    Color.RED,
    Name("sub"),
    [Name("sub")],
    {"s": {1, 2}},
    Decimal("1.10"),
    Decimal("NaN"),
    Decimal("sNaN"),  # refused
    uuid.UUID(int=5),
    dt.datetime(2026, 12, 7, 11, 0, tzinfo=dt.UTC),
    dt.timedelta(days=3, microseconds=1),
    dt.timedelta(days=100_000, microseconds=1),  # past a float: an exact decimal string
    b"\x00bytes",
    cyclic,  # refused
    [[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[0]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]],
    "x" * 5000,
]


class SubJSON(JSONSerializer):
    """The same JSON, through a serializer of the user's: always the general way."""


def _general(value: Any, annotation: Any, limit: int) -> tuple[str, Any] | str:
    serializer = SubJSON()
    try:
        text = dumps_checked(serializer, value, "the output", limit)
        return text, faithful(serializer, value, text, annotation, "the output")
    except (SerializationError, PayloadTooLargeError) as exc:
        return f"{type(exc).__name__}: {exc}"


def _short(value: Any, annotation: Any, limit: int) -> tuple[str, Any] | str:
    try:
        return keep_checked(JSONSerializer(), value, "the output", limit, annotation)
    except (SerializationError, PayloadTooLargeError) as exc:
        return f"{type(exc).__name__}: {exc}"


def _same_outcome(short: tuple[str, Any] | str, general: tuple[str, Any] | str) -> None:
    if isinstance(general, str):
        assert short == general
        return
    assert isinstance(short, tuple)
    assert short[0] == general[0]  # the stored text, character for character
    assert repr(short[1]) == repr(general[1])  # the value handed out
    assert type(short[1]) is type(general[1])


@pytest.mark.parametrize("with_orjson", [True, False])
@pytest.mark.parametrize("annotation", [None, Any, dict[str, Any], int])
def test_the_short_way_writes_what_the_general_way_writes(
    with_orjson: bool, annotation: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    if with_orjson:
        pytest.importorskip("orjson")
    else:
        monkeypatch.setattr(serialization, "_orjson", None)
    for value in VALUES:
        _same_outcome(_short(value, annotation, 1 << 20), _general(value, annotation, 1 << 20))


@pytest.mark.parametrize("with_orjson", [True, False])
def test_the_short_way_refuses_an_output_past_the_payload_limit_alike(
    with_orjson: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    if not with_orjson:
        monkeypatch.setattr(serialization, "_orjson", None)
    for value in ("x" * 100, {"pad": "é" * 40}, [1.5] * 30):
        short, general = _short(value, None, 50), _general(value, None, 50)
        assert isinstance(general, str) and general.startswith("PayloadTooLargeError")
        assert short == general


def test_the_short_way_hands_out_the_value_itself() -> None:
    value = {"i": 1, "items": [1, 2, 3]}
    text, kept = keep_checked(JSONSerializer(), value, "the output", 1 << 20, None)
    assert kept is value
    assert text == '{"i":1,"items":[1,2,3]}'
