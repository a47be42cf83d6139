"""OpenAI Agents SDK agents that run durably inside a durable workflow.

`DurableRunner` runs an `agents.Agent` the way `agents.Runner` does
(`pip install 'durable-pg[openai-agents]'`):

    runner = DurableRunner(prices={"gpt-4.1": Price(2.00, 8.00)})

    @durable.workflow(budget=durable.Budget(dollars=2.0))
    async def research(question: str) -> str:
        return (await runner.run(agent, question)).final_output

Inside a workflow every model response and every function tool call of the run is a
journaled step: a resumed workflow gets the recorded responses and tool results back in
order, with no second request to the model and no tool run twice. A model response
charges its tokens (and, with `prices=`, its dollars) to the workflow's budget, so the hard
cap stops an agent that would spend past it. Outside a workflow (or inside a step) it is
`agents.Runner`, unchanged.

How: the run's models (the agent's and its handoffs' `Model` objects, `run_config.model`,
and whatever `run_config.model_provider` hands out) are wrapped so `get_response` is a
step named `openai_agents.model` whose output is the `ModelResponse` as JSON (its output
items as the OpenAI types dump them, its usage), rebuilt as the SDK's own types on every
path; each `FunctionTool` is copied with its `on_invoke_tool` made a tool step named
`openai_agents.tool.<name>` that records the call's JSON arguments (listed by
`client.tool_calls(id)`). Function tools run one at a time in a workflow
(`ToolExecutionConfig(max_function_tool_concurrency=1)`): run concurrently, their steps
could take their journal positions in another order on replay.

Not journaled (left out on purpose, and said here): streaming (`run_streamed` in a workflow
is refused: the journal holds whole responses; stream progress with
`durable.write_stream_async`), `run_sync` in a workflow (refused: the SDK runs its own
event loop; use an `async def` workflow and `await runner.run(...)`), a `session=`
(refused: a replay would append the history again; pass `result.to_input_list()` as the
next input), a `RunState` restored from text (refused: it holds the plain agents; a tool
that needs approval is resumed from `result.to_state()` of the run in the same workflow),
MCP servers' tools and guardrails that call models (they run in workflow code, as plain
calls), and what a tool made from an agent (`agent.as_tool`) spends inside its own run
(the whole sub-run is one tool step).
"""

from __future__ import annotations

import copy
import dataclasses
import weakref
from collections.abc import AsyncIterator, Mapping
from typing import Any

from pydantic import BaseModel, TypeAdapter

from durable._base import labels
from durable._base.extras import extra
from durable._base.models import StepKind
from durable._base.registry import StepDef
from durable._run import driver_async as _driver_async
from durable._run.budget import charge
from durable._run.budget import reserve as durable_reserve
from durable._run.context import workflow_code_run
from durable._run.decorators import _retry_policy
from durable.errors import AsyncInSyncError, BlockingCallError, UsageError
from durable.llm import Price, Usage, _validator

with extra("openai-agents"):
    from agents import (
        Agent,
        FunctionTool,
        Handoff,
        Model,
        ModelProvider,
        ModelResponse,
        RunConfig,
        Runner,
        RunResult,
        RunResultStreaming,
        RunState,
    )
    from agents.run_config import ToolExecutionConfig
    from agents.usage import Usage as AgentsUsage

__all__ = ["DurableRunner"]

_build_item = _validator("agents.items.TResponseOutputItem")
# The agents DurableRunner made durable, by id (weakly: they live as long as their runs).
_CLONES: weakref.WeakValueDictionary[int, Agent[Any]] = weakref.WeakValueDictionary()
_usage = TypeAdapter(AgentsUsage)


