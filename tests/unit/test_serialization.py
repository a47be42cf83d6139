"""JSONSerializer against hostile values: a user's dict that looks like one of its tags,
stored tags that are corrupt, and values JSON does not keep (tuples, int keys, sets,
dataclasses), which must either fail at once or be rebuilt by their annotation.

`same` compares values and their types at every level (`==` alone takes "red" for a str
enum member, 1 for True, and a model for nothing in particular).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import decimal
import enum
import json
import uuid
from typing import Any

import pydantic
import pytest

from durable import errors, serialization
from durable.serialization import JSONSerializer

TAG = "__durable__"


def same(a: Any, b: Any) -> bool:
    """Equal, and of the same types at every level (dict keys included)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return [(type(k), k) for k in a] == [(type(k), k) for k in b] and all(
            same(a[k], b[k]) for k in a
        )
    if isinstance(a, list | tuple):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    return bool(a == b)


def round_trip(value: Any) -> Any:
    s = JSONSerializer()
    return s.loads(s.dumps(value))


def raw_keys(text: str) -> list[str]:
    """Every dict key in stored JSON text, read without durable's decoding."""
    keys: list[str] = []

    def hook(obj: dict[str, Any]) -> dict[str, Any]:
        keys.extend(obj)
        return obj

    json.loads(text, object_hook=hook)
    return keys


# A user's dicts that a decoder could mistake for tagged values.
LOOKALIKES = {
    "datetime-garbage": {TAG: "datetime", "v": "garbage"},
    "decimal-garbage": {TAG: "decimal", "v": "x"},
    "uuid-not-a-string": {TAG: "uuid", "v": 1},
    "timedelta-not-a-number": {TAG: "timedelta", "v": "x"},
    "bytes-not-base64": {TAG: "bytes", "v": "a"},
    # Valid tags: the user's dict must still come back as the dict, not as the value.
    "valid-datetime-tag": {TAG: "datetime", "v": "2024-01-01T00:00:00"},
    "valid-decimal-tag": {TAG: "decimal", "v": "1.10"},
    "valid-bytes-tag": {TAG: "bytes", "v": "aGk="},
    "nested": {
        "order": {"paid_at": {TAG: "datetime", "v": "garbage"}},
        "items": [{TAG: "uuid", "v": "not-a-uuid"}, [{TAG: "date", "v": "2024-13-45"}]],
    },
    "in-a-list": [{TAG: "time", "v": "25:99"}, {TAG: "decimal", "v": "NaN-ish"}],
}


@pytest.mark.parametrize("name", sorted(LOOKALIKES))
def test_a_dict_that_looks_like_a_tag_round_trips_as_the_users_dict(name: str) -> None:
    value = LOOKALIKES[name]
    assert same(round_trip(value), value)


@pytest.mark.parametrize("name", sorted(LOOKALIKES))
def test_the_stored_text_never_holds_the_users_key_as_a_tag(name: str) -> None:
    # Another reader of the journal (a person, another language) must be able to tell a
    # tagged value from a user's dict: the user's key is stored escaped.
    text = JSONSerializer().dumps(LOOKALIKES[name])
    assert TAG not in raw_keys(text)


def test_keys_that_start_with_the_tag_or_its_escape_round_trip() -> None:
    value = {
        TAG + "~x": 1,
        TAG + "~": 2,
        TAG + "~" + TAG: {TAG: "datetime", "v": "garbage"},
        TAG + "x": [{TAG + "~" + TAG + "~": {TAG: "decimal", "v": "x"}}],
        TAG: 5,
        "v": None,
        "plain": TAG,  # the tag as a string value is just a string
    }
    assert same(round_trip(value), value)


def test_real_tagged_values_still_decode_beside_lookalikes() -> None:
    when = dt.datetime(2024, 5, 6, 7, 8, 9, tzinfo=dt.UTC)
    ident = uuid.UUID("12345678-1234-5678-1234-567812345678")
    value = {
        "when": when,
        "amount": decimal.Decimal("10.10"),
        "id": ident,
        "raw": b"\x00\xff",
        "fake_when": {TAG: "datetime", "v": when.isoformat()},
        "fake_amount": {TAG: "decimal", "v": "x"},
        "day": dt.date(2024, 1, 2),
        "wait": dt.timedelta(seconds=90),
    }
    back = round_trip(value)
    assert same(back, value)
    assert isinstance(back["when"], dt.datetime) and isinstance(back["fake_when"], dict)


@dataclasses.dataclass
class Tagged:
    name: str
    meta: dict[str, Any]


class TaggedModel(pydantic.BaseModel):
    name: str
    meta: dict[str, Any]


