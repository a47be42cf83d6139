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
import pickle
import typing
import uuid
import zoneinfo
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


# -- hostile values: each is kept, or fails with a SerializationError saying what is wrong ----

WHAT = "the output of step 'make'"


def keep(value: Any, annotation: Any = None, serializer: Any = None) -> Any:
    """What a step's output goes through before it is journaled (Run.keep)."""
    s = serializer or JSONSerializer()
    text = serialization.dumps_checked(s, value, WHAT, 10**8)
    return serialization.faithful(s, value, text, annotation, WHAT)


SIGNALING = [
    pytest.param(decimal.Decimal("sNaN"), None, id="snan"),
    pytest.param(decimal.Decimal("-sNaN7"), None, id="negative-snan-with-payload"),
    pytest.param({"price": [decimal.Decimal("sNaN")]}, None, id="nested"),
    pytest.param(decimal.Decimal("sNaN"), decimal.Decimal, id="annotated"),
]


@pytest.mark.parametrize(("value", "annotation"), SIGNALING)
def test_a_signaling_nan_decimal_is_refused_saying_what_to_return(
    value: Any, annotation: Any
) -> None:
    with pytest.raises(errors.SerializationError, match="signaling NaN") as info:
        keep(value, annotation)
    assert "Decimal('NaN')" in str(info.value)  # the fix
    assert WHAT in str(info.value)


@pytest.mark.parametrize(
    "text", ["NaN", "-NaN", "NaN123", "Infinity", "-Infinity", "-0", "1.10", "1E+999999", "0E-1000"]
)
def test_a_special_or_extreme_decimal_is_kept_exactly(text: str) -> None:
    value = decimal.Decimal(text)
    for stored in (value, {"amount": value}, [value]):
        for got in (keep(stored), round_trip(stored)):
            inner = got["amount"] if isinstance(got, dict) else got
            inner = inner[0] if isinstance(inner, list) else inner
            assert type(inner) is decimal.Decimal and str(inner) == text


TIMEDELTAS = [
    dt.timedelta(days=100000, microseconds=1),
    dt.timedelta(days=-100000, microseconds=1),
    dt.timedelta.max,
    dt.timedelta.min,
    dt.timedelta(microseconds=-1),
    dt.timedelta(days=1, microseconds=999999),
    dt.timedelta(0),
    dt.timedelta(seconds=90.5),
]


@pytest.mark.parametrize("value", TIMEDELTAS, ids=str)
def test_a_timedelta_is_kept_to_the_microsecond(value: dt.timedelta) -> None:
    assert same(keep(value), value)
    assert same(keep({"wait": [value]}), {"wait": [value]})
    assert same(round_trip(value), value)


def test_a_timedelta_that_a_float_holds_is_stored_as_before() -> None:
    # Seconds as a number, as every journal so far has it: older readers still read it.
    s = JSONSerializer()
    assert s.dumps(dt.timedelta(seconds=90.5)) == json.dumps(
        {TAG: "timedelta", "v": 90.5}, separators=(",", ":")
    )
    assert s.loads(json.dumps({TAG: "timedelta", "v": 90})) == dt.timedelta(seconds=90)


class Touchy:
    """Whose comparison raises (a numpy array's truth value, a lazy proxy...)."""

    def __eq__(self, other: object) -> bool:
        raise RuntimeError("do not compare me")

    __hash__ = object.__hash__


@dataclasses.dataclass(eq=False)
class TouchyOrder:
    order_id: str

    def __eq__(self, other: object) -> bool:
        raise RuntimeError("do not compare me")


class TouchyModel(pydantic.BaseModel):
    order_id: str

    def __eq__(self, other: object) -> bool:
        raise RuntimeError("do not compare me")


class TouchyDict(dict[str, int]):
    def __eq__(self, other: object) -> bool:
        raise RuntimeError("do not compare me")

    __hash__ = None  # type: ignore[assignment]


class TouchyColor(enum.StrEnum):
    RED = "red"

    def __eq__(self, other: object) -> bool:
        raise RuntimeError("do not compare me")

    __hash__ = str.__hash__