class DurableRunner:
    """Runs OpenAI Agents SDK agents with each model response and tool call a step.

    prices: dollars per million tokens by model name (durable.llm.Price; longest prefix
        wins), read from the wrapped model's `model` attribute; a model with no price is
        charged in tokens only.
    reserve: dollars set aside (durable.reserve) before each model request: when what the
        budget has left cannot cover it, the request is not sent and the workflow waits at
        the budget gate. Without it, a request is refused only once its cost is known
        (after it was made).
    retries: extra attempts of a failed model request (1 s, doubling up to 30 s), within
        its step. Prefer these to the SDK's own model retries in a workflow: a request that
        still fails is journaled, and replays as StepError, which the SDK's retry policies
        do not know. Tools are not retried (the SDK turns a tool's error into a message for
        the model by default).
    """

    def __init__(
        self,
        *,
        prices: Mapping[str, Price | None] | None = None,
        reserve: float | None = None,
        retries: int = 0,
    ) -> None:
        self._prices = dict(prices or {})
        self._reserve = reserve
        self._retry = _retry_policy(retries, 1.0, 2.0, 30.0, 0.1, Exception)

    async def run(self, starting_agent: Agent[Any], input: Any, **kwargs: Any) -> RunResult:
        """`agents.Runner.run`, durable inside a workflow (same arguments)."""
        if workflow_code_run() is None:
            return await Runner.run(starting_agent, input, **kwargs)
        if kwargs.get("session") is not None:
            raise UsageError(
                "DurableRunner.run(session=...): a session's history is not journaled, so a "
                "resumed workflow would append it again; leave the session out and pass the "
                "history as input (result.to_input_list() of the previous run)"
            )
        if isinstance(input, RunState) and _CLONES.get(id(input._current_agent)) is None:
            # A run resumed from its state goes on with the state's agent, not the starting
            # one, and the state's pending items point at that very agent.
            raise UsageError(
                "DurableRunner.run(RunState): the state's agent is not durable (a state "
                "restored with RunState.from_string/from_json holds the plain agents); "
                "resume from `result.to_state()` of a DurableRunner run in this workflow, "
                "which waits for the approval with durable.approval_async"
            )
        wrap = _Wrapping(self)
        kwargs["run_config"] = wrap.run_config(kwargs.get("run_config"))
        return await Runner.run(wrap.agent(starting_agent), input, **kwargs)

    def run_sync(self, starting_agent: Agent[Any], input: Any, **kwargs: Any) -> RunResult:
        """`agents.Runner.run_sync` outside a workflow; refused inside one, where the SDK's
        own event loop would have to wait for the journal."""
        run = workflow_code_run()
        if run is None:
            return Runner.run_sync(starting_agent, input, **kwargs)
        if run.is_async:
            raise BlockingCallError(
                f"DurableRunner.run_sync would block the event loop of async workflow "
                f"{run.name!r}: write `await runner.run(agent, input)`"
            )
        raise AsyncInSyncError(
            f"DurableRunner.run_sync runs the OpenAI Agents SDK's event loop, which plain-def "
            f"workflow {run.name!r} cannot journal from: make the workflow `async def` and "
            "write `await runner.run(agent, input)`"
        )

    def run_streamed(
        self, starting_agent: Agent[Any], input: Any, **kwargs: Any
    ) -> RunResultStreaming:
        """`agents.Runner.run_streamed` outside a workflow; refused inside one."""
        if workflow_code_run() is None:
            return Runner.run_streamed(starting_agent, input, **kwargs)
        raise UsageError(
            "DurableRunner.run_streamed: a workflow journals whole model responses, not "
            "streams: use `await runner.run(agent, input)`, and durable.write_stream_async "
            "for progress readers can follow"
        )

    def _price(self, model: str) -> Price | None:
        for name in sorted(self._prices, key=len, reverse=True):
            if model == name or model.startswith(name):
                return self._prices[name]
        return None


class _Wrapping:
    """One run's wrapped agents, models and tools (each agent wrapped once, so handoffs
    that lead back to an agent end)."""

    def __init__(self, runner: DurableRunner) -> None:
        self.runner = runner
        self.agents: dict[int, Agent[Any]] = {}

    def run_config(self, given: RunConfig | dict[str, Any] | None) -> RunConfig:
        config = RunConfig(**given) if isinstance(given, dict) else (given or RunConfig())
        tools = config.tool_execution or ToolExecutionConfig()
        return dataclasses.replace(
            config,
            model=self.model(config.model) if isinstance(config.model, Model) else config.model,
            model_provider=_Provider(config.model_provider, self),
            tool_execution=dataclasses.replace(tools, max_function_tool_concurrency=1),
        )

    def model(self, model: Model) -> Model:
        return model if isinstance(model, _DurableModel) else _DurableModel(model, self.runner)

    def agent(self, agent: Agent[Any]) -> Agent[Any]:
        done = self.agents.get(id(agent))
        if done is not None:
            return done
        if _CLONES.get(id(agent)) is agent:
            return agent  # made durable already (the agent of an earlier run's state)
        clone = agent.clone()
        _CLONES[id(clone)] = clone
        self.agents[id(agent)] = clone  # before the handoffs: they may lead back here
        if isinstance(agent.model, Model):
            clone.model = self.model(agent.model)
        clone.tools = [self.tool(t) if isinstance(t, FunctionTool) else t for t in agent.tools]
        clone.handoffs = [
            self.agent(h) if isinstance(h, Agent) else self.handoff(h) for h in agent.handoffs
        ]
        return clone

    def handoff(self, handoff: Handoff[Any, Any]) -> Handoff[Any, Any]:
        invoke = handoff.on_invoke_handoff

        async def on_invoke_handoff(*args: Any, **kwargs: Any) -> Agent[Any]:
            return self.agent(await invoke(*args, **kwargs))

        return dataclasses.replace(handoff, on_invoke_handoff=on_invoke_handoff)

    def tool(self, tool: FunctionTool) -> FunctionTool:
        durable_tool = copy.copy(tool)  # the SDK's copy rebinds the tool's own invoker
        invoke = durable_tool.on_invoke_tool
        name = labels.openai_agents_step(f"tool.{tool.name}")

        async def on_invoke_tool(context: Any, arguments: str) -> Any:
            if workflow_code_run() is None:
                return await invoke(context, arguments)

            async def call(arguments: str) -> Any:
                return _journalable(await invoke(context, arguments))

            defn = StepDef(name, call, StepKind.TOOL)
            return await _driver_async.call_step(defn, (arguments,), {})

        durable_tool.on_invoke_tool = on_invoke_tool
        return durable_tool


