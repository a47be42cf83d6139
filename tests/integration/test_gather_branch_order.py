"""A branch of asyncio.gather with several durable calls: refused on the first run when
its positions came from timing (a sibling's call between two of its own), before the
later call runs, with an error that names the rule; accepted where a replay would give
it the same positions (its calls one after the other), and replayed after a wait."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

import durable
from durable import errors


def app(ran: list[str]) -> tuple[durable.Registry, Any, Any]:
    reg = durable.Registry()

    @durable.step(registry=reg, name="gbo.fetch")
    async def fetch(what: str) -> str:
        ran.append(what)
        await asyncio.sleep(0.01)
        return what

    async def patched_branch() -> str:
        if await durable.patched_async("parallel-fetch"):
            return await fetch("new")
        return await fetch("old")

    @durable.workflow(registry=reg, name="gbo.racing")
    async def racing() -> list[str]:
        # The first branch's fetch would come after the second branch's call: on a replay
        # the first branch would take both of the first two positions.
        found = await asyncio.gather(patched_branch(), fetch("other"))
        await durable.recv_async("go", timeout=600)  # parks: the rest is a replay
        return list(found)

    async def serial(i: int) -> str:
        return await fetch(f"a-{i}") + await fetch(f"b-{i}")

    @durable.workflow(registry=reg, name="gbo.alone")
    async def alone() -> list[str]:
        # A branch with two calls after a sibling's one call, and alone: its positions
        # are its own (the sibling's came first), as a replay gives them.
        first = await asyncio.gather(fetch("one"), serial(1))
        second = await asyncio.gather(serial(2))
        await durable.recv_async("go", timeout=600)
        return [*first, *second]

    return reg, racing, alone


def wait_status(engine: durable.Engine, workflow_id: str, status: str) -> None:
    deadline = time.monotonic() + 30
    while engine.get_workflow(workflow_id).status.value != status:
        assert time.monotonic() < deadline, engine.get_workflow(workflow_id)
        time.sleep(0.05)


def test_a_branch_whose_positions_came_from_timing_is_refused_on_the_first_run(
    database_url: str,
) -> None:
    ran: list[str] = []
    reg, racing, _ = app(ran)
    with durable.Engine(database_url, registry=reg, worker=True, poll_interval=0.05) as engine:
        handle = engine.start(racing, workflow_id="racing")
        deadline = time.monotonic() + 30
        while not engine.get_workflow("racing").status.is_terminal:
            if engine.get_workflow("racing").status.value == "SUSPENDED":
                engine.send("racing", "now", topic="go")  # a replay would meet the mix-up
                break
            assert time.monotonic() < deadline
            time.sleep(0.05)
        with pytest.raises(errors.WorkflowFailedError) as info:
            handle.result(timeout=30)
    assert info.value.error_type == "durable.errors.BranchOrderError"
    assert "one durable call per gather branch" in str(info.value)
    assert ran == ["other"]  # refused before the first branch's fetch ran


def test_a_branch_with_its_calls_one_after_another_replays(database_url: str) -> None:
    ran: list[str] = []
    reg, _, alone = app(ran)
    with durable.Engine(database_url, registry=reg, worker=True, poll_interval=0.05) as engine:
        handle = engine.start(alone, workflow_id="alone")
        wait_status(engine, "alone", "SUSPENDED")
        engine.send("alone", "now", topic="go")
        assert handle.result(timeout=30) == ["one", "a-1b-1", "a-2b-2"]
    assert sorted(ran) == ["a-1", "a-2", "b-1", "b-2", "one"]  # each once


def test_no_branch_charges_again_once_the_run_diverged(database_url: str) -> None:
    # Each branch charges a card, then waits for a message. The first run either refuses
    # the branch whose wait came after a sibling's charge, or (when a sibling parked the
    # run first) suspends; the replay after the messages then meets a mismatch. Either
    # way the run ends ERROR and no card is charged twice: once diverged, no branch makes
    # a new call (the sibling would charge again at its shifted position).
    charged: list[tuple[str, str]] = []
    reg = durable.Registry()

    @durable.effect(registry=reg, name="gbo.charge", idempotent=True)
    async def charge(card: str, *, idempotency_key: str) -> str:
        charged.append((card, idempotency_key))
        await asyncio.sleep(0.02)
        return card

    async def branch(card: str) -> Any:
        await charge(card)
        return await durable.recv_async(f"ok-{card}")

    @durable.workflow(registry=reg, name="gbo.cards")
    async def cards() -> list[Any]:
        return list(await asyncio.gather(branch("A"), branch("B")))

    with durable.Engine(database_url, registry=reg, worker=True, poll_interval=0.05) as engine:
        handle = engine.start(cards, workflow_id="cards")
        deadline = time.monotonic() + 30
        while engine.get_workflow("cards").status.value not in ("SUSPENDED", "ERROR"):
            assert time.monotonic() < deadline
            time.sleep(0.05)
        engine.send("cards", "yes", topic="ok-A")
        engine.send("cards", "yes", topic="ok-B")
        with pytest.raises(errors.WorkflowFailedError) as info:
            handle.result(timeout=30)
    assert "Nondeterminism" in info.value.error_type or "BranchOrder" in info.value.error_type
    assert sorted(card for card, _ in charged) == ["A", "B"]  # each card once
