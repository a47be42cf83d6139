"""durable.integrations.pydantic_ai in one process: a resumed agent replays its model
responses and tool results, and the budget's hard cap stops an agent at the gate."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

import pytest

import durable
from durable import errors
from durable.llm import Price

if TYPE_CHECKING:
    from pydantic_ai import Agent
    from pydantic_ai.messages import ModelResponse


def make(calls: dict[str, int], rounds: int) -> Agent[None, str]:
    # pydantic-ai is imported here, not with the module: every test process collects the
    # module, and the import costs a second and a half of CPU.
    from pydantic_ai import Agent
    from pydantic_ai.messages import ModelResponse, TextPart, ToolCallPart
    from pydantic_ai.models.function import FunctionModel
    from pydantic_ai.usage import RequestUsage

    from durable.integrations.pydantic_ai import DurableAgent

    def model(messages: list[Any], info: Any) -> ModelResponse:
        calls["model"] += 1
        done = sum(1 for m in messages for p in m.parts if p.part_kind == "tool-return")
        usage = RequestUsage(input_tokens=1000, output_tokens=500)
        if done < rounds:
            return ModelResponse(parts=[ToolCallPart("search", {"n": done})], usage=usage)
        return ModelResponse(parts=[TextPart(f"{done} searches")], usage=usage)

    agent = Agent(
        FunctionModel(model, model_name="priced"),
        name="searcher",
        capabilities=[DurableAgent(name="searcher", prices={"priced": Price(100.0, 200.0)})],
    )

    @agent.tool_plain
    def search(n: int) -> str:
        calls["tool"] += 1
        return f"result {n}"

    return agent


def test_a_resumed_agent_replays_and_the_cap_stops_it(database_url: str) -> None:
    reg = durable.Registry()
    calls = {"model": 0, "tool": 0}
    agent = make(calls, rounds=2)
    fail = {"once": True}

    @durable.step(registry=reg)
    async def after() -> None:
        if fail["once"]:
            raise RuntimeError("after the agent")

    @durable.workflow(registry=reg)
    async def run_agent() -> str:
        output = (await agent.run("go")).output
        await after()
        return output

    # Each model request costs 1000 * $100 + 500 * $200 per million = $0.20.
    @durable.workflow(registry=reg, budget=durable.Budget(dollars=0.5))
    async def capped() -> str:
        return (await agent.run("go")).output

    async def main() -> None:
        async with durable.Engine(database_url, registry=reg) as engine:
            h = await engine.start_async(run_agent, workflow_id="a")
            with pytest.raises(errors.WorkflowFailedError):
                await h.result(timeout=20)
            assert calls == {"model": 3, "tool": 2}
            fail["once"] = False
            engine.resume("a")
            assert await durable.AsyncWorkflowHandle(engine.client, "a").result(20) == "2 searches"
            assert calls == {"model": 3, "tool": 2}  # replayed: nothing called again

            calls.update(model=0, tool=0)
            h = await engine.start_async(capped, workflow_id="capped")
            while await h.status() != durable.WorkflowStatus.SUSPENDED:
                await asyncio.sleep(0.05)
            ledger = engine.budget("capped")
            assert ledger is not None
            # Two requests ($0.40) fit; the third would pass $0.50: refused, at the gate.
            assert ledger["spent"]["dollars"] == pytest.approx(0.4)
            (gate,) = engine.list_approvals("capped")
            assert gate["name"] == "budget@4:cap0"  # model, tool, model, tool, model

    asyncio.run(main())