def test_lookalikes_inside_dataclasses_and_models_stay_dicts() -> None:
    meta = {TAG: "datetime", "v": "garbage", "deep": [{TAG: "uuid", "v": 1}]}
    as_dict = {"name": "n", "meta": meta}
    assert same(round_trip(Tagged("n", meta)), as_dict)
    assert same(round_trip(TaggedModel(name="n", meta=meta)), as_dict)
    assert same(round_trip({"wrapped": [Tagged("n", meta)]}), {"wrapped": [as_dict]})
    # ...and rebuilt by annotation they are the same objects again.
    s = JSONSerializer()
    assert serialization.rebuild(s.loads(s.dumps(Tagged("n", meta))), Tagged) == Tagged("n", meta)


def test_faithful_accepts_a_lookalike_without_an_annotation() -> None:
    s = JSONSerializer()
    value = {TAG: "datetime", "v": "garbage"}
    back = serialization.faithful(s, value, s.dumps(value), None, "the output of step 'x'")
    assert same(back, value)


# Corrupt stored tags (a hand-edited journal, a bad migration): loading fails with one
# error type whose message says which tagged value is corrupt, never a stray decimal,
# AttributeError or silently wrong value.
CORRUPT_TAGS = [
    pytest.param("datetime", "garbage", id="datetime"),
    pytest.param("datetime", 5, id="datetime-not-a-string"),
    pytest.param("date", "2024-13-45", id="date"),
    pytest.param("time", "25:99", id="time"),
    pytest.param("timedelta", "x", id="timedelta"),
    pytest.param("timedelta", 1e300, id="timedelta-overflow"),
    pytest.param("uuid", "not-a-uuid", id="uuid"),
    pytest.param("bytes", "a", id="bytes-bad-padding"),
    pytest.param("decimal", "x", id="decimal"),
    pytest.param("uuid", 5, id="uuid-not-a-string"),
    pytest.param("bytes", "!!!!", id="bytes-not-base64"),
]


@pytest.mark.parametrize(("tag", "stored"), CORRUPT_TAGS)
def test_a_corrupt_stored_tag_is_a_value_error_naming_it(tag: str, stored: object) -> None:
    text = json.dumps({"x": {TAG: tag, "v": stored}})
    with pytest.raises(ValueError, match=f"stored {tag} value is corrupt"):
        JSONSerializer().loads(text)


# -- values JSON does not keep -----------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Order:
    order_id: str
    cents: int


class Receipt(pydantic.BaseModel):
    order_id: str
    cents: int


class Color(enum.StrEnum):
    RED = "red"
    BLUE = "blue"


UNFAITHFUL = {
    "tuple": (1, "a"),
    "dataclass": Order("o-1", 250),
    "int-keys": {1: "a", 2: "b"},
    "set": {1, 2, 3},
    "model": Receipt(order_id="o-1", cents=250),
    "nested-tuple": {"pair": (1, 2)},
}


@pytest.mark.parametrize("name", sorted(UNFAITHFUL))
def test_a_value_that_reads_back_different_fails_without_an_annotation(name: str) -> None:
    value = UNFAITHFUL[name]
    s = JSONSerializer()
    with pytest.raises(errors.SerializationError, match="annotate") as info:
        serialization.faithful(s, value, s.dumps(value), None, "the output of step 'make'")
    assert "step 'make'" in str(info.value)
    assert info.value.type_name == type(value).__qualname__


ANNOTATED = [
    pytest.param((1, "a"), tuple[int, str], id="tuple"),
    pytest.param(Order("o-1", 250), Order, id="dataclass"),
    pytest.param({1: "a", 2: "b"}, dict[int, str], id="int-keys"),
    pytest.param({1, 2, 3}, set[int], id="set"),
    pytest.param(frozenset({"a", "b"}), frozenset[str], id="frozenset"),
    pytest.param(Receipt(order_id="o-1", cents=250), Receipt, id="model"),
    pytest.param(Color.BLUE, Color, id="enum"),
    pytest.param({"pair": (1, 2)}, dict[str, tuple[int, int]], id="nested-tuple"),
]


@pytest.mark.parametrize(("value", "annotation"), ANNOTATED)
def test_an_annotation_rebuilds_the_same_value_now_and_on_replay(
    value: Any, annotation: Any
) -> None:
    s = JSONSerializer()
    text = s.dumps(value)
    now = serialization.faithful(s, value, text, annotation, "the output of step 'make'")
    later = serialization.rebuild(s.loads(text), annotation)  # what a replay does
    assert same(now, value)
    assert same(later, value)


def test_an_annotation_the_value_does_not_fit_fails_now() -> None:
    s = JSONSerializer()
    with pytest.raises(errors.SerializationError, match="does not read back as"):
        serialization.faithful(s, "nope", s.dumps("nope"), Order, "the output of step 'make'")
