"""A recovered run replays its journal as the first run wrote it: every shape of value a
step returns (or error it raises) comes back the same, the stored inputs are rebuilt the
same whether given by position or by name, and a record no call reaches is never decoded
(journals are loaded by the batch, and each record is made and decoded only when its call
replays it)."""

from __future__ import annotations

import dataclasses
import datetime as dt
import decimal
import uuid
from typing import Any

import psycopg

import durable
from durable import errors
from tests.integration.test_journal import expire


@dataclasses.dataclass
class Order:
    id: str
    cents: int


class CountingSerializer(durable.JSONSerializer):
    """The JSON serializer, noting every text it decodes."""

    def __init__(self) -> None:
        self.decoded: list[str] = []

    def loads(self, data: str) -> Any:
        self.decoded.append(data)
        return super().loads(data)


VALUES: list[Any] = [
    0,
    -7,
    2**62,
    1.5,
    "",
    "héllo ✓ \u2028",
    None,
    True,
    False,
    [],
    [1, [2, [3, None]], {"a": []}],
    {},
    {"nested": {"list": [1, "two", 3.0], "none": None}, "ünï": "code"},
    dt.datetime(2026, 1, 2, 3, 4, 5, 6, tzinfo=dt.UTC),
    dt.date(2026, 1, 2),
    decimal.Decimal("12.50"),
    uuid.UUID(int=7),
    {"$durable": "a user's key that looks like a tag"},
]


def shapes_app() -> tuple[durable.Registry, Any, list[int], dict[str, list[Any]]]:
    reg = durable.Registry()
    ran: list[int] = []  # step calls made for real
    seen: dict[str, list[Any]] = {}  # what the workflow code saw, by its run's label

    @durable.step(registry=reg, name="value")
    def value(i: int) -> Any:
        ran.append(i)
        return VALUES[i]

    @durable.step(registry=reg, name="order")
    def order(cents: int) -> Order:
        ran.append(-1)
        return Order("o1", cents)

    @durable.step(registry=reg, name="pair")
    def pair() -> tuple[int, str]:
        ran.append(-2)
        return (1, "b")

    @durable.step(registry=reg, name="fails")
    def fails(kind: str) -> None:
        ran.append(-3)
        if kind == "builtin":
            raise ValueError("missing")
        raise errors.ConfigurationError("custom")

    @durable.workflow(registry=reg, name="shapes")
    def shapes(when: dt.datetime, o: Order, *, label: str = "x") -> str:
        seen[label] = saw = [("inputs", when, o, label)]
        for i in range(len(VALUES)):
            got = value(i)
            saw.append((type(got), got))
        got_order = order(o.cents)
        saw.append((type(got_order), got_order))
        got_pair = pair()
        saw.append((type(got_pair), got_pair))
        try:
            fails("builtin")  # a built-in type is raised again as itself
        except ValueError as exc:
            saw.append((type(exc), str(exc)))
        try:
            fails("custom")  # any other as a StepError naming it (the first time: itself)
        except (errors.ConfigurationError, errors.StepError) as exc:
            saw.append(("custom", "ConfigurationError" in str(exc) or str(exc) == "custom"))
        return "done"

    return reg, shapes, ran, seen


def test_a_recovered_run_sees_every_journaled_value_as_the_first_run_did(
    database_url: str,
) -> None:
    reg, shapes, ran, seen = shapes_app()
    when = dt.datetime(2026, 5, 6, 7, 8, 9, tzinfo=dt.UTC)
    with durable.Engine(database_url, registry=reg) as engine:
        # By position (rebuilt without binding) and by name (bound first).
        engine.start(shapes, when, Order("o9", 99), workflow_id="by-position").result(timeout=30)
        engine.start(shapes, when=when, o=Order("o8", 88), label="y", workflow_id="by-name").result(
            timeout=30
        )
        first = {label: list(saw) for label, saw in seen.items()}
        made = len(ran)
        seen.clear()
        expire(database_url, "by-position")
        expire(database_url, "by-name")
        handles = engine.recover()
        assert sorted(h.workflow_id for h in handles) == ["by-name", "by-position"]
        for handle in handles:
            assert handle.result(timeout=30) == "done"
    assert len(ran) == made  # every call replayed, none made again
    # The same inputs and values, of the same types, in the same order.
    assert sorted(first) == sorted(seen) == ["x", "y"]
    for label, saw in seen.items():
        assert [(type(v), repr(v)) for v in saw] == [(type(v), repr(v)) for v in first[label]]
        assert saw == first[label]
        assert type(saw[0][2]) is Order


def test_a_journaled_value_no_call_reaches_is_never_decoded(database_url: str) -> None:
    reg = durable.Registry()
    reach = {"calls": 6}

    @durable.step(registry=reg, name="marked")
    def marked(i: int) -> str:
        return f"output-{i}"

    @durable.workflow(registry=reg, name="stops_early")
    def stops_early() -> list[str]:
        # The recovered run makes fewer calls than the first (its code changed): the
        # records after them are never reached.
        return [marked(i) for i in range(reach["calls"])]

    serializer = CountingSerializer()
    with durable.Engine(database_url, registry=reg, serializer=serializer) as engine:
        assert engine.start(stops_early, workflow_id="w").result(timeout=30) == [
            f"output-{i}" for i in range(6)
        ]
        reach["calls"] = 2
        serializer.decoded.clear()
        expire(database_url, "w")
        (handle,) = engine.recover()
        assert handle.result(timeout=30) == ["output-0", "output-1"]
    outputs = [text for text in serializer.decoded if text.startswith('"output-')]
    assert outputs == ['"output-0"', '"output-1"']
    with psycopg.connect(database_url) as conn:
        (stored,) = conn.execute(
            "SELECT count(*) FROM durable.steps WHERE workflow_id = 'w'"
        ).fetchone() or (0,)
    assert stored == 6  # the unreached records are still there, untouched