class _Provider(ModelProvider):
    """The run's model provider, handing out its models wrapped."""

    def __init__(self, provider: ModelProvider, wrapping: _Wrapping) -> None:
        self._provider = provider
        self._wrapping = wrapping

    def get_model(self, model_name: str | None) -> Model:
        return self._wrapping.model(self._provider.get_model(model_name))

    async def aclose(self) -> None:
        await self._provider.aclose()


class _DurableModel(Model):
    """A model whose responses are journaled steps that charge the budget."""

    def __init__(self, model: Model, runner: DurableRunner) -> None:
        self._model = model
        self._runner = runner
        self._name = getattr(model, "model", None)

    def __getattr__(self, name: str) -> Any:
        # What the SDK asks a model beyond its interface (a copy asks before __init__ ran).
        if name == "_model":
            raise AttributeError(name)
        return getattr(self._model, name)

    async def get_response(self, *args: Any, **kwargs: Any) -> ModelResponse:
        if workflow_code_run() is None:
            return await self._model.get_response(*args, **kwargs)

        async def request() -> dict[str, Any]:
            if self._runner._reserve:
                with durable_reserve(dollars=self._runner._reserve):  # refused: nothing sent
                    response = await self._model.get_response(*args, **kwargs)
            else:
                response = await self._model.get_response(*args, **kwargs)
            self._charge(response.usage)
            return _dump(response)

        name = labels.openai_agents_step("model")
        defn = StepDef(name, request, StepKind.STEP, retry=self._runner._retry)
        return _load(await _driver_async.call_step(defn, (), {}))

    def stream_response(self, *args: Any, **kwargs: Any) -> AsyncIterator[Any]:
        return self._model.stream_response(*args, **kwargs)

    async def close(self) -> None:
        await self._model.close()

    async def _cleanup_on_run_end(self, owner: object) -> None:
        await self._model._cleanup_on_run_end(owner)

    def get_retry_advice(self, request: Any) -> Any:
        return self._model.get_retry_advice(request)

    def _charge(self, usage: AgentsUsage) -> None:
        details = usage.input_tokens_details
        used = Usage(
            int(usage.input_tokens or 0),
            int(usage.output_tokens or 0),
            int(getattr(details, "cached_tokens", 0) or 0),
        )
        price = self._runner._price(self._name) if isinstance(self._name, str) else None
        dollars = 0.0 if price is None else float(price.dollars(used))
        if used.total or dollars:
            charge(dollars=dollars, tokens=used.total)


def _dump(response: ModelResponse) -> dict[str, Any]:
    """A model response as JSON: its output items as the server sent them (by alias,
    without the fields it left out, so they rebuild to what the SDK would send back)."""
    return {
        "output": [
            item.model_dump(mode="json", by_alias=True, exclude_unset=True, warnings=False)
            for item in response.output
        ],
        "usage": _usage.dump_python(response.usage, mode="json"),
        "response_id": response.response_id,
        "request_id": response.request_id,
    }


def _load(data: dict[str, Any]) -> ModelResponse:
    """The ModelResponse a journaled response stands for (on the first run too, so a
    replay sees the very same objects)."""
    return ModelResponse(
        output=[_build_item(item) for item in data["output"]],
        usage=_usage.validate_python(data["usage"]),
        response_id=data.get("response_id"),
        request_id=data.get("request_id"),
    )


def _journalable(value: Any) -> Any:
    """A tool's result as JSON that reads back the same: a pydantic model (the SDK's
    ToolOutputText, say) as its dump, which the SDK reads as it reads the model; a tuple as
    a list. Anything else is journaled as it is (a value JSON cannot hold the same fails
    the call with SerializationError, naming it)."""
    if isinstance(value, BaseModel):
        return value.model_dump(mode="json", by_alias=True, exclude_unset=True)
    if isinstance(value, list | tuple):
        return [_journalable(v) for v in value]
    return value
