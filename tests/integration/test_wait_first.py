"""durable.wait_first over messages, approvals, timers and children, both drivers.

The first condition ready wins and the win is journaled: after a sleep the body runs again
from the top and gets the same winner and value, though another condition became ready
meanwhile. The losers are left as the docs say: a message on a losing topic stays for a
later recv, a losing approval gate stays open (a later approval of that name gets its
decision), a losing child keeps running. While nothing is ready the workflow is parked."""

from __future__ import annotations

import json
import time
from typing import Any

import psycopg
import pytest

import durable
from durable import errors

WINS: list[Any] = []


def build(asynchronous: bool) -> tuple[durable.Registry, Any, Any]:
    reg = durable.Registry()
    if asynchronous:

        @durable.workflow(registry=reg, name="first.slow")
        async def slow(x: int) -> int:
            await durable.recv_async("finish", timeout=120)
            return x

        @durable.workflow(registry=reg, name="first.agent")
        async def agent(seconds: float) -> dict[str, Any]:
            kid = await durable.start_child_async(slow, 7, workflow_id="slow-kid")
            index, value = await durable.wait_first_async(
                [
                    durable.on_message("chat"),
                    durable.on_approval("refund", payload={"cents": 500}),
                    durable.on_timer(seconds),
                    kid,
                ]
            )
            WINS.append(index)
            await durable.sleep_async(1.5)  # suspends: the body runs again from the top
            later = await durable.recv_async("other", timeout=0)
            return {"index": index, "value": _plain(value), "later": later}

        return reg, agent, slow

    @durable.workflow(registry=reg, name="first.slow")
    def slow(x: int) -> int:
        durable.recv("finish", timeout=120)
        return x

    @durable.workflow(registry=reg, name="first.agent")
    def agent(seconds: float) -> dict[str, Any]:
        kid = durable.start_child(slow, 7, workflow_id="slow-kid")
        index, value = durable.wait_first(
            [
                durable.on_message("chat"),
                durable.on_approval("refund", payload={"cents": 500}),
                durable.on_timer(seconds),
                kid,
            ]
        )
        WINS.append(index)
        durable.sleep(1.5)
        later = durable.recv("other", timeout=0)
        return {"index": index, "value": _plain(value), "later": later}

    return reg, agent, slow


def _plain(value: Any) -> Any:
    return value.approved if isinstance(value, durable.Decision) else value


def status(url: str, workflow_id: str) -> str:
    with psycopg.connect(url) as conn:
        row = conn.execute(
            "SELECT status FROM durable.workflows WHERE workflow_id = %s", [workflow_id]
        ).fetchone()
    return "" if row is None else str(row[0])


def wait_until(predicate: Any, what: str) -> None:
    deadline = time.monotonic() + 30
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def unconsumed(url: str, workflow_id: str) -> list[str]:
    with psycopg.connect(url) as conn:
        rows = conn.execute(
            "SELECT topic FROM durable.messages WHERE workflow_id = %s AND consumed_at IS NULL"
            " ORDER BY created_at",
            [workflow_id],
        ).fetchall()
    return [r[0] for r in rows]


ASYNC = pytest.mark.parametrize("asynchronous", [False, True], ids=["sync", "async"])


def start(engine: durable.Engine, agent: Any, seconds: float, url: str) -> durable.WorkflowHandle:
    WINS.clear()
    handle = engine.submit(agent, seconds, workflow_id="agent")
    wait_until(lambda: status(url, "agent") == "SUSPENDED", "the agent to park")
    return handle


@ASYNC
def test_a_message_wins_and_the_replay_keeps_it(database_url: str, asynchronous: bool) -> None:
    reg, agent, _ = build(asynchronous)
    with durable.Engine(database_url, registry=reg, worker=True, poll_interval=0.05) as engine:
        handle = start(engine, agent, 3600, database_url)
        engine.send("agent", "later please", topic="other")  # no condition: it waits too
        engine.send("agent", "hi", topic="chat")
        wait_until(lambda: len(WINS) >= 1, "the first win")
        # While the agent sleeps, the approval is decided: the replay still says "chat".
        engine.decide("agent", "refund", True, decided_by="ops")
        got = handle.result(timeout=30)
        assert got == {"index": 0, "value": "hi", "later": "later please"}
        assert set(WINS) == {0} and len(WINS) >= 2  # the same winner on every run
        names = [s.step_name for s in engine.steps("agent")]
        assert "wait-first#0 message:chat" in names
        assert status(database_url, "slow-kid") == "SUSPENDED"  # the losing child runs on
        engine.cancel("slow-kid")


@ASYNC
def test_an_approval_wins_and_a_message_stays(database_url: str, asynchronous: bool) -> None:
    reg, agent, _ = build(asynchronous)
    with durable.Engine(database_url, registry=reg, worker=True, poll_interval=0.05) as engine:
        handle = start(engine, agent, 3600, database_url)
        [gate] = engine.list_approvals("agent")
        assert json.loads(gate["payload"]) == {"cents": 500}
        engine.decide("agent", "refund", False, decided_by="ops")
        wait_until(lambda: len(WINS) >= 1, "the first win")
        engine.send("agent", "too late", topic="chat")  # during the sleep
        assert handle.result(timeout=30)["index"] == 1
        assert handle.result(timeout=30)["value"] is False
        assert unconsumed(database_url, "agent") == ["chat"]  # left for a later recv
        engine.cancel("slow-kid")


@ASYNC
def test_a_timer_wins(database_url: str, asynchronous: bool) -> None:
    reg, agent, _ = build(asynchronous)
    with durable.Engine(database_url, registry=reg, worker=True, poll_interval=0.05) as engine:
        handle = start(engine, agent, 1.0, database_url)
        assert handle.result(timeout=30)["index"] == 2
        # The losing approval stays open; the losing child keeps running.
        gates = engine.list_approvals("agent", waiting_only=True)
        assert [g["name"] for g in gates] == ["refund"]
        assert status(database_url, "slow-kid") == "SUSPENDED"
        engine.send("slow-kid", "now", topic="finish")
        assert engine.retrieve("slow-kid").result(timeout=30) == 7


@ASYNC
def test_a_child_wins(database_url: str, asynchronous: bool) -> None:
    reg, agent, _ = build(asynchronous)
    with durable.Engine(database_url, registry=reg, worker=True, poll_interval=0.05) as engine:
        handle = start(engine, agent, 3600, database_url)
        engine.send("slow-kid", "now", topic="finish")  # the child ends: it wakes the agent
        got = handle.result(timeout=30)
        assert got["index"] == 3 and got["value"] == 7


def test_wait_first_only_in_workflow_code_and_with_conditions(database_url: str) -> None:
    with pytest.raises(errors.NoEngineError, match="must be called from a workflow"):
        durable.wait_first([durable.on_timer(1)])
    with pytest.raises(errors.InvalidWaitError):
        durable.wait_first([])
    with pytest.raises(errors.InvalidWaitError):
        durable.wait_first(["chat"])  # type: ignore[list-item]
    with pytest.raises(errors.InvalidWaitError):
        durable.on_timer(-1)
    with pytest.raises(errors.InvalidNameError):
        durable.on_approval("")
