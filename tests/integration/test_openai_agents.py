"""durable.integrations.openai_agents in one process, against the local ModelStub: a
resumed agent replays its model responses and tool results, parallel tool calls take
their journal positions in the model's order, the budget's cap stops an agent at the gate,
and what cannot be journaled is refused inside a workflow and left alone outside one."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest
from agents import (
    Agent,
    Model,
    ModelProvider,
    OpenAIResponsesModel,
    RunConfig,
    RunState,
    SQLiteSession,
    function_tool,
    handoff,
    set_tracing_disabled,
)
from agents.testing import ScriptedModel, assistant_message, function_call
from openai import AsyncOpenAI

import durable
from durable import errors
from durable.integrations.openai_agents import DurableRunner
from durable.llm import Price
from tests.apps import oa_app
from tests.apps.model_stub import ModelStub

set_tracing_disabled(True)


@pytest.fixture
def stub() -> Iterator[ModelStub]:
    server = ModelStub(reply=oa_app.script).start()
    yield server
    server.stop()


def make(stub: ModelStub, calls: dict[str, int]) -> Agent[Any]:
    @function_tool
    def lookup(topic: str) -> str:
        """Look a topic up."""
        calls["tool"] += 1
        return f"facts about {topic}"

    client = AsyncOpenAI(base_url=stub.url, api_key="stub", max_retries=0)
    return Agent(name="researcher", model=OpenAIResponsesModel("priced", client), tools=[lookup])


def test_a_resumed_agent_replays_and_the_cap_stops_it(database_url: str, stub: ModelStub) -> None:
    reg = durable.Registry()
    calls = {"tool": 0}
    agent = make(stub, calls)
    runner = DurableRunner(prices={"priced": Price(100.0, 200.0)})
    fail = {"once": True}

    @durable.step(registry=reg)
    async def after() -> None:
        if fail["once"]:
            raise RuntimeError("after the agent")

    @durable.workflow(registry=reg, budget=durable.Budget(dollars=5.0))
    async def run_agent() -> str:
        output = (await runner.run(agent, "why tides?")).final_output
        await after()
        return str(output)

    # The first response uses 464 tokens, the second (a longer prompt) far more.
    @durable.workflow(registry=reg, budget=durable.Budget(tokens=1000))
    async def capped() -> str:
        return str((await runner.run(agent, "why tides?")).final_output)

    async def main() -> None:
        async with durable.Engine(database_url, registry=reg) as engine:
            h = await engine.start_async(run_agent, workflow_id="a")
            with pytest.raises(errors.WorkflowFailedError):
                await h.result(timeout=20)
            assert (stub.count(), calls["tool"]) == (3, 2)
            fail["once"] = False
            engine.resume("a")
            assert await durable.AsyncWorkflowHandle(engine.client, "a").result(20) == oa_app.ANSWER
            assert (stub.count(), calls["tool"]) == (3, 2)  # replayed: nothing called again
            ledger = engine.budget("a")
            assert ledger is not None and ledger["spent"]["dollars"] > 0

            h = await engine.start_async(capped, workflow_id="capped")
            while await h.status() != durable.WorkflowStatus.SUSPENDED:
                await asyncio.sleep(0.05)
            ledger = engine.budget("capped")
            assert ledger is not None
            # One response (464 tokens) fit; the second would pass 1000: refused, at the gate.
            assert ledger["spent"]["tokens"] == 464
            (gate,) = engine.list_approvals("capped")
            assert gate["name"] == "budget@2:cap0"  # model, tool, model

    asyncio.run(main())


def test_a_reservation_the_budget_cannot_cover_sends_nothing(
    database_url: str, stub: ModelStub
) -> None:
    reg = durable.Registry()
    agent = make(stub, {"tool": 0})
    runner = DurableRunner(reserve=0.05)

    @durable.workflow(registry=reg, budget=durable.Budget(dollars=0.01))
    async def reserved() -> str:
        return str((await runner.run(agent, "why tides?")).final_output)

    async def main() -> None:
        async with durable.Engine(database_url, registry=reg) as engine:
            h = await engine.start_async(reserved, workflow_id="r")
            while await h.status() != durable.WorkflowStatus.SUSPENDED:
                await asyncio.sleep(0.05)
            (gate,) = engine.list_approvals("r")
            assert gate["name"] == "budget@0:cap0"

    asyncio.run(main())
    assert stub.count() == 0  # refused before the request


def test_parallel_tool_calls_run_one_at_a_time_in_the_models_order(database_url: str) -> None:
    def two_at_once(body: dict[str, Any]) -> list[dict[str, Any]]:
        if oa_app.tool_results(body) == 0:
            return [oa_app.call(0, "slow"), oa_app.call(1, "fast")]
        return [oa_app.message("done")]

    stub = ModelStub(reply=two_at_once).start()
    reg = durable.Registry()
    running: list[str] = []
    overlap = {"max": 0}

    @function_tool
    async def lookup(topic: str) -> str:
        """Look a topic up."""
        running.append(topic)
        overlap["max"] = max(overlap["max"], len(running))
        await asyncio.sleep(0.2 if topic == "slow" else 0)
        running.remove(topic)
        return f"facts about {topic}"

    client = AsyncOpenAI(base_url=stub.url, api_key="stub", max_retries=0)
    agent = Agent(name="r", model=OpenAIResponsesModel("m", client), tools=[lookup])

    @durable.workflow(registry=reg)
    async def both() -> str:
        return str((await DurableRunner().run(agent, "go")).final_output)

    async def main() -> None:
        async with durable.Engine(database_url, registry=reg) as engine:
            h = await engine.start_async(both, workflow_id="both")
            assert await h.result(timeout=20) == "done"
            calls = engine.client.tool_calls("both")
        assert [c["result"] for c in calls] == ["facts about slow", "facts about fast"]

    try:
        asyncio.run(main())
    finally:
        stub.stop()
    assert overlap["max"] == 1


def test_handoffs_that_lead_back_and_provider_models_are_durable(database_url: str) -> None:
    reg = durable.Registry()
    calls = {"tool": 0}
    fail = {"once": True}
    triage_model = ScriptedModel([[function_call("transfer_to_expert", {}, call_id="h1")]])
    expert_model = ScriptedModel(
        [[function_call("lookup", {"topic": "tides"}, call_id="c1")], [assistant_message("done")]]
    )

    class Provider(ModelProvider):
        def get_model(self, model_name: str | None) -> Model:
            assert model_name == "triage-model"
            return triage_model

    @function_tool
    def lookup(topic: str) -> str:
        """Look a topic up."""
        calls["tool"] += 1
        return f"facts about {topic}"

    expert = Agent(name="expert", model=expert_model, tools=[lookup])
    triage = Agent(name="triage", model="triage-model", handoffs=[handoff(expert)])
    expert.handoffs = [triage]  # and back: each agent is wrapped once

    @durable.step(registry=reg)
    async def after() -> None:
        if fail["once"]:
            raise RuntimeError("after the agents")

    @durable.workflow(registry=reg)
    async def triaged() -> str:
        config = RunConfig(model_provider=Provider())
        output = (await DurableRunner().run(triage, "go", run_config=config)).final_output
        await after()
        return str(output)

    async def main() -> None:
        async with durable.Engine(database_url, registry=reg) as engine:
            h = await engine.start_async(triaged, workflow_id="t")
            with pytest.raises(errors.WorkflowFailedError):
                await h.result(timeout=20)
            fail["once"] = False
            engine.resume("t")
            assert await durable.AsyncWorkflowHandle(engine.client, "t").result(20) == "done"
            names = [s.step_name for s in engine.steps("t")]
        assert names[:4] == [
            "openai_agents.model",  # the triage agent's, from the provider
            "openai_agents.model",  # the expert's, after the handoff
            "openai_agents.tool.lookup",
            "openai_agents.model",
        ]

    asyncio.run(main())
    # Replayed: neither model was asked again, the tool did not run again.
    assert (len(triage_model.calls), len(expert_model.calls), calls["tool"]) == (1, 2, 1)


def test_a_failed_model_request_is_retried_in_its_step(database_url: str) -> None:
    reg = durable.Registry()
    flaky = ScriptedModel([RuntimeError("the model is down"), [assistant_message("ok")]])
    agent = Agent(name="a", model=flaky)

    @durable.workflow(registry=reg)
    async def ask() -> str:
        return str((await DurableRunner(retries=1).run(agent, "go")).final_output)

    async def main() -> None:
        async with durable.Engine(database_url, registry=reg) as engine:
            h = await engine.start_async(ask, workflow_id="flaky")
            assert await h.result(timeout=30) == "ok"
            (step,) = engine.steps("flaky")
        assert step.step_name == "openai_agents.model"

    asyncio.run(main())
    assert len(flaky.calls) == 2


def test_a_run_resumed_from_its_state_after_an_approval_is_durable(database_url: str) -> None:
    reg = durable.Registry()
    refunds: list[int] = []

    @function_tool(needs_approval=True)
    def refund(cents: int) -> str:
        """Refund an order."""
        refunds.append(cents)
        return f"refunded {cents}"

    def agent() -> Agent[Any]:
        model = ScriptedModel(
            [[function_call("refund", {"cents": 500}, call_id="c1")], [assistant_message("ok")]]
        )
        return Agent(name="support", model=model, tools=[refund])

    in_workflow, outside = agent(), agent()

    @durable.workflow(registry=reg)
    async def approve_inside() -> str:
        result = await DurableRunner().run(in_workflow, "refund me")
        state = result.to_state()
        for item in result.interruptions:
            state.approve(item)  # an operator's durable.approval_async(...) in an application
        return str((await DurableRunner().run(in_workflow, state)).final_output)

    @durable.workflow(registry=reg)
    async def approve_from_string(saved: str) -> str:
        state = await RunState.from_string(outside, saved)
        for item in state.get_interruptions():
            state.approve(item)
        try:
            await DurableRunner().run(outside, state)
        except errors.UsageError as exc:
            return type(exc).__name__
        return "ran"

    async def main() -> None:
        paused = await DurableRunner().run(outside, "refund me")  # outside any workflow
        saved = paused.to_state().to_string()
        async with durable.Engine(database_url, registry=reg) as engine:
            h = await engine.start_async(approve_inside, workflow_id="inside")
            assert await h.result(timeout=20) == "ok"
            steps = [s.step_name for s in engine.steps("inside")]
            assert steps == [
                "openai_agents.model",
                "openai_agents.tool.refund",  # approved, then journaled like any call
                "openai_agents.model",
            ]
            h = await engine.start_async(approve_from_string, saved, workflow_id="from-string")
            assert await h.result(timeout=20) == "UsageError"  # its agents are not durable

    asyncio.run(main())
    assert refunds == [500]


def test_what_cannot_be_journaled_is_refused_in_a_workflow(
    database_url: str, stub: ModelStub, tmp_path: Any
) -> None:
    reg = durable.Registry()
    agent = make(stub, {"tool": 0})
    runner = DurableRunner()
    refused: list[BaseException] = []

    @durable.workflow(registry=reg)
    async def misuse() -> str:
        for attempt in (
            lambda: runner.run_sync(agent, "go"),
            lambda: runner.run_streamed(agent, "go"),
        ):
            try:
                attempt()
            except errors.UsageError as exc:
                refused.append(exc)
        try:
            await runner.run(agent, "go", session=SQLiteSession("s", str(tmp_path / "s.db")))
        except errors.UsageError as exc:
            refused.append(exc)
        return "ok"

    @durable.workflow(registry=reg)
    def plain() -> str:
        try:
            runner.run_sync(agent, "go")
        except errors.AsyncInSyncError as exc:
            refused.append(exc)
        return "ok"

    async def main() -> None:
        async with durable.Engine(database_url, registry=reg) as engine:
            await (await engine.start_async(misuse)).result(timeout=20)
            await (await engine.start_async(plain)).result(timeout=20)

    asyncio.run(main())
    assert [type(e) for e in refused] == [
        errors.BlockingCallError,
        errors.UsageError,
        errors.UsageError,
        errors.AsyncInSyncError,
    ]
    assert stub.count() == 0
    # Outside a workflow it is the SDK's runner, unchanged (dict run_config and all).
    try:
        result = runner.run_sync(agent, "why tides?", run_config={"workflow_name": "plain"})
    finally:  # run_sync leaves the event loop it made as the thread's default, open
        asyncio.get_event_loop_policy().get_event_loop().close()
        asyncio.set_event_loop(None)
    assert result.final_output == oa_app.ANSWER