@pytest.mark.parametrize(
    "value",
    [
        pytest.param(TouchyOrder("o-1"), id="dataclass"),
        pytest.param(TouchyModel(order_id="o-1"), id="model"),
        pytest.param(TouchyDict(a=1), id="dict-subclass"),
        pytest.param({"orders": [TouchyOrder("o-1")]}, id="nested"),
    ],
)
def test_an_output_whose_eq_raises_is_judged_without_calling_it(value: Any) -> None:
    # Like any dataclass or model without an annotation, it would read back as a dict.
    with pytest.raises(errors.SerializationError, match="annotate"):
        keep(value)


def test_an_output_whose_eq_raises_is_kept_when_it_reads_back_the_same() -> None:
    assert same(keep({"color": TouchyColor.RED}), {"color": "red"})  # a str enum is its value
    assert same(keep({TouchyColor.RED: 1}, dict[str, int]), {"red": 1})
    rebuilt = keep(TouchyOrder("o-1"), TouchyOrder)
    assert type(rebuilt) is TouchyOrder and rebuilt.order_id == "o-1"


def _raises(message: str) -> Any:
    def boom(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError(message)

    return boom


class BrokenDump(pydantic.BaseModel):
    order_id: str

    def model_dump(self, *args: Any, **kwargs: Any) -> Any:  # type: ignore[override]
        raise RuntimeError("the model cannot dump itself")


@dataclasses.dataclass(frozen=True)
class BadRepr:
    n: int

    def __repr__(self) -> str:
        raise RuntimeError("no repr")


def test_an_error_raised_by_the_values_own_code_while_encoding_is_a_serialization_error() -> None:
    with pytest.raises(errors.SerializationError, match="RuntimeError: the model cannot dump"):
        keep(BrokenDump(order_id="o-1"))
    with pytest.raises(errors.SerializationError, match="RuntimeError: no repr"):
        keep({BadRepr(1), BadRepr(2)}, set[BadRepr])


@dataclasses.dataclass
class Node:
    next: Any = None


def test_a_value_that_contains_itself_or_is_nested_too_deep_says_so() -> None:
    loop: list[Any] = []
    loop.append(loop)
    looped: dict[str, Any] = {}
    looped["self"] = looped
    node = Node()
    node.next = node
    for value in (loop, looped, {"a": [loop]}, node):
        with pytest.raises(errors.SerializationError, match="contains itself"):
            keep(value)
    deep: list[Any] = []
    for _ in range(100_000):
        deep = [deep]
    with pytest.raises(errors.SerializationError, match="nested too deeply"):
        keep(deep)


@pytest.mark.parametrize(
    ("value", "message"),
    [
        pytest.param(float("nan"), "float NaN or infinity", id="nan"),
        pytest.param({"x": [float("-inf")]}, "float NaN or infinity", id="infinity"),
        pytest.param(10**5000, "return it as a str", id="int-too-long"),
    ],
)
def test_a_number_json_cannot_write_says_what_to_return(value: Any, message: str) -> None:
    with pytest.raises(errors.SerializationError, match=message):
        keep(value)


def test_a_deep_value_that_is_stored_is_also_judged() -> None:
    # Deep enough to be near the interpreter's recursion limit, stored by json: whatever
    # durable does after that (comparing, checking keys, rebuilding) must not fail.
    value: Any = 1
    for _ in range(900):
        value = [value]
    assert keep(value) == value
    wrapped: Any = {"k": 1}
    for _ in range(400):
        wrapped = {"k": [wrapped]}
    assert keep(wrapped) == wrapped
    try:
        keep((wrapped,), tuple[Any])
    except errors.SerializationError:
        pass  # refused in words is fine; a RecursionError is not


def test_keys_that_differ_only_by_quotes_are_not_one_key() -> None:
    value = {"a": (1,), '"a"': (2,)}
    assert same(keep(value, dict[str, tuple[int]]), value)


def test_an_annotation_that_cannot_be_hashed_still_rebuilds() -> None:
    annotation = typing.Annotated[tuple[int, int], {"unit": "cents"}]
    assert same(keep((1, 2), annotation), (1, 2))


class RawText:
    """A serializer of the user's, returning whatever text it is given to return."""

    def __init__(self, text: Any, fail: BaseException | None = None) -> None:
        self.text, self.fail = text, fail

    def dumps(self, value: Any) -> str:
        if self.fail is not None:
            raise self.fail
        return self.text

    def loads(self, data: str) -> Any:
        raise ValueError("cannot read this back")


@pytest.mark.parametrize(
    ("serializer", "message"),
    [
        pytest.param(RawText("a\x00b"), "NUL character", id="nul"),
        pytest.param(RawText("a\ud800b"), "lone surrogate", id="surrogate"),
        pytest.param(RawText(b"[]"), "returned a bytes, not a str", id="bytes"),
        pytest.param(
            RawText("", pickle.PicklingError("cannot pickle 'generator'")),
            "PicklingError: cannot pickle",
            id="pickling-error",
        ),
        pytest.param(RawText("ok"), "cannot be read back: ValueError", id="loads-fails"),
    ],
)
def test_a_serializers_text_that_cannot_be_stored_or_read_is_a_serialization_error(
    serializer: RawText, message: str
) -> None:
    with pytest.raises(errors.SerializationError, match=message):
        keep(["x"], None, serializer)


@pytest.mark.parametrize(
    ("zone", "wall", "fold"),
    [
        ("Europe/Berlin", "2026-10-25T02:30", 0),  # the repeated hour, first time
        ("Europe/Berlin", "2026-10-25T02:30", 1),  # ... and second time
        ("Europe/Berlin", "2026-03-29T02:30", 0),  # the skipped hour: PEP 495 reads it
        ("Europe/Berlin", "2026-03-29T02:30", 1),
        ("America/New_York", "2026-11-01T01:30", 1),
        ("Australia/Lord_Howe", "2026-04-05T01:45", 1),  # a 30-minute change
        ("Australia/Lord_Howe", "2026-10-04T02:15", 0),
    ],
)
def test_a_zoned_datetime_reads_back_as_the_same_instant_in_its_zone(
    zone: str, wall: str, fold: int
) -> None:
    value = dt.datetime.fromisoformat(wall).replace(tzinfo=zoneinfo.ZoneInfo(zone), fold=fold)
    text = JSONSerializer().dumps({"at": value})
    assert zone in text
    for back in (
        JSONSerializer().loads(text)["at"],
        serialization.faithful(
            JSONSerializer(), value, JSONSerializer().dumps(value), dt.datetime, "x"
        ),
    ):
        assert back.astimezone(dt.UTC) == value.astimezone(dt.UTC)  # the same instant
        assert back.tzinfo is zoneinfo.ZoneInfo(zone)  # in its zone
        assert (back.replace(tzinfo=None), back.fold, back.utcoffset()) == (
            value.replace(tzinfo=None),
            value.fold,
            value.utcoffset(),
        )
    serialization.check_faithful(JSONSerializer(), value, dt.datetime, "an input")


def test_other_datetimes_are_checked_as_instants_on_their_clock() -> None:
    # Plain ISO 8601 (what journals held before zones were written) still reads back.
    old = JSONSerializer().loads('{"__durable__":"datetime","v":"2026-10-25T02:30:00+01:00"}')
    assert old == dt.datetime(2026, 10, 25, 1, 30, tzinfo=dt.UTC)
    # A zone this machine does not know: the instant, at the stored offset.
    unknown = '{"__durable__":"datetime","v":"2026-10-25T02:30:00+01:00[Nowhere/City]"}'
    assert JSONSerializer().loads(unknown).utcoffset() == dt.timedelta(hours=1)
    fixed = dt.datetime(2026, 10, 25, 2, 30, tzinfo=dt.timezone(dt.timedelta(hours=1)))
    assert (
        serialization.faithful(JSONSerializer(), fixed, JSONSerializer().dumps(fixed), None, "x")
        == fixed
    )
    naive = dt.datetime(2026, 10, 25, 2, 30, fold=1)
    assert (
        serialization.faithful(JSONSerializer(), naive, JSONSerializer().dumps(naive), None, "x")
        == naive
    )
