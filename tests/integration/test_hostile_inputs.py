"""Hostile input at every door, in one process against a real PostgreSQL.

- A user's dict that looks like a serializer tag travels unchanged through a workflow's
  input and output, a step, a transaction, an effect, a child, a message, an event, the
  working state and a conversation turn, and a replay of the journal sees it unchanged.
  (Also: a message sent while its receiver suspends must wake it; it does not yet.)
- Stored inputs that cannot be decoded end their workflow ERROR, naming the inputs, while
  the other workflows claimed with it run.
- A value JSON does not keep (a tuple, a dataclass, int keys, a set) fails the call at once
  unless an annotation rebuilds it; with one, the first run and a replay see the same
  value and type.
- Arguments are bound to the workflow's signature before anything is stored.
- Ids, keys, topics and names (and free text: a reason, a comment) are checked at the
  call: a typed error, never a psycopg or Unicode one, and nothing stored.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import enum
import functools
import math
import threading
import time
from collections.abc import Callable
from typing import Any

import psycopg
import pydantic
import pytest
from sqlalchemy import Connection, text

import durable
from durable import errors

TAG = "__durable__"
REG = durable.Registry()
QUEUE = durable.Queue("hostile.q", registry=REG)
RANKED = durable.Queue("hostile.ranked", priority=True, registry=REG)

# What the workflow code of `typed` saw, in order, and how often step bodies really ran.
SEEN: list[tuple[str, str, str]] = []
BODIES: list[str] = []


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


def table_counts(url: str) -> dict[str, int]:
    """Rows in every table a call could write to."""
    tables = ("workflows", "steps", "messages", "events", "approvals", "effects", "executors")
    with psycopg.connect(url) as conn:
        counts = {}
        for table in tables:
            row = conn.execute(f"SELECT count(*) FROM durable.{table}").fetchone()
            assert row is not None
            counts[table] = int(row[0])
    return counts


def wait_for(predicate: Callable[[], object], what: str, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.02)
    raise AssertionError(f"timed out waiting for {what}")


# -- the app ---------------------------------------------------------------------------------------


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


LOOKALIKE = {TAG: "datetime", "v": "garbage"}
NESTED_LOOKALIKE = {
    "a": {TAG: "datetime", "v": "garbage"},
    "b": [{TAG: "decimal", "v": "x"}, {TAG: "uuid", "v": 1}],
    TAG + "~x": {TAG: "bytes", "v": "aGk="},
    TAG: "date",
    "v": "2024-01-01",
}


@durable.step(registry=REG, name="hostile.echo")
def echo(value: Any) -> Any:
    return value


@durable.transaction(registry=REG, name="hostile.tx_echo")
def tx_echo(conn: Connection, value: Any) -> Any:
    conn.execute(text("SELECT 1"))
    return value


@durable.effect(registry=REG, name="hostile.effect_echo", idempotent=True)
def effect_echo(value: Any, *, idempotency_key: str) -> Any:
    return value


@durable.workflow(registry=REG, name="hostile.child_echo")
def child_echo(value: Any) -> Any:
    return value


CARRIED = ("input", "step", "transaction", "effect", "child", "message", "state", "turn")


@durable.workflow(registry=REG, name="hostile.carry")
def carry(value: Any) -> dict[str, Any]:
    """Carries `value` through every kind of stored value a workflow has."""
    stepped = echo(value)
    transacted = tx_echo(value)
    effected = effect_echo(value)
    child = child_echo(value)
    durable.set_event("poison", value)
    durable.state.set(value)
    durable.append_turn("user", value)
    message = durable.recv("poison", timeout=30)
    return {
        "input": value,
        "step": stepped,
        "transaction": transacted,
        "effect": effected,
        "child": child,
        "message": message,
        "state": durable.state.get(),
        "turn": durable.conversation()[0]["content"],
    }


@durable.workflow(registry=REG, name="hostile.one")
def one(a: int) -> int:
    return a


@durable.workflow(registry=REG, name="hostile.typed_input")
def typed_input(order: Order) -> int:
    assert isinstance(order, Order), type(order)
    return order.cents


@durable.workflow(registry=REG, name="hostile.untyped_input")
def untyped_input(order) -> int:  # type: ignore[no-untyped-def]
    return int(order["cents"])


# Steps that return what JSON does not keep, with no annotation to rebuild it.
@durable.step(registry=REG, name="hostile.bare_tuple")
def bare_tuple():  # type: ignore[no-untyped-def]
    return (1, "a")


@durable.step(registry=REG, name="hostile.bare_dataclass")
def bare_dataclass():  # type: ignore[no-untyped-def]
    return Order("o-1", 250)


@durable.step(registry=REG, name="hostile.bare_int_keys")
def bare_int_keys():  # type: ignore[no-untyped-def]
    return {1: "a", 2: "b"}


@durable.step(registry=REG, name="hostile.bare_set")
def bare_set():  # type: ignore[no-untyped-def]
    return {1, 2, 3}


@durable.step(registry=REG, name="hostile.bare_model")
def bare_model():  # type: ignore[no-untyped-def]
    return Receipt(order_id="o-1", cents=250)


@durable.step(registry=REG, name="hostile.fine")
def fine() -> str:
    return "fine"


BARE: dict[str, Callable[[], Any]] = {
    "tuple": bare_tuple,
    "dataclass": bare_dataclass,
    "int-keys": bare_int_keys,
    "set": bare_set,
    "model": bare_model,
}
BARE_TYPES = {
    "tuple": "tuple",
    "dataclass": "Order",
    "int-keys": "dict",
    "set": "set",
    "model": "Receipt",
}


@durable.workflow(registry=REG, name="hostile.bare")
def bare(kind: str) -> str:
    fine()
    BARE[kind]()
    return "unreachable"


@durable.workflow(registry=REG, name="hostile.bare_output")
def bare_output():  # type: ignore[no-untyped-def]
    fine()
    return (1, "a")


# Steps whose annotation rebuilds what they return.
@durable.step(registry=REG, name="hostile.make_order")
def make_order(order_id: str, cents: int) -> Order:
    BODIES.append("make_order")
    return Order(order_id, cents)


@durable.step(registry=REG, name="hostile.pair")
def pair(n: int) -> tuple[int, str]:
    BODIES.append("pair")
    return (n, str(n))


@durable.step(registry=REG, name="hostile.by_id")
def by_id(n: int) -> dict[int, str]:
    BODIES.append("by_id")
    return {n: "first", n + 1: "second"}


@durable.step(registry=REG, name="hostile.ids")
def ids(n: int) -> set[int]:
    BODIES.append("ids")
    return {n, n + 1, n + 2}


@durable.step(registry=REG, name="hostile.receipt")
def receipt(order: Order) -> Receipt:
    BODIES.append("receipt")
    return Receipt(order_id=order.order_id, cents=order.cents)


@durable.step(registry=REG, name="hostile.color")
def color(name: str) -> Color:
    BODIES.append("color")
    return Color(name)


@durable.step(registry=REG, name="hostile.lookalike")
def lookalike() -> dict[str, Any]:
    BODIES.append("lookalike")
    return dict(NESTED_LOOKALIKE)


@durable.workflow(registry=REG, name="hostile.child_order")
def child_order(order_id: str, cents: int) -> Order:
    return Order(order_id, cents)


def see(what: str, value: Any) -> Any:
    SEEN.append((what, type(value).__qualname__, repr(value)))
    return value


@durable.workflow(registry=REG, name="hostile.typed")
def typed(order: Order) -> str:
    see("input", order)
    assert isinstance(order, Order)
    made = see("make_order", make_order(order.order_id, order.cents * 2))
    assert isinstance(made, Order)
    p = see("pair", pair(order.cents))
    assert isinstance(p, tuple)
    d = see("by_id", by_id(order.cents))
    assert all(isinstance(k, int) for k in d)
    s = see("ids", ids(order.cents))
    assert isinstance(s, set)
    r = see("receipt", receipt(made))
    assert isinstance(r, Receipt)
    c = see("color", color("blue"))
    assert c is Color.BLUE
    fake = see("lookalike", lookalike())
    assert fake == NESTED_LOOKALIKE
    child = see("child", child_order(order.order_id, 7))
    assert isinstance(child, Order)
    return (
        f"{made.cents}|{p[0] + 1}{p[1]}|{sorted(d)}|{sorted(s)}|{r.cents}|{c.value}|"
        f"{fake[TAG]}|{child.cents}"
    )


TYPED_RESULT = "500|251250|[250, 251]|[250, 251, 252]|500|blue|date|7"


@durable.workflow(registry=REG, name="hostile.waits")
def waits(kind: str, name: Any) -> str:
    fine()
    if kind == "recv":
        durable.recv(name, timeout=0)
    elif kind == "set_event":
        durable.set_event(name, 1)
    else:
        durable.approval(name, timeout=0)
    return "unreachable"


DURATIONS = {"nan": math.nan, "inf": math.inf, "1e300": 1e300}


@durable.workflow(registry=REG, name="hostile.wait_duration")
def wait_duration(kind: str, which: str) -> str:
    seconds = DURATIONS[which]  # computed by the workflow: not a stored input
    if kind == "sleep":
        durable.sleep(seconds)
    elif kind == "recv":
        durable.recv("t", timeout=seconds)
    else:
        durable.approval("gate", timeout=seconds)
    return "unreachable"


def engine(url: str, **options: Any) -> durable.Engine:
    return durable.Engine(url, registry=REG, max_workers=2, **options)


# -- 1. tag lookalikes through a real workflow -----------------------------------------------------


@pytest.mark.parametrize("value", [LOOKALIKE, NESTED_LOOKALIKE], ids=["exact", "nested"])
def test_a_tag_lookalike_travels_unchanged_through_every_stored_value(
    database_url: str, value: dict[str, Any]
) -> None:
    with engine(database_url, worker=True, poll_interval=0.05) as eng:
        handle = eng.start(carry, value, workflow_id="carry")
        # Sent once the run waits: a message racing the suspend can be lost (see
        # test_a_message_sent_while_the_receiver_suspends_wakes_it).
        wait_for(lambda: handle.status() is durable.WorkflowStatus.SUSPENDED, "the recv")
        eng.send("carry", value, topic="poison")
        result = handle.result(timeout=10)
        expected = dict.fromkeys(CARRIED, value)
        assert same(result, expected)
        assert same(eng.get_event("carry", "poison"), value)
        assert same(eng.get_state("carry"), value)
        assert same(eng.client.conversation("carry"), [{"role": "user", "content": value}])
        [effect] = eng.client.effects("carry")
        assert same(eng.client.serializer.loads(effect["result"]), value)
        assert same(eng.retrieve("carry:child:3").result(timeout=10), value)
        info = eng.get_workflow("carry")
        assert same(eng.client.inputs.decode(info.inputs), ([value], {}))
        # A replay of the whole journal (a fork from its end) reads every value back.
        journal = eng.steps("carry")
        fork = eng.fork("carry", from_step=len(journal), new_id="carry-replay")
        assert same(fork.result(timeout=10), expected)
        assert eng.get_workflow("carry-replay").status is durable.WorkflowStatus.SUCCESS


@durable.workflow(registry=REG, name="hostile.listen")
def listen() -> Any:
    fine()
    return durable.recv("t", timeout=20)


# Widens the window between the suspend's check for messages and its commit: the suspend
# statement sleeps (uncommitted) after it found no message.
SLOW_SUSPEND = """
CREATE FUNCTION public.slow_suspend() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN PERFORM pg_sleep(1.0); RETURN NEW; END $$;
CREATE TRIGGER slow_suspend BEFORE UPDATE ON durable.workflows FOR EACH ROW
WHEN (OLD.status = 'RUNNING' AND NEW.status = 'SUSPENDED')
EXECUTE FUNCTION public.slow_suspend();
"""


def suspending(url: str) -> bool:
    with psycopg.connect(url) as conn:
        row = conn.execute(
            "SELECT count(*) FROM pg_stat_activity"
            " WHERE datname = current_database() AND wait_event = 'PgSleep'"
        ).fetchone()
    return row is not None and int(row[0]) > 0


def test_a_message_sent_while_the_receiver_suspends_wakes_it(database_url: str) -> None:
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute(SLOW_SUSPEND)
    with engine(database_url, worker=True, poll_interval=0.05) as eng:
        handle = eng.start(listen, workflow_id="listen")
        wait_for(lambda: suspending(database_url), "the suspend to be under way")
        eng.send("listen", "hello", topic="t")
        assert handle.result(timeout=5) == "hello"


# -- 1. stored inputs that cannot be decoded -------------------------------------------------------

CORRUPT_INPUTS = {
    "tag-datetime": (
        "hostile.one",
        '{"args":[{"__durable__":"datetime","v":"garbage"}],"kwargs":{}}',
    ),
    "tag-decimal": ("hostile.one", '{"args":[{"__durable__":"decimal","v":"x"}],"kwargs":{}}'),
    "not-json": ("hostile.one", "this is not JSON {"),
    "json-list": ("hostile.one", "[1, 2]"),
    "json-null": ("hostile.one", "null"),
    "no-args": ("hostile.one", '{"kwargs": {}}'),
    "kwargs-not-a-dict": ("hostile.one", '{"args": [1], "kwargs": [1]}'),
    "does-not-fit-the-annotation": ("hostile.typed_input", '{"args": ["nope"], "kwargs": {}}'),
}


def insert_raw(url: str, workflow_id: str, name: str, inputs: str) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO durable.workflows (workflow_id, name, status, inputs)"
            " VALUES (%s, %s, 'PENDING', %s)",
            [workflow_id, name, inputs],
        )


@pytest.mark.parametrize("case", sorted(CORRUPT_INPUTS))
def test_undecodable_inputs_end_error_and_the_workflows_around_them_run(
    database_url: str, case: str
) -> None:
    name, inputs = CORRUPT_INPUTS[case]
    with engine(database_url) as eng:
        before = eng.submit(one, 1, workflow_id="before")
        insert_raw(database_url, "poison", name, inputs)
        after = eng.submit(one, 2, workflow_id="after")
        started = eng.recover()
        assert sorted(h.workflow_id for h in started) == ["after", "before"]
        assert before.result(timeout=10) == 1
        assert after.result(timeout=10) == 2
        poisoned = eng.retrieve("poison")
        with pytest.raises(errors.WorkflowFailedError) as info:
            poisoned.result(timeout=10)
        assert info.value.error_type == "durable.errors.SerializationError"
        assert poisoned.status() is durable.WorkflowStatus.ERROR
        assert eng.steps("poison") == []
        assert eng.recover() == []  # it is not claimed again


@pytest.mark.parametrize(
    "case",
    [
        pytest.param(
            case,
            marks=[],
        )
        for case in sorted(CORRUPT_INPUTS)
    ],
)
def test_the_error_of_undecodable_inputs_names_the_inputs(database_url: str, case: str) -> None:
    name, inputs = CORRUPT_INPUTS[case]
    insert_raw(database_url, "poison", name, inputs)
    with engine(database_url) as eng:
        eng.recover()
        with pytest.raises(errors.WorkflowFailedError) as info:
            eng.retrieve("poison").result(timeout=10)
    assert "inputs" in info.value.error_message, info.value.error_message
    assert "poison" in info.value.error_message


# -- 2. values that would not read back the same ---------------------------------------------------


@pytest.mark.parametrize("kind", sorted(BARE))
def test_a_step_returning_what_json_does_not_keep_fails_at_once(
    database_url: str, kind: str
) -> None:
    step_name = BARE[kind].__name__
    with engine(database_url) as eng:
        handle = eng.start(bare, kind, workflow_id="bare")
        with pytest.raises(errors.WorkflowFailedError) as info:
            handle.result(timeout=10)
        assert handle.status() is durable.WorkflowStatus.ERROR
        journal = [s.step_name for s in eng.steps("bare")]
    error = info.value
    assert error.error_type == "durable.errors.SerializationError"
    assert f"the output of step 'hostile.{step_name}'" in error.error_message
    assert f"a {BARE_TYPES[kind]} is stored as JSON" in error.error_message
    assert "annotate the function's type" in error.error_message  # what to do about it
    assert journal == ["hostile.fine"]  # nothing journaled for the step that failed


def test_a_workflow_returning_a_tuple_without_an_annotation_fails_at_once(
    database_url: str,
) -> None:
    with engine(database_url) as eng:
        handle = eng.start(bare_output, workflow_id="bare-output")
        with pytest.raises(errors.WorkflowFailedError) as info:
            handle.result(timeout=10)
        assert handle.status() is durable.WorkflowStatus.ERROR
        assert eng.get_workflow("bare-output").output is None
    assert info.value.error_type == "durable.errors.SerializationError"
    assert "the output of workflow 'hostile.bare_output'" in info.value.error_message


def test_annotated_values_are_the_same_on_the_first_run_and_on_replay(database_url: str) -> None:
    SEEN.clear()
    BODIES.clear()
    with engine(database_url) as eng:
        handle = eng.start(typed, Order("o-1", 250), workflow_id="typed")
        assert handle.result(timeout=10) == TYPED_RESULT
        first = list(SEEN)
        ran = list(BODIES)
        SEEN.clear()
        journal = eng.steps("typed")
        replay = eng.fork("typed", from_step=len(journal), new_id="typed-replay")
        assert replay.result(timeout=10) == TYPED_RESULT
    assert SEEN == first
    assert BODIES == ran  # the replay ran no step body: every value came from the journal
    types = {what: kind for what, kind, _ in first}
    assert types == {
        "input": "Order",
        "make_order": "Order",
        "pair": "tuple",
        "by_id": "dict",
        "ids": "set",
        "receipt": "Receipt",
        "color": "Color",
        "lookalike": "dict",
        "child": "Order",
    }


def test_a_dataclass_argument_needs_an_annotation(database_url: str) -> None:
    with engine(database_url) as eng:
        assert eng.start(typed_input, Order("o-1", 250), workflow_id="typed").result(10) == 250
        eng.submit(typed_input, Order("o-2", 5), workflow_id="submitted")
        assert [h.workflow_id for h in eng.recover()] == ["submitted"]
        assert eng.retrieve("submitted").result(timeout=10) == 5
        before = table_counts(database_url)
        for call in (eng.start, eng.submit):
            with pytest.raises(errors.SerializationError, match="argument 'order'") as info:
                call(untyped_input, Order("o-3", 1), workflow_id="untyped")
            assert "annotate" in str(info.value)
        with pytest.raises(errors.SerializationError, match="argument 'order'"):
            eng.enqueue(QUEUE, untyped_input, Order("o-3", 1), workflow_id="untyped")
        assert table_counts(database_url) == before
        with pytest.raises(errors.WorkflowNotFoundError):
            eng.get_workflow("untyped")


# -- 3. arguments bound before anything is stored --------------------------------------------------

BAD_ARGUMENTS: list[tuple[tuple[Any, ...], dict[str, Any]]] = [
    ((1, 2, 3), {}),
    ((), {}),
    ((1,), {"b": 2}),
    ((1,), {"a": 1}),
]


@pytest.mark.parametrize("how", ["start", "submit", "enqueue"])
def test_arguments_that_do_not_fit_the_signature_store_nothing(database_url: str, how: str) -> None:
    with engine(database_url) as eng, durable.Client(database_url) as client:
        for actor in (eng, client):
            if how == "start" and actor is client:
                continue  # a Client runs nothing
            for args, kwargs in BAD_ARGUMENTS:
                with pytest.raises(errors.WorkflowArgumentsError) as info:
                    if how == "enqueue":
                        actor.enqueue(QUEUE, one, *args, workflow_id="wrong", **kwargs)
                    else:
                        getattr(actor, how)(one, *args, workflow_id="wrong", **kwargs)
                assert isinstance(info.value, TypeError)
                assert "its signature is hostile.one(a:" in str(info.value)
                assert "Nothing was stored" in str(info.value)
                assert actor.list_workflows() == []
        assert table_counts(database_url)["workflows"] == 0


# -- 4. ids, keys, topics and names ----------------------------------------------------------------

BAD_NAMES: dict[str, Any] = {
    "empty": "",
    "nul": "a\x00b",
    "lone-surrogate": "\ud800",
    "surrogate-inside": "ab\udfffcd",
    "513-bytes": "x" * 513,
    "514-bytes-in-257-chars": "é" * 257,
    "not-a-string": 5,
}


def check_refused(
    call: Callable[[], Any], bad: object, expected: type[errors.DurableError] | None = None
) -> errors.DurableError:
    """`call` raises InvalidNameError (or `expected`), not a psycopg or Unicode error, with a
    message that is itself valid text."""
    kind = expected or errors.InvalidNameError
    try:
        call()
    except kind as exc:
        assert isinstance(exc, errors.ConfigurationError)
        for linked in (exc.__cause__, None if exc.__suppress_context__ else exc.__context__):
            assert not isinstance(linked, psycopg.Error | UnicodeError), repr(linked)
        str(exc).encode("utf-8")  # loggable
        return exc
    except BaseException as exc:
        raise AssertionError(f"{bad!r:.40}: {type(exc).__module__}.{exc!r:.300}") from exc
    raise AssertionError(f"{bad!r:.40} was accepted")


NAMED_CALLS: dict[str, Callable[[Any, Any], Any]] = {
    "start.workflow_id": lambda c, bad: c.start(one, 1, workflow_id=bad),
    "submit.workflow_id": lambda c, bad: c.submit(one, 1, workflow_id=bad),
    "enqueue.workflow_id": lambda c, bad: c.enqueue(QUEUE, one, 1, workflow_id=bad),
    "enqueue.dedup_key": lambda c, bad: c.enqueue(QUEUE, one, 1, dedup_key=bad),
    "send.workflow_id": lambda c, bad: c.send(bad, "m"),
    "send.topic": lambda c, bad: c.send("ok", "m", topic=bad),
    "send.idempotency_key": lambda c, bad: c.send("ok", "m", idempotency_key=bad),
    "get_event.workflow_id": lambda c, bad: c.get_event(bad, "k"),
    "get_event.key": lambda c, bad: c.get_event("ok", bad),
    "cancel.workflow_id": lambda c, bad: c.cancel(bad),
    "resume.workflow_id": lambda c, bad: c.resume(bad),
    "fork.workflow_id": lambda c, bad: c.fork(bad, from_step=0),
    "fork.new_id": lambda c, bad: c.fork("ok", from_step=0, new_id=bad),
    "decide.workflow_id": lambda c, bad: c.decide(bad, "gate", True),
    "decide.name": lambda c, bad: c.decide("ok", bad, True),
    "retrieve.workflow_id": lambda c, bad: c.retrieve(bad),
    "steps.workflow_id": lambda c, bad: c.steps(bad),
    "effects.workflow_id": lambda c, bad: c.effects(bad),
    "budget.workflow_id": lambda c, bad: c.budget(bad),
    "raise_budget.workflow_id": lambda c, bad: c.raise_budget(bad, dollars=1),
    "tool_calls.workflow_id": lambda c, bad: c.tool_calls(bad),
    "get_state.workflow_id": lambda c, bad: c.get_state(bad),
    "state_text.workflow_id": lambda c, bad: c.state_text(bad),
    "conversation.workflow_id": lambda c, bad: c.conversation(bad),
    "list_workflows.name": lambda c, bad: c.list_workflows(name=bad),
    "pause_schedule.name": lambda c, bad: c.pause_schedule(bad),
}


@pytest.mark.parametrize("where", sorted(NAMED_CALLS))
def test_a_bad_id_key_topic_or_name_is_refused_with_a_typed_error(
    database_url: str, where: str
) -> None:
    call = NAMED_CALLS[where]
    with engine(database_url) as eng, durable.Client(database_url) as client:
        assert eng.start(one, 1, workflow_id="ok").result(timeout=10) == 1
        before = table_counts(database_url)
        # The engine offers the most used calls; the rest are its client's.
        for actor in (eng if hasattr(eng, where.split(".")[0]) else eng.client, client):
            if where.startswith("start.") and actor is client:
                continue
            for bad in BAD_NAMES.values():
                error = check_refused(functools.partial(call, actor, bad), bad)
                assert where.split(".")[1] in str(error)
        assert table_counts(database_url) == before


def test_an_empty_workflow_id_is_refused_not_taken_as_none(database_url: str) -> None:
    with engine(database_url) as eng:
        for start in (eng.start, eng.submit):
            with pytest.raises(errors.InvalidNameError, match="workflow_id='' is empty"):
                start(one, 1, workflow_id="")
        with pytest.raises(errors.InvalidNameError, match="workflow_id='' is empty"):
            eng.enqueue(QUEUE, one, 1, workflow_id="")
        assert eng.list_workflows() == []


BAD_TEXT = {"nul": "a\x00b", "lone-surrogate": "\ud800", "not-a-string": 5}


def test_free_text_with_a_nul_or_a_lone_surrogate_is_refused(database_url: str) -> None:
    calls: dict[str, Callable[[Any, Any], Any]] = {
        "reason": lambda c, bad: c.cancel("ok", reason=bad),
        "comment": lambda c, bad: c.decide("ok", "gate", True, comment=bad),
        "decided_by": lambda c, bad: c.decide("ok", "gate", True, decided_by=bad),
    }
    with engine(database_url) as eng, durable.Client(database_url) as client:
        assert eng.start(one, 1, workflow_id="ok").result(timeout=10) == 1
        before = table_counts(database_url)
        for what, call in calls.items():
            for actor in (eng, client):
                for bad in BAD_TEXT.values():
                    error = check_refused(functools.partial(call, actor, bad), bad)
                    assert what in str(error)
        assert table_counts(database_url) == before


def test_a_bad_name_is_refused_where_it_is_defined() -> None:
    registry = durable.Registry()
    definitions: list[Callable[[Any], Any]] = [
        lambda bad: durable.workflow(name=bad, registry=registry)(one),
        lambda bad: durable.step(name=bad, registry=registry)(fine),
        lambda bad: durable.Queue(bad, registry=registry),
    ]
    for define in definitions:
        for bad in BAD_NAMES.values():
            # An empty name is a DefinitionError; both are ConfigurationErrors.
            check_refused(functools.partial(define, bad), bad, errors.ConfigurationError)
    assert registry.workflows() == []


@pytest.mark.parametrize("kind", ["recv", "set_event", "approval"])
def test_a_bad_topic_key_or_gate_name_inside_a_workflow_fails_it_with_a_typed_error(
    database_url: str, kind: str
) -> None:
    with engine(database_url) as eng:
        for i, bad in enumerate(BAD_NAMES.values()):
            handle = eng.start(waits, kind, bad, workflow_id=f"w{i}")
            with pytest.raises(errors.WorkflowFailedError) as info:
                handle.result(timeout=10)
            assert info.value.error_type == "durable.errors.InvalidNameError", info.value
            assert [s.step_name for s in eng.steps(f"w{i}")] == ["hostile.fine"]
        assert table_counts(database_url)["messages"] == 0
        assert table_counts(database_url)["events"] == 0
        assert table_counts(database_url)["approvals"] == 0


@pytest.mark.parametrize("limit", [-1, 0, 100_001, True, 2.5, "10", None])
def test_list_workflows_refuses_a_limit_out_of_range(database_url: str, limit: Any) -> None:
    with engine(database_url) as eng, durable.Client(database_url) as client:
        for actor in (eng, client):
            with pytest.raises(errors.ConfigurationError, match="limit="):
                actor.list_workflows(limit=limit)


BAD_SCHEMAS = {
    "59-bytes": "x" * 59,
    "60-bytes-in-30-chars": "é" * 30,
    "empty": "",
    "nul": "dur\x00able",
    "lone-surrogate": "dur\ud800able",
}


@pytest.mark.parametrize("schema", sorted(BAD_SCHEMAS))
def test_a_bad_schema_is_refused_before_connecting(database_url: str, schema: str) -> None:
    bad = BAD_SCHEMAS[schema]
    threads_before = {t.ident for t in threading.enumerate()}
    nowhere = "postgresql://postgres@127.0.0.1:1/nothing_listens_here"
    for url in (database_url, nowhere):
        for make in (durable.Engine, durable.Client):
            with pytest.raises(errors.ConfigurationError, match="schema") as info:
                make(url, schema=bad)
            assert not isinstance(info.value, errors.DatabaseUnavailableError)
            str(info.value).encode("utf-8")
    new_threads = [t.name for t in threading.enumerate() if t.ident not in threads_before]
    assert not [name for name in new_threads if "durable" in name], new_threads
    assert table_counts(database_url)["executors"] == 0
    with psycopg.connect(database_url) as conn:
        schemas = [r[0] for r in conn.execute("SELECT nspname FROM pg_namespace")]
    assert "x" * 59 not in schemas and not [s for s in schemas if s.startswith("xxxx")]


# -- durations ------------------------------------------------------------------------------------


def test_an_impossible_enqueue_delay_is_refused_at_the_call(database_url: str) -> None:
    with engine(database_url) as eng:
        for delay in DURATIONS.values():
            with pytest.raises(errors.InvalidWaitError, match="delay="):
                eng.enqueue(QUEUE, one, 1, delay=delay)
        assert eng.list_workflows() == []


@pytest.mark.parametrize("kind", ["sleep", "recv", "approval"])
def test_an_impossible_duration_inside_a_workflow_is_an_invalid_wait_error(
    database_url: str, kind: str
) -> None:
    with engine(database_url) as eng:
        for which in DURATIONS:
            handle = eng.start(wait_duration, kind, which, workflow_id=f"{kind}-{which}")
            with pytest.raises(errors.WorkflowFailedError) as info:
                handle.result(timeout=10)
            assert info.value.error_type == "durable.errors.InvalidWaitError", (which, info.value)


# -- ids the library derives ----------------------------------------------------------------------


@durable.workflow(registry=REG, name="hostile.parent_of")
def parent_of(value: str) -> str:
    """Starts a child at position 0 under a derived id."""
    return str(child_echo(value))


@pytest.mark.parametrize("parent_id", ["p" * 510, "é" * 255 + "x" * 2], ids=["ascii", "utf8"])
def test_a_child_of_a_parent_with_a_long_id_can_be_read_and_acted_on_by_id(
    database_url: str, parent_id: str
) -> None:
    """The child's derived id fits the id limit, so every call that takes an id takes it."""
    with engine(database_url) as eng:
        assert eng.start(parent_of, "v", workflow_id=parent_id).result(timeout=30) == "v"
        children = eng.client.list_children([parent_id])[parent_id]
        (child_id,) = [str(c["workflow_id"]) for c in children]
        assert len(child_id.encode("utf-8")) <= 512
        assert eng.get_workflow(child_id).status == durable.WorkflowStatus.SUCCESS
        assert eng.retrieve(child_id).result(timeout=5) == "v"
        eng.cancel(child_id)  # finished: nothing to cancel, but the id is taken
        assert eng.client.export_workflow(child_id)["root"] == child_id


