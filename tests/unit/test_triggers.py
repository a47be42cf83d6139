"""The trigger consumer's decisions, on an in-memory source: what becomes of each message.

The order is the guarantee: a message is acknowledged only once its workflow's row is
committed (the submit returned); a start that fails for now goes back to the broker; a
message that can never start one is rejected, and the consumer goes on with the next.
(The crash tests in tests/acceptance/test_trigger_crash.py kill a real consumer.)
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import pytest

import durable
from durable._run.decorators import workflow_def
from durable.errors import (
    DatabaseUnavailableError,
    DefinitionError,
    DuplicateNameError,
    WorkflowConflictError,
)
from durable.triggers import (
    Consumers,
    Delivery,
    Message,
    Source,
    Trigger,
    body_hash,
    field,
    header,
    on_message,
    text_body,
)


class Memory(Source):
    """A broker in a list: deliveries record what became of them in `log`."""

    def __init__(self, messages: list[Message], fail_first_open: bool = False) -> None:
        self.messages = list(messages)
        self.log: list[tuple[str, str | None]] = []
        self.opened = 0
        self.fail_first_open = fail_first_open
        self.done = asyncio.Event()

    @property
    def describe(self) -> str:
        return "memory"

    async def open(self) -> None:
        self.opened += 1

    async def deliveries(self) -> AsyncIterator[Delivery]:
        if self.fail_first_open and self.opened == 1:
            raise ConnectionError("the broker went away")
        while self.messages:
            yield MemoryDelivery(self.messages.pop(0), self.log)
        self.done.set()
        await asyncio.Event().wait()  # a quiet broker

    async def close(self) -> None:
        self.log.append(("closed", None))


class MemoryDelivery(Delivery):
    def __init__(self, message: Message, log: list[tuple[str, str | None]]) -> None:
        self.message = message
        self.log = log

    async def ack(self) -> None:
        self.log.append(("ack", self.message.id))

    async def retry(self, delay: float) -> None:
        self.log.append(("retry", self.message.id))

    async def reject(self, reason: str) -> None:
        self.log.append(("reject", self.message.id))


registry = durable.Registry()


@durable.workflow(registry=registry, name="triggers.handle")
def handle(payload: Any) -> Any:
    return payload


def msg(id: str | None, body: object, **headers: str) -> Message:
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    return Message(body=raw, id=id, headers=headers)


def consume(
    source: Memory, submit: Any, trigger: Trigger | None = None
) -> list[tuple[str, str | None]]:
    trigger = trigger or Trigger("orders", source, workflow_def(handle), handle)
    consumers = Consumers([trigger], submit, retry_delay=0)

    async def go() -> None:
        task = asyncio.create_task(consumers.run())
        await asyncio.wait_for(source.done.wait(), 5)
        consumers.close()
        await task

    asyncio.run(go())
    return source.log


def test_a_message_is_acknowledged_only_after_its_row_is_committed() -> None:
    source = Memory([msg("m-1", {"n": 1}), msg("m-2", {"n": 2})])
    events: list[tuple[str, str | None]] = source.log

    def submit(trigger: Trigger, value: Any, workflow_id: str) -> None:
        events.append(("commit", workflow_id))
        assert value in ({"n": 1}, {"n": 2})

    assert consume(source, submit)[:4] == [
        ("commit", "trigger:orders:m-1"),
        ("ack", "m-1"),
        ("commit", "trigger:orders:m-2"),
        ("ack", "m-2"),
    ]


def test_a_bad_message_is_rejected_and_the_next_one_still_runs() -> None:
    committed: list[str] = []
    source = Memory([msg("bad", b"\xff not json"), msg(None, {"n": 1}), msg("good", {"n": 2})])
    log = consume(source, lambda _t, _v, wid: committed.append(wid))
    assert log[:3] == [("reject", "bad"), ("reject", None), ("ack", "good")]
    assert committed == ["trigger:orders:good"]


def test_a_start_that_fails_for_now_goes_back_to_the_broker() -> None:
    def submit(_t: Trigger, _v: Any, _wid: str) -> None:
        raise DatabaseUnavailableError("down")

    assert consume(Memory([msg("m-1", {})]), submit)[0] == ("retry", "m-1")


def test_a_start_that_can_never_succeed_is_rejected() -> None:
    def submit(_t: Trigger, _v: Any, wid: str) -> None:
        raise WorkflowConflictError(wid, "other", "triggers.handle")

    assert consume(Memory([msg("m-1", {})]), submit)[0] == ("reject", "m-1")


def test_a_lost_source_is_opened_again() -> None:
    committed: list[str] = []
    source = Memory([msg("m-1", {})], fail_first_open=True)
    consume(source, lambda _t, _v, wid: committed.append(wid))
    assert source.opened == 2
    assert committed == ["trigger:orders:m-1"]


def test_keys_a_trigger_can_name() -> None:
    m = msg("id-1", {"order": {"id": 42, "ref": "r-9"}, "list": [1]}, **{"X-Order": "o-7"})
    assert header("X-Order")(m) == "o-7"
    assert header("x-order")(m) == "o-7"
    assert header("X-Missing")(m) is None
    assert field("order.id")(m) == "42"
    assert field("order.ref")(m) == "r-9"
    assert field("order.none")(m) is None
    assert field("list")(m) is None  # not a scalar: no key
    assert body_hash(m) == body_hash(Message(m.body, id="another id"))
    assert body_hash(m) != body_hash(msg("id-1", {}))
    assert text_body(msg("t", b"plain")) == "plain"


def test_the_key_a_trigger_names_makes_the_id() -> None:
    committed: list[str] = []
    source = Memory([msg("id-1", {"order_id": "o-1"}), msg("id-2", {"order_id": "o-1"})])
    trigger = Trigger("orders", source, workflow_def(handle), handle, field("order_id"))
    consume(source, lambda _t, _v, wid: committed.append(wid), trigger)
    assert committed == ["trigger:orders:o-1", "trigger:orders:o-1"]  # one id: one run


def test_on_message_checks_its_arguments_and_names() -> None:
    reg = durable.Registry()
    with pytest.raises(DefinitionError, match="not a message source"):
        on_message("amqp://", registry=reg)  # type: ignore[arg-type]
    source = Memory([])
    on_message(source, name="one", registry=reg)(handle)
    assert [t.name for t in reg.triggers()] == ["one"]
    with pytest.raises(DuplicateNameError):
        on_message(source, name="one", registry=reg)(handle)
    with pytest.raises(DefinitionError, match="not a workflow"):
        on_message(source, registry=reg)(lambda payload: payload)
    with pytest.raises(DefinitionError, match="exactly one required parameter"):
        on_message(source, name="two", registry=reg)(two_arguments)


@durable.workflow(registry=registry, name="triggers.two")
def two_arguments(a: int, b: int) -> int:
    return a + b
