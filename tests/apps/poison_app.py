"""An app for the poison-pill and replay acceptance tests, run by `durable worker --app`.

`echo` carries any JSON value through a step. `typed` takes a dataclass argument and calls
steps whose annotations rebuild what JSON does not keep (a dataclass, a tuple, int keys, a
set, a pydantic model, an enum) and one that returns a dict that looks like a serializer
tag. The workflow code records what it saw, with its process id, in the `poison_seen`
table (outside durable, autocommit), so a test compares what the first run and a replay in
another process saw.
"""

from __future__ import annotations

import dataclasses
import enum
import os
from typing import Any

import psycopg
import pydantic

import durable

registry = durable.Registry()

SEEN_DDL = """
CREATE TABLE IF NOT EXISTS poison_seen (id bigserial PRIMARY KEY, workflow_id text,
    pid int, what text, type text, value text)
"""

TAG = "__durable__"
LOOKALIKE: dict[str, Any] = {
    "a": {TAG: "datetime", "v": "garbage"},
    "b": [{TAG: "decimal", "v": "x"}],
    TAG + "~x": 1,
    TAG: "uuid",
    "v": "not-a-uuid",
}


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


def setup(url: str) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(SEEN_DDL)


def see(workflow_id: str, what: str, value: Any) -> Any:
    """Record what the workflow code saw (every run records again: it is not a step)."""
    with psycopg.connect(os.environ["DURABLE_DATABASE_URL"], autocommit=True) as conn:
        conn.execute(
            "INSERT INTO poison_seen (workflow_id, pid, what, type, value)"
            " VALUES (%s, %s, %s, %s, %s)",
            [workflow_id, os.getpid(), what, type(value).__qualname__, repr(value)],
        )
    return value


@durable.step(registry=registry, name="poison.echo_step")
def echo_step(value: Any) -> Any:
    return value


@durable.workflow(registry=registry, name="poison.echo")
def echo(value: Any) -> Any:
    return echo_step(value)


@durable.step(registry=registry, name="poison.make_order")
def make_order(order_id: str, cents: int) -> Order:
    return Order(order_id, cents)


@durable.step(registry=registry, name="poison.pair")
def pair(n: int) -> tuple[int, str]:
    return (n, str(n))


@durable.step(registry=registry, name="poison.by_id")
def by_id(n: int) -> dict[int, str]:
    return {n: "first", n + 1: "second"}


@durable.step(registry=registry, name="poison.ids")
def ids(n: int) -> set[int]:
    return {n + 2, n, n + 1}


@durable.step(registry=registry, name="poison.receipt")
def receipt(order: Order) -> Receipt:
    return Receipt(order_id=order.order_id, cents=order.cents)


@durable.step(registry=registry, name="poison.color")
def color(name: str) -> Color:
    return Color(name)


@durable.step(registry=registry, name="poison.lookalike")
def lookalike() -> dict[str, Any]:
    return dict(LOOKALIKE)


@durable.step(registry=registry, name="poison.done")
def done() -> str:
    return "done"


# Steps `typed` journals, in order; a crash test kills the worker after the last record.
TYPED_STEPS = 8


@durable.workflow(registry=registry, name="poison.typed")
def typed(workflow_id: str, /, order: Order) -> str:
    see(workflow_id, "input", order)
    assert isinstance(order, Order), type(order)
    made = see(workflow_id, "make_order", make_order(order.order_id, order.cents * 2))
    assert isinstance(made, Order), type(made)
    p = see(workflow_id, "pair", pair(order.cents))
    assert isinstance(p, tuple), type(p)
    d = see(workflow_id, "by_id", by_id(order.cents))
    assert all(isinstance(k, int) for k in d), d
    s = see(workflow_id, "ids", ids(order.cents))
    assert isinstance(s, set), type(s)
    r = see(workflow_id, "receipt", receipt(made))
    assert isinstance(r, Receipt), type(r)
    c = see(workflow_id, "color", color("blue"))
    assert c is Color.BLUE, repr(c)
    fake = see(workflow_id, "lookalike", lookalike())
    assert fake == LOOKALIKE, fake
    done()
    return f"{made.cents}|{p[0] + 1}{p[1]}|{sorted(d)}|{sorted(s)}|{r.cents}|{c.value}|{fake[TAG]}"


TYPED_RESULT = "500|251250|[250, 251]|[250, 251, 252]|500|blue|uuid"