def test_a_schedule_with_a_long_name_starts_runs_that_can_be_read_by_id(
    database_url: str,
) -> None:
    name = "s" * 500
    with engine(database_url) as eng:
        eng.schedule(name, one_tick, "0 * * * *")
        start = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
        handles = eng.client.backfill_schedule(name, start, start + dt.timedelta(hours=2))
        triggered = eng.client.trigger_schedule(name)
        for handle in [*handles, triggered]:
            assert len(handle.workflow_id.encode("utf-8")) <= 512
            assert eng.get_workflow(handle.workflow_id).name == "hostile.one_tick"
        # Each tick still starts once: a second backfill starts nothing new.
        again = eng.client.backfill_schedule(name, start, start + dt.timedelta(hours=2))
        assert [h.workflow_id for h in again] == [h.workflow_id for h in handles]
        assert len({h.workflow_id for h in handles}) == 2


@durable.workflow(registry=REG, name="hostile.one_tick")
def one_tick(tick: dt.datetime) -> str:
    return tick.isoformat()


# -- start options ----------------------------------------------------------------------------


BAD_OPTIONS: list[tuple[dict[str, Any], type[errors.DurableError], str]] = [
    ({"timeout": "5"}, errors.InvalidWaitError, "timeout="),
    ({"timeout": True}, errors.InvalidWaitError, "timeout="),
    ({"timeout": 10**400}, errors.InvalidWaitError, "timeout="),
    ({"timeout": dt.timedelta(0)}, errors.InvalidWaitError, "timeout="),
    ({"workflow_id": 5}, errors.InvalidNameError, "workflow_id="),
]
BAD_QUEUE_OPTIONS: list[tuple[dict[str, Any], type[errors.DurableError], str]] = [
    ({"priority": 2**70}, errors.ConfigurationError, "priority="),
    ({"priority": 2**31}, errors.ConfigurationError, "priority="),
    ({"priority": -(2**31) - 1}, errors.ConfigurationError, "priority="),
    ({"priority": "1"}, errors.ConfigurationError, "priority="),
    ({"priority": 1.0}, errors.ConfigurationError, "priority="),
    ({"delay": "5"}, errors.InvalidWaitError, "delay="),
    ({"delay": True}, errors.InvalidWaitError, "delay="),
    ({"delay": 10**400}, errors.InvalidWaitError, "delay="),
    ({"dedup_key": 3}, errors.InvalidNameError, "dedup_key="),
]


