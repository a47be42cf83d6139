"""durable.send and durable.get_event from workflow code, both drivers: a workflow that
sends and then sleeps re-runs its body after the sleep, and its send is not made again;
an event read before a sleep is the one the run journaled, whatever the other workflow
published since; outside a workflow's body the calls are the engine's."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

import durable
from durable import errors


def build(asynchronous: bool) -> tuple[durable.Registry, Any, Any, Any]:
    reg = durable.Registry()
    if asynchronous:

        @durable.workflow(registry=reg, name="mail.notify")
        async def notify(to: str) -> str:
            await durable.send_async(to, "hello", topic="greetings")
            await durable.sleep_async(1.5)  # suspends: the body runs again from the top
            return "sent"

        @durable.workflow(registry=reg, name="mail.inbox")
        async def inbox() -> list[Any]:
            got = [await durable.recv_async("greetings", timeout=30)]
            got.append(await durable.recv_async("greetings", timeout=2))
            return got

        @durable.workflow(registry=reg, name="mail.reader")
        async def reader(other: str) -> Any:
            seen = await durable.get_event_async(other, "phase", timeout=10)
            await durable.sleep_async(1.5)
            return seen

        return reg, notify, inbox, reader

    @durable.workflow(registry=reg, name="mail.notify")
    def notify(to: str) -> str:
        durable.send(to, "hello", topic="greetings")
        durable.sleep(1.5)
        return "sent"

    @durable.workflow(registry=reg, name="mail.inbox")
    def inbox() -> list[Any]:
        return [durable.recv("greetings", timeout=30), durable.recv("greetings", timeout=2)]

    @durable.workflow(registry=reg, name="mail.reader")
    def reader(other: str) -> Any:
        seen = durable.get_event(other, "phase", timeout=10)
        durable.sleep(1.5)
        return seen

    return reg, notify, inbox, reader


@pytest.mark.parametrize("asynchronous", [False, True], ids=["sync", "async"])
def test_a_send_before_a_sleep_is_delivered_once(database_url: str, asynchronous: bool) -> None:
    reg, notify, inbox, _ = build(asynchronous)
    with durable.Engine(database_url, registry=reg, worker=True, poll_interval=0.05) as engine:
        box = engine.submit(inbox, workflow_id="inbox")
        sender = engine.submit(notify, "inbox", workflow_id="notify")
        assert sender.result(timeout=30) == "sent"
        assert box.result(timeout=30) == ["hello", None]  # the second recv timed out
        kinds = [(s.step_name, s.kind) for s in engine.steps("notify")]
        assert kinds[0] == ("send:greetings", durable.StepKind.SEND)


@pytest.mark.parametrize("asynchronous", [False, True], ids=["sync", "async"])
def test_an_event_read_before_a_sleep_replays_as_read(
    database_url: str, asynchronous: bool
) -> None:
    reg, _, _, reader = build(asynchronous)

    @durable.workflow(registry=reg, name="mail.publisher")
    def publisher() -> None:
        durable.set_event("phase", "first")
        durable.recv("next", timeout=30)
        durable.set_event("phase", "second")

    with durable.Engine(database_url, registry=reg, worker=True, poll_interval=0.05) as engine:
        engine.submit(publisher, workflow_id="pub")
        handle = engine.submit(reader, "pub", workflow_id="reader")
        deadline = time.monotonic() + 30
        while not [s for s in engine.steps("reader") if s.step_name == "get-event:phase"]:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        engine.send("pub", "go", topic="next")  # the event changes while the reader sleeps
        while engine.get_event("pub", "phase") != "second":
            assert time.monotonic() < deadline
            time.sleep(0.05)
        assert handle.result(timeout=30) == "first"


def test_outside_a_workflow_they_are_the_engines_calls(database_url: str) -> None:
    reg, _, inbox, _ = build(False)
    with pytest.raises(errors.NoEngineError, match="no active engine"):
        durable.send("x", "m")
    with pytest.raises(errors.InvalidNameError):
        durable.send("", "m")
    with durable.Engine(database_url, registry=reg, worker=True, poll_interval=0.05) as engine:
        box = engine.submit(inbox, workflow_id="inbox")
        durable.send("inbox", "one", topic="greetings")
        durable.send("inbox", "two", topic="greetings")
        assert box.result(timeout=30) == ["one", "two"]
        assert durable.get_event("inbox", "nothing", timeout=0) is None
        with pytest.raises(errors.WorkflowNotFoundError):
            durable.send("nobody", "m")

    async def main() -> None:
        async with durable.Engine(database_url, registry=reg) as engine:
            await durable.send_async("inbox", "late", topic="greetings")
            assert await durable.get_event_async("inbox", "nothing") is None
            assert engine.running

    asyncio.run(main())


def test_a_send_to_no_workflow_fails_the_same_way_on_replay(database_url: str) -> None:
    reg = durable.Registry()
    tries: list[str] = []

    @durable.workflow(registry=reg, name="mail.lost")
    def lost() -> str:
        try:
            durable.send("nobody", "m")
        except errors.WorkflowNotFoundError:
            tries.append("caught")
        durable.sleep(1.2)
        return "done"

    with durable.Engine(database_url, registry=reg, worker=True, poll_interval=0.05) as engine:
        assert engine.start(lost, workflow_id="lost").result(timeout=30) == "done"
    assert tries == ["caught", "caught"]  # first run and the replay after the sleep


def test_a_sender_that_failed_for_want_of_its_receiver_is_resumed_once_it_exists(
    database_url: str,
) -> None:
    reg = durable.Registry()

    @durable.workflow(registry=reg, name="mail.eager")
    def eager() -> str:
        durable.send("late-inbox", "hi")
        return "sent"

    @durable.workflow(registry=reg, name="mail.late")
    def late() -> Any:
        return durable.recv(timeout=30)

    with durable.Engine(database_url, registry=reg, worker=True, poll_interval=0.05) as engine:
        with pytest.raises(errors.WorkflowFailedError, match="WorkflowNotFoundError"):
            engine.start(eager, workflow_id="eager").result(timeout=30)
        inbox = engine.start(late, workflow_id="late-inbox")
        engine.resume("eager")  # the failed send runs again, as a failed step would
        assert engine.retrieve("eager").result(timeout=30) == "sent"
        assert inbox.result(timeout=30) == "hi"