def test_a_start_option_of_the_wrong_type_or_range_is_refused_alike_everywhere(
    database_url: str,
) -> None:
    """start, submit, enqueue (and queue.enqueue) refuse the same values with the same typed
    error, and store nothing: never a string read as a number, never a PostgreSQL error."""
    with engine(database_url) as eng:
        for options, error, match in BAD_OPTIONS:
            for start in (eng.start, eng.submit, eng.client.submit):
                with pytest.raises(error, match=match):
                    start(one, 1, **options)
            with pytest.raises(error, match=match):
                eng.enqueue(RANKED, one, 1, **options)
        for options, error, match in BAD_QUEUE_OPTIONS:
            for enqueue in (eng.enqueue, eng.client.enqueue):
                with pytest.raises(error, match=match):
                    enqueue(RANKED, one, 1, **options)
            with pytest.raises(error, match=match):
                RANKED.enqueue(one, 1, **options)
        with pytest.raises(errors.InvalidWaitError, match="timeout="):
            with durable.workflow_timeout("5"):  # type: ignore[arg-type]
                pass
        assert eng.list_workflows() == []
        # The ends of the ranges are taken.
        low, high = -(2**31), 2**31 - 1
        for priority in (low, high):
            handle = eng.enqueue(RANKED, one, 2, priority=priority, delay=0, timeout=5)
            assert eng.get_workflow(handle.workflow_id).status == durable.WorkflowStatus.ENQUEUED
